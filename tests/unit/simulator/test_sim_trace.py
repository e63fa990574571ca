"""Mooncake-format trace replay: generated traces in, simulator requests and runs out."""

from __future__ import annotations

import dataclasses
import gzip
import json
import tracemalloc
from pathlib import Path

import pytest
from kvscope.cachemodel.blockpool import chain_hashes
from kvscope.schemas import ConfigError
from kvscope.simulator.fleet import Fleet, SimConfig, parse_instances
from kvscope.simulator.trace import TRACE_BLOCK, load_trace, trace_records, write_trace
from kvscope.simulator.workloads import generate


def _shared_leading(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


@pytest.mark.parametrize(
    ("workload", "params"),
    [
        ("generated-shared-prefix", {"groups": 3, "system_prompt_len": 1100}),
        ("multi-turn", {"turns": 5, "user_len": 300, "output_len": 200}),
        ("zipf", {"documents": 6, "doc_len": 1536}),
    ],
)
@pytest.mark.parametrize("block_size", [16, 512])
@pytest.mark.parametrize(
    ("trace_block", "timestamp_s"), [(TRACE_BLOCK, 0.001), (16, 1.0), (64, 0.000001)]
)
def test_trace_keeps_prefix_sharing(
    tmp_path: Path,
    workload: str,
    params: dict,
    block_size: int,
    trace_block: int,
    timestamp_s: float,
) -> None:
    """Requests sharing k leading trace ids share exactly the engine blocks those ids
    cover, whatever the trace's block (Mooncake's 512 tokens, Qwen's 16) and time unit."""
    original = generate(workload, 40, 5, 4.0, params)
    path = tmp_path / "trace.jsonl"
    write_trace(path, original, trace_block, timestamp_s)
    records = [json.loads(line) for line in path.read_text().splitlines()]
    replayed = load_trace(
        path, 1000, seed=1, time_scale=0.5, block_tokens=trace_block, timestamp_s=timestamp_s
    )
    assert len(replayed) == len(original)
    by_time = sorted(zip(records, original, strict=True), key=lambda p: p[1].arrival_s)
    shared_seen = 0
    for (rec, req), got in zip(by_time, replayed, strict=True):
        assert len(got.prompt) == rec["input_length"] == len(req.prompt)
        assert len(got.output) == rec["output_length"]
        start = records[0]["timestamp"]
        assert got.arrival_s == pytest.approx((rec["timestamp"] - start) * timestamp_s / 2)
        since_first = req.arrival_s - by_time[0][1].arrival_s
        assert got.arrival_s == pytest.approx(since_first / 2, abs=timestamp_s)
    hashes = [chain_hashes(r.prompt, block_size) for r in replayed]
    ids = [rec["hash_ids"] for rec, _ in by_time]
    for i in range(len(replayed)):
        for j in range(i):
            common = _shared_leading(ids[i], ids[j])
            got = _shared_leading(hashes[i], hashes[j])
            if common < min(len(ids[i]), len(ids[j])):
                assert got == common * trace_block // block_size, (i, j)
            else:  # one prompt ends inside the shared ids: its last id may be a partial block
                assert got >= (common - 1) * trace_block // block_size, (i, j)
            shared_seen += common > 0
    assert shared_seen > 0


def test_a_qwen_trace_line_replays_in_its_units(tmp_path: Path) -> None:
    """Alibaba's Qwen traces: seconds, 16-token ids and fields of their own (ignored)."""
    path = tmp_path / "qwen.jsonl"
    lines = [
        {"chat_id": 1, "parent_chat_id": -1, "timestamp": 61.5, "input_length": 40,
         "output_length": 3, "type": "text", "turn": 1, "hash_ids": [7, 8, 9]},
        {"chat_id": 2, "parent_chat_id": 1, "timestamp": 63.0, "input_length": 35,
         "output_length": 2, "type": "text", "turn": 2, "hash_ids": [7, 8, 10]},
    ]  # fmt: skip
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    first, second = load_trace(path, 10, seed=0, block_tokens=16, timestamp_s=1.0)
    assert (first.arrival_s, second.arrival_s) == (0.0, 1.5)
    assert first.prompt[:32] == second.prompt[:32] and first.prompt[32] != second.prompt[32]
    assert (len(first.prompt), len(second.prompt)) == (40, 35)


@pytest.mark.parametrize(("block_tokens", "timestamp_s"), [(0, 0.001), (1 << 21, 0.001), (16, 0)])
def test_trace_units_out_of_range_are_refused(
    tmp_path: Path, block_tokens: int, timestamp_s: float
) -> None:
    path = tmp_path / "t.jsonl"
    write_trace(path, generate("generated-shared-prefix", 2, 1, 5.0, {"groups": 1}))
    with pytest.raises(ConfigError, match="trace"):
        load_trace(path, 10, seed=0, block_tokens=block_tokens, timestamp_s=timestamp_s)


def test_multi_turn_growth_is_prefix_of_next_turn(tmp_path: Path) -> None:
    """A chat's next turn re-sends the previous one: its ids extend the previous full ids."""
    chats = generate("multi-turn", 8, 2, 1.0, {"turns": 4, "user_len": 700, "output_len": 400})
    records = list(trace_records(chats))
    by_id = {r.request_id: rec for r, rec in zip(chats, records, strict=True)}
    first, second = by_id["chat-0-0"]["hash_ids"], by_id["chat-0-1"]["hash_ids"]
    full = by_id["chat-0-0"]["input_length"] // TRACE_BLOCK
    assert second[:full] == first[:full] and len(second) > len(first)


def test_trace_runs_through_the_fleet(tmp_path: Path) -> None:
    """`workload='trace'` replays the file; equal input gives equal truth (deterministic)."""
    path = tmp_path / "t.jsonl"
    write_trace(path, generate("generated-shared-prefix", 60, 1, 5.0, {"groups": 2}))
    config = SimConfig(
        instances=parse_instances("2"),
        workload="trace",
        trace=str(path),
        requests=60,
        block_size=512,
        capacity_blocks=40,
        routing="prefix-aware",
    )
    truth = Fleet(config).run()
    assert truth["fleet"]["requests_finished"] == 60
    assert truth["fleet"]["hit_rate"] > 0.3
    assert Fleet(dataclasses.replace(config)).run()["fleet"] == truth["fleet"]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"timestamp": 0, "input_length": 10}\n', ":1: not a Mooncake trace line"),
        ('{"timestamp": 0, "input_length": 10, "output_length": 1}\nnot json\n', ":2: not JSON"),
        ("\n", "has no requests"),
        (
            '{"timestamp": 0, "input_length": 10, "output_length": -1}\n',
            ":1: output_length must be >= 0",
        ),
        ('{"timestamp": 0, "input_length": 0, "output_length": 1}\n', ":1: input_length must be"),
    ],
)
def test_bad_trace_says_where(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    with pytest.raises(ConfigError, match=message):
        load_trace(path, 10, seed=0)


def test_missing_trace_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read trace"):
        load_trace(tmp_path / "nope.jsonl", 10, seed=0)


def test_trace_with_a_byte_order_mark_and_crlf_reads_like_a_plain_one(tmp_path: Path) -> None:
    plain, marked = tmp_path / "plain.jsonl", tmp_path / "marked.jsonl"
    write_trace(plain, generate("generated-shared-prefix", 5, 1, 5.0, {"groups": 2}))
    lines = plain.read_text().splitlines()
    marked.write_bytes(("\r\n".join(lines) + "\r\n").encode("utf-8-sig"))
    assert load_trace(marked, 10, seed=0) == load_trace(plain, 10, seed=0)


def test_gzipped_trace_reads_like_the_plain_one(tmp_path: Path) -> None:
    plain, packed = tmp_path / "trace.jsonl", tmp_path / "trace.jsonl.gz"
    write_trace(plain, generate("generated-shared-prefix", 5, 1, 5.0, {"groups": 2}))
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    assert load_trace(packed, 10, seed=0) == load_trace(plain, 10, seed=0)
    packed.write_bytes(gzip.compress(plain.read_bytes())[:30])
    with pytest.raises(ConfigError, match=r"cannot read trace .*trace\.jsonl\.gz: \w"):
        load_trace(packed, 10, seed=0)


def test_trace_running_past_2100_is_refused(tmp_path: Path) -> None:
    """Timestamps 10^13 ms apart put the second request in the year 2343."""
    path = tmp_path / "far.jsonl"
    lines = [{"timestamp": t, "input_length": 10, "output_length": 1} for t in (0, 1e13)]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    config = SimConfig(workload="trace", trace=str(path), requests=2)
    with pytest.raises(ConfigError, match="1e\\+10 s after --start-time, after 2100-01-01"):
        Fleet(config).run()


def test_ids_beyond_the_prompt_cost_nothing(tmp_path: Path) -> None:
    """A 100-token prompt listing 20,000 ids uses the first one only (it drew 512 tokens for
    every id, 10 million, before cutting the prompt to its length)."""
    line = {"timestamp": 0, "input_length": 100, "output_length": 1}
    many, one = tmp_path / "many.jsonl", tmp_path / "one.jsonl"
    many.write_text(json.dumps({**line, "hash_ids": list(range(20_000))}))
    one.write_text(json.dumps({**line, "hash_ids": [0]}))
    tracemalloc.start()
    try:
        replayed = load_trace(many, 1, seed=0)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert replayed == load_trace(one, 1, seed=0)
    assert peak < 10_000_000


def test_line_larger_than_a_cache_is_refused_before_its_tokens_are_drawn(tmp_path: Path) -> None:
    """A corrupt input_length (10^12) would take terabytes of tokens: refused by line."""
    path = tmp_path / "huge.jsonl"
    lines = [(10, 1), (10**12, 1)]
    path.write_text(
        "".join(
            json.dumps({"timestamp": 0, "input_length": i, "output_length": o}) + "\n"
            for i, o in lines
        )
    )
    config = SimConfig(workload="trace", trace=str(path), requests=2, capacity_blocks=100)
    with pytest.raises(
        ConfigError,
        match=r"huge\.jsonl:2: 1,000,000,000,001 tokens .* holds \(1,600: --capacity-blocks",
    ):
        Fleet(config).run()
