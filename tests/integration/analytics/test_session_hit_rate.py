"""`session_hit_rate`: per conversation of a simulated multi-turn workload, the hit rate of
its turns equals what the requests stream (RequestFinished, cached tokens) says for them."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import pytest
from kvscope.simulator.fleet import SimConfig, parse_instances
from support.analytics_kit import query, simulate_direct


@pytest.mark.parametrize(
    ("instances", "routing", "capacity"),
    [("1", "round-robin", 400), ("3", "round-robin", 200), ("2p,1d", "prefix-aware", 300)],
)
def test_each_chat_has_its_turns_hit_rate(
    tables: Any, instances: str, routing: str, capacity: int
) -> None:
    config = SimConfig(
        instances=parse_instances(instances),
        workload="multi-turn",
        routing=routing,
        requests=240,
        capacity_blocks=capacity,
        seed=4,
    )
    simulate_direct(tables, config)
    rows = query(tables, "session_hit_rate", since="1970-01-01 00:00:00", limit=10_000)
    finished = tables.query(
        "SELECT request_id, prompt_tokens, cached_tokens FROM requests WHERE role != 'decode'"
    ).result_rows
    chats: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    for request_id, prompt, cached in finished:
        chat = chats[request_id.rsplit("-", 1)[0]]
        chat[0] += 1
        chat[1] += prompt
        chat[2] += cached
    assert {r["session"]: [r["requests"], r["prompt_tokens"], r["hit_tokens"]] for r in rows} == {
        k: v for k, v in chats.items()
    }
    assert len(rows) > 1 and any(r["hit_rate"] > 0 for r in rows)
    requests = [r["requests"] for r in rows]
    assert requests == sorted(requests, reverse=True)
    assert query(tables, "session_hit_rate", since="1970-01-01 00:00:00", limit=2) == rows[:2]
