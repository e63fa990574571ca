"""The fleet simulator: determinism, P/D transfers, resets, routing, config, workloads."""

from __future__ import annotations

import itertools
import subprocess
import sys
import tracemalloc
from typing import Any

import msgspec
import pytest
from kvscope.schemas import (
    BlockStored,
    ConfigError,
    KVEventBatch,
    KVTransfer,
    RequestFinished,
    Source,
)
from kvscope.schemas.limits import MAX_ROWS_PER_RECORD
from kvscope.simulator.fleet import Fleet, SimConfig, parse_instances
from kvscope.simulator.workloads import KNOBS, generate, longest_request

_enc = msgspec.msgpack.Encoder()


def _run(config: SimConfig) -> tuple[dict, list[tuple[str, int, bytes, float]]]:
    published: list[tuple[str, int, bytes, float]] = []

    def sink(source: Source, epoch: int, body: Any, ts: float) -> None:
        published.append((source.key, epoch, _enc.encode(body), ts))

    return Fleet(config, sink).run(), published


def _config(**overrides: Any) -> SimConfig:
    settings: dict[str, Any] = {"requests": 120, "capacity_blocks": 200, "seed": 5}
    settings.update(overrides)
    return SimConfig(**settings)


def test_same_seed_same_output_other_seed_other_output() -> None:
    config = _config(instances=parse_instances("1p,1d,1b"), routing="random")
    truth, bodies = _run(config)
    again, bodies_again = _run(_config(instances=parse_instances("1p,1d,1b"), routing="random"))
    assert truth == again and bodies == bodies_again
    _other, other_bodies = _run(_config(instances=parse_instances("1p,1d,1b"), seed=6))
    assert other_bodies != bodies


def test_disaggregated_fleet_transfers_and_slow_pair() -> None:
    config = _config(instances=parse_instances("2p,2d"), routing="random", requests=300)
    config.slow_pair = "prefill-1->decode-0"
    published: list[tuple[str, Any]] = []
    fleet = Fleet(config, lambda s, e, body, ts: published.append((s.key, body)))
    truth = fleet.run()
    transfers = [b for _, b in published if isinstance(b, KVTransfer)]
    finished = [(k, b) for k, b in published if isinstance(b, RequestFinished)]
    assert len(transfers) == 300
    assert len([k for k, _ in finished if k.startswith("decode")]) == 300
    assert len([k for k, _ in finished if k.startswith("prefill")]) == 300
    assert all(
        t.end_ts > t.start_ts and t.bytes == t.blocks * config.bytes_per_block for t in transfers
    )
    pairs = truth["transfers"]
    assert sum(p["count"] for p in pairs.values()) == 300
    slow = pairs.pop("prefill-1->decode-0")["p50_ms"]
    assert slow > 3 * max(p["p50_ms"] for p in pairs.values())


def test_reset_clears_the_cache_once_idle() -> None:
    truth, bodies = _run(_config(instances=parse_instances("1"), resets=(("engine-0", 2.0),)))
    src = truth["sources"]["engine-0/0"]
    assert src["cleared"] == 1 and src["residency"]["ended_by_clear"] > 0
    batches = [
        msgspec.msgpack.decode(b, type=KVEventBatch) for _, _, b, _ in bodies if b"KVEvents" in b
    ]
    kinds = [type(e).__name__ for batch in batches for e in batch.events]
    assert kinds.count("AllBlocksCleared") == 1


def test_every_kv_event_batch_is_nonempty_and_timestamps_distinct_per_source() -> None:
    _, bodies = _run(_config(instances=parse_instances("3")))
    seen: set[tuple[str, float]] = set()
    for key, _, raw, ts in bodies:
        if b"KVEvents" in raw:
            assert msgspec.msgpack.decode(raw, type=KVEventBatch).events
            assert (key, ts) not in seen
            seen.add((key, ts))
    stamps = {ts for _, _, _, ts in bodies}
    by_source = {key: {ts for k, _, _, ts in bodies if k == key} for key, _, _, _ in bodies}
    assert sum(len(s) for s in by_source.values()) == len(stamps)


def test_prefix_aware_routing_beats_round_robin() -> None:
    rates = {}
    for routing in ("round-robin", "prefix-aware"):
        config = _config(instances=parse_instances("4"), routing=routing, requests=300)
        config.workload_params = {"groups": 8}
        rates[routing] = Fleet(config).run()["fleet"]
    assert rates["prefix-aware"]["hit_rate"] > rates["round-robin"]["hit_rate"] + 0.1
    assert rates["prefix-aware"]["routing_opportunity_share"] < 0.05


def test_bigger_cache_hits_more() -> None:
    small = Fleet(_config(workload="zipf", capacity_blocks=150, requests=400)).run()
    big = Fleet(_config(workload="zipf", capacity_blocks=600, requests=400)).run()
    assert big["fleet"]["hit_rate"] > small["fleet"]["hit_rate"]
    assert sum(s["refaults"] for s in small["sources"].values()) > 0


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("2", [("engine-0", "both"), ("engine-1", "both")]),
        ("1p,1d", [("prefill-0", "prefill"), ("decode-0", "decode")]),
        (
            "prefill=1,decode=1,both=1",
            [("engine-0", "both"), ("prefill-0", "prefill"), ("decode-0", "decode")],
        ),
    ],
)
def test_parse_instances(spec: str, expected: list[tuple[str, str]]) -> None:
    assert [(i.name, i.role) for i in parse_instances(spec)] == expected


@pytest.mark.parametrize(
    "overrides",
    [
        {"instances": parse_instances("2p")},
        {"instances": parse_instances("1d,1b")},
        {"instances": parse_instances("2d")},
        {"workload": "nope"},
        {"routing": "nope"},
        {"capacity_blocks": 0},
        {"resets": (("ghost", 1.0),)},
        {"resets": (("engine-0", -1.0),)},
        {"resets": (("engine-0", float("nan")),)},
        {"rate": 0.0},
        {"rate": float("nan")},
        {"rate": float("inf")},
        {"time_scale": float("nan")},
        {"time_scale": -1.0},
        {"model": "m" * 257},
        {"start_ts": float("nan")},
        {"start_ts": -1.0},
        {"start_ts": 4102444800.0},
        {"slow_pair": "engine-0->engine-1"},
        {"instances": parse_instances("2p,2d"), "slow_pair": "prefill-0->decode-9"},
        {"instances": parse_instances("2p,2d"), "slow_pair": "prefill-0->prefill-1"},
        {"instances": parse_instances("2p,2d"), "slow_pair": "prefill-0"},
        {"workload_params": {"group": 16.0}},
        {"workload_params": {"groups": 0.0}},
        {"workload_params": {"groups": 2.5}},
        {"workload_params": {"system_prompt_len": float("nan")}},
        {"workload": "zipf", "workload_params": {"alpha": float("inf")}},
        {"workload": "multi-turn", "workload_params": {"think_s": -1.0}},
        {"workload": "trace", "trace": "t.jsonl", "workload_params": {"groups": 2.0}},
    ],
)
def test_invalid_config_fails_fast(overrides: dict) -> None:
    with pytest.raises(ConfigError):
        _config(**overrides).validate()
    with pytest.raises(ConfigError):
        parse_instances("3x")


def test_too_small_cache_is_reported_before_anything_is_published() -> None:
    published: list[Any] = []
    fleet = Fleet(_config(capacity_blocks=8), lambda *body: published.append(body))
    with pytest.raises(ConfigError, match="raise --capacity-blocks to at least 38"):
        fleet.run()
    assert published == []


def test_workloads_are_deterministic_and_shaped() -> None:
    gsp = generate("generated-shared-prefix", 40, 1, 10.0, {"groups": 4, "system_prompt_len": 64})
    assert gsp == generate(
        "generated-shared-prefix", 40, 1, 10.0, {"groups": 4, "system_prompt_len": 64}
    )
    assert len({tuple(r.prompt[:64]) for r in gsp}) == 4
    chat = generate("multi-turn", 8, 1, 10.0, {"turns": 4})
    first, second = (r for r in chat if r.request_id in ("chat-0-0", "chat-0-1"))
    assert second.prompt[: len(first.prompt) + len(first.output)] == first.prompt + first.output
    zipf = generate("zipf", 500, 1, 10.0, {"documents": 50, "doc_len": 32})
    counts = sorted(
        (sum(1 for r in zipf if r.prompt[:32] == d.prompt[:32]) for d in zipf), reverse=True
    )
    assert counts[0] > 5 * counts[-1]
    assert all(a.arrival_s <= b.arrival_s for a, b in itertools.pairwise(zipf))


def test_publisher_import_stays_light() -> None:
    code = (
        "import sys, kvscope.simulator.fleet\n"
        "heavy = ('clickhouse_connect', 'chdb', 'pandas', 'matplotlib', 'pyarrow')\n"
        "bad = [m for m in heavy if m in sys.modules]\n"
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_requests_after_2100_are_refused_before_anything_is_published() -> None:
    """The collector stores no time from 2100 on: a run reaching it is refused up front."""
    published: list[Any] = []
    config = _config(start_ts=4102444800.0 - 10.0, rate=1.0)
    with pytest.raises(ConfigError, match="after 2100-01-01"):
        Fleet(config, lambda *body: published.append(body)).run()
    assert published == []


def test_kv_events_beyond_the_collectors_rows_per_record_are_cut_into_records() -> None:
    """Four 60,000-token prompts admitted in one step of a 1-token-block engine store
    240,000 blocks at once: several records of at most MAX_ROWS_PER_RECORD rows, in order."""
    batches: list[KVEventBatch] = []

    def sink(source: Source, epoch: int, body: Any, ts: float) -> None:
        if isinstance(body, KVEventBatch):
            batches.append(body)

    config = _config(
        instances=parse_instances("1"),
        requests=4,
        rate=1000.0,
        block_size=1,
        capacity_blocks=250_000,
        workload_params={"groups": 4, "system_prompt_len": 60_000},
    )
    truth = Fleet(config, sink).run()
    rows = [sum(len(e.block_hashes) or 1 for e in b.events) for b in batches]
    assert max(rows) <= MAX_ROWS_PER_RECORD
    same_step = [
        (a, b) for a, b in itertools.pairwise(zip(batches, rows, strict=True)) if a[0].ts == b[0].ts
    ]
    assert same_step and max(a[1] + b[1] for a, b in same_step) > MAX_ROWS_PER_RECORD
    stored = sum(
        len(e.block_hashes) for b in batches for e in b.events if isinstance(e, BlockStored)
    )
    assert stored == truth["fleet"]["stored_blocks"]


def test_request_with_more_blocks_than_a_record_takes_is_refused() -> None:
    config = _config(
        instances=parse_instances("1"),
        block_size=1,
        capacity_blocks=250_000,
        workload_params={"system_prompt_len": 110_000},
    )
    with pytest.raises(ConfigError, match="block hashes the collector takes per record"):
        Fleet(config).run()


@pytest.mark.parametrize(
    ("workload", "params"),
    [
        ("generated-shared-prefix", {"system_prompt_len": 10.0**12}),
        ("zipf", {"doc_len": 10.0**12}),
        ("multi-turn", {"turns": 10.0**6}),
    ],
)
def test_requests_larger_than_a_cache_are_refused_before_tokens_are_drawn(
    workload: str, params: dict
) -> None:
    """Knobs making requests of 10^12 tokens would take that many draws (a hang, then out of
    memory) before the capacity check; refused from the knobs alone."""
    config = _config(workload=workload, workload_params=params, requests=10**6)
    with pytest.raises(
        ConfigError, match=r"can have [\d,]+ tokens .* more than --capacity-blocks 200: "
    ):
        Fleet(config).run()


@pytest.mark.parametrize("workload", ["generated-shared-prefix", "multi-turn", "zipf"])
@pytest.mark.parametrize("requests", [1, 3, 10, 41])
def test_longest_request_bounds_every_generated_request(workload: str, requests: int) -> None:
    params = {"turns": 7.0} if workload == "multi-turn" else {}
    generated = generate(workload, requests, 3, 20.0, params)
    longest = max(len(r.prompt) + len(r.output) for r in generated)
    assert longest <= longest_request(workload, requests, params)


@pytest.mark.parametrize(
    ("workload", "params"),
    [("generated-shared-prefix", {"groups": 1e12}), ("zipf", {"documents": 1e6})],
)
def test_prefixes_no_request_uses_are_not_drawn(workload: str, params: dict) -> None:
    """Before, every group's system prompt and every document were drawn up front: 10^12
    groups for ten requests never finished, 10^6 documents took ~10^6 x 512 draws."""
    tracemalloc.start()
    try:
        requests = generate(workload, 10, 3, 20.0, params)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(requests) == 10
    assert peak < 200_000_000, peak  # the zipf weights of 10^6 documents: ~40 MB
    if workload == "generated-shared-prefix":  # as many groups as requests: nothing shared
        system = int(KNOBS[workload]["system_prompt_len"].default)
        assert len({tuple(r.prompt[:system]) for r in requests}) == 10


def test_more_documents_than_the_generator_holds_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"documents=1e\+08: give a whole number >= 1 and <= "):
        generate("zipf", 10, 3, 20.0, {"documents": 1e8})
