"""A real vLLM engine restarted under the same name: its old blocks end with the restart.

The in-process engine (`plugin_engine_proc.py`) runs its workload twice, one process
after the other, under one `KVSCOPE_INSTANCE`: two epochs of one source. vLLM sends no
event when its process ends, so the blocks its first run left cached have no event that
ends them. The truth is what vLLM published on ZMQ in each run, replayed here: the hashes
resident when each run ended. With `PYTHONHASHSEED` fixed, both runs hash the same prompts
to the same blocks, so the second run stores hashes the first one left cached: a
restart must not make them "held elsewhere" (a routing opportunity on a single engine),
and they must not count as still resident.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from kvscope.analytics.queries import run_query
from support.e2e_support import collect
from support.vllm_e2e import ZmqCapture, plugin_env, run_engine

INSTANCE = "pod-r:8000"


def _run_engine(model: Path, workdir: Path, env: dict[str, str]) -> ZmqCapture:
    """One engine process through its workload; what vLLM published on ZMQ."""
    workdir.mkdir()
    return run_engine(model, workdir, env)[0]


def _resident_at_end(capture: ZmqCapture) -> set[int]:
    """The hashes vLLM held when the run ended, replayed from its own events."""
    resident: set[int] = set()
    for kind, block_hash in capture.block_rows():
        if kind == "stored":
            resident.add(block_hash)
        elif kind == "removed":
            resident.discard(block_hash)
        else:
            resident.clear()
    return resident


@pytest.mark.vllm
def test_a_restarted_engine_ends_the_blocks_its_first_run_left(
    tiny_llama: Path,
    tmp_path: Path,
    bootstrap_servers: str,
    topic_prefix: str,
    clickhouse: Any,
    clickhouse_url: str,
) -> None:
    env = {**plugin_env(bootstrap_servers, topic_prefix, INSTANCE), "PYTHONHASHSEED": "0"}
    first = _run_engine(tiny_llama, tmp_path / "first", env)
    second = _run_engine(tiny_llama, tmp_path / "second", env)
    collect(clickhouse, clickhouse_url, bootstrap_servers, topic_prefix)

    left_by_first, left_by_second = _resident_at_end(first), _resident_at_end(second)
    stored_by_second = {h for kind, h in second.block_rows() if kind == "stored"}
    assert left_by_first, "the first run leaves blocks cached"
    assert left_by_first & stored_by_second, "the second run stores hashes the first left"
    epochs = clickhouse.query("SELECT uniqExact(epoch) FROM kv_block_events").result_rows
    assert epochs == [(2,)]

    (row,) = run_query(clickhouse, "residency", {"instance": INSTANCE})
    assert row["ended_by_restart"] == len(left_by_first)
    assert row["still_resident"] == len(left_by_second)
    (routing,) = run_query(clickhouse, "routing_opportunity", {"instance": INSTANCE})
    assert routing["stores"] > 0
    assert routing["opportunity_blocks"] == 0, "one engine is never its own opportunity"
