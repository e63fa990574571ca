"""The collector's pure stages without services: columns, insert planning, gaps, backoff."""

from __future__ import annotations

import dataclasses
import gc
import itertools
import socket

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kvscope.collector.pipeline import columns
from kvscope.collector.pipeline.buffer import gc_paused as _gc_paused
from kvscope.collector.pipeline.config import CollectorConfig
from kvscope.collector.pipeline.decode import BadRecord, _flat_kv_decoder, decode_records
from kvscope.collector.pipeline.gaps import GapTracker
from kvscope.collector.pipeline.plan import PartitionBatch, plan_inserts
from kvscope.collector.storage.store import _without_null_flags
from kvscope.schemas import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    Envelope,
    Gap,
    KVEventBatch,
    Source,
    encode,
)
from kvscope.schemas.errors import ConfigError

DAY = 86_400.0
hashes = st.lists(st.integers(0, 2**64 - 1), max_size=5)
media = st.sampled_from(["GPU", "CPU", "DISK"])
raw_media = st.one_of(st.none(), st.sampled_from(["CPU_PINNED", "cpu"]))
group_idx = st.one_of(st.none(), st.integers(0, 3))
tiers = st.one_of(st.none(), st.sampled_from(["REMOTE", "fs-1", "REMOTE/obj-1"]))
events = st.one_of(
    st.builds(
        BlockStored,
        block_hashes=hashes,
        parent_block_hash=st.one_of(st.none(), st.integers(0, 2**64 - 1)),
        block_size=st.integers(0, 64),
        token_count=st.integers(0, 400),
        medium=media,
        medium_raw=raw_media,
        lora_name=st.one_of(st.none(), st.sampled_from(["", "lora-a", "lora-b"])),
        group_idx=group_idx,
        tier=tiers,
    ),
    st.builds(
        BlockRemoved,
        block_hashes=hashes,
        medium=media,
        medium_raw=raw_media,
        group_idx=group_idx,
        tier=tiers,
    ),
    st.builds(AllBlocksCleared),
)


def _env(seq: int, ts: float, evs: list, instance: str = "a", epoch: int = 1) -> Envelope:
    return Envelope(
        source=Source(instance=instance), epoch=epoch, seq=seq, ts=ts, body=KVEventBatch(ts, evs)
    )


def _reference_rows(envelopes: list[Envelope]) -> list[tuple]:
    """Row-wise reference of kv_block_events (the obvious per-hash loop)."""
    rows = []
    for env in envelopes:
        for ei, ev in enumerate(env.body.events):
            if isinstance(ev, AllBlocksCleared):
                rows.append((env.seq, ei, 0, 3, 0, 0, 0, 0, "", "", "", -1))
                continue
            stored = isinstance(ev, BlockStored)
            medium = ev.medium if ev.tier is None else f"{ev.medium}/{ev.tier}"  # tiers apart
            strings = (medium, ev.medium_raw or "", (ev.lora_name or "") if stored else "")
            group = -1 if ev.group_idx is None else ev.group_idx
            for pos, h in enumerate(ev.block_hashes):
                first_parent = (ev.parent_block_hash or 0) if stored else 0
                parent = first_parent if pos == 0 else 0
                size = ev.block_size if stored else 0
                total = ev.token_count if stored else 0
                by_size = max(0, min(size, total - pos * size))
                tokens = by_size if size else (total if pos == 0 else 0)
                rows.append(
                    (env.seq, ei, pos, 1 if stored else 2, h, parent, tokens, size, *strings, group)
                )
    return rows


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(events, max_size=4), max_size=6))
def test_vectorized_kv_columns_match_row_wise_reference(batches: list[list]) -> None:
    envelopes = [_env(i, 1000.0 + i, evs) for i, evs in enumerate(batches)]
    flat = [_flat_kv_decoder.decode(encode(e)) for e in envelopes]
    table = columns.kv_block_events(flat, list(range(len(envelopes))), "t", 0)
    got = list(
        zip(
            *(
                table.column(c).to_pylist()
                for c in (
                    "seq",
                    "event_index",
                    "position",
                    "event",
                    "block_hash",
                    "parent_hash",
                    "tokens",
                    "block_size",
                    "medium",
                    "medium_raw",
                    "lora_name",
                    "group_idx",
                )
            ),
            strict=True,
        )
    )
    assert got == _reference_rows(envelopes)
    assert table.column("_offset").to_pylist() == [r[0] for r in got]
    assert set(table.column("instance").to_pylist()) <= {"a"}


def _batch(rows_by_table: dict[str, list[tuple[int, float]]]) -> PartitionBatch:
    tables = {}
    for name, rows in rows_by_table.items():
        tables[name] = pa.table(
            {
                "_topic": pa.array(["t"] * len(rows)),
                "_partition": pa.array([0] * len(rows), pa.uint32()),
                "_offset": pa.array([o for o, _ in rows], pa.uint64()),
                "ts": columns.seconds_to_ts([ts for _, ts in rows]),
            }
        )
    last = max(o for rows in rows_by_table.values() for o, _ in rows)
    return PartitionBatch("t", 0, tables, None, last + 1)


def test_plan_keeps_offset_order_without_a_note_when_runs_do_not_interleave() -> None:
    batch = _batch(
        {
            "kv_block_events": [(0, 1.0), (0, 1.0), (1, 2.0), (3, DAY + 1)],
            "ingest_errors": [(2, 0.0)],
        }
    )
    plan = plan_inserts([batch])
    assert [(i.table, i.rows.column("_offset").to_pylist()) for i in plan] == [
        ("kv_block_events", [0, 0, 1]),
        ("ingest_errors", [2]),
        ("kv_block_events", [3]),
    ]
    assert len({i.token for i in plan}) == 3
    assert [i.token for i in plan_inserts([batch])] == [i.token for i in plan]


@pytest.mark.parametrize("records", [4, 50, 1001])
def test_plan_groups_alternating_days_into_one_insert_per_day_after_a_note(records: int) -> None:
    rows = [(o, 1.0 + (o % 2) * DAY) for o in range(records)]
    batch = _batch({"kv_block_events": rows, "ingest_errors": [(records, 0.0)]})
    plan = plan_inserts([batch])
    assert [i.table for i in plan] == [
        "ingest_batches",
        "kv_block_events",
        "kv_block_events",
        "ingest_errors",
    ]
    note = plan[0].rows.to_pylist()
    assert [(n["_partition"], n["first_offset"], n["next_offset"]) for n in note] == [
        (0, 0, records + 1)
    ]
    assert plan[1].rows.column("_offset").to_pylist() == list(range(0, records, 2))
    assert plan[2].rows.column("_offset").to_pylist() == list(range(1, records, 2))
    assert [i.token for i in plan_inserts([batch])] == [i.token for i in plan]


def test_plan_notes_a_partition_whose_order_differs_from_the_shared_one() -> None:
    one = _batch({"kv_block_events": [(0, 1.0), (1, DAY + 1)]})
    two = dataclasses.replace(_batch({"kv_block_events": [(5, DAY + 2), (6, 2.0)]}), partition=1)
    plan = plan_inserts([one, two])
    assert [i.table for i in plan] == ["ingest_batches", "kv_block_events", "kv_block_events"]
    assert plan[0].rows.column("_partition").to_pylist() == [1]
    assert [i.rows.column("_offset").to_pylist() for i in plan[1:]] == [[0, 6], [1, 5]]


def test_plan_merges_partitions_hitting_the_same_table_partition() -> None:
    one = _batch({"kv_block_events": [(0, 1.0), (1, 1.0)]})
    two = dataclasses.replace(_batch({"kv_block_events": [(7, 2.0)]}), partition=1)
    plan = plan_inserts([one, two])
    assert [(i.table, i.rows.num_rows) for i in plan] == [("kv_block_events", 3)]


@pytest.mark.parametrize("chunks", [1, 2, 7])
@pytest.mark.parametrize("days", [1, 2])
def test_plan_rows_and_tokens_do_not_depend_on_how_rows_are_chunked(chunks: int, days: int) -> None:
    """A flush's rows arrive as one table per poll: the plan (its rows, and the tokens that
    a retry must reproduce) is that of the same rows in one chunk, within a day or across."""
    n = 60
    whole = pa.table(
        {
            "_topic": pa.array(["t"] * n),
            "_partition": pa.array([0] * n, pa.uint32()),
            "_offset": pa.array([o // 3 for o in range(n)], pa.uint64()),
            "ts": columns.seconds_to_ts([1.0 + (o // 3 * days // 20) * DAY for o in range(n)]),
            "epoch": pa.array([1 + o // 30 for o in range(n)], pa.uint64()),
            "seq": pa.array([o // 3 for o in range(n)], pa.uint64()),
        }
    )
    cuts = [round(i * n / chunks) for i in range(chunks + 1)]
    chunked = pa.concat_tables([whole.slice(a, b - a) for a, b in itertools.pairwise(cuts)])
    assert chunked.column("seq").num_chunks == chunks

    def plan(rows: pa.Table) -> list[tuple[str, list[int], str]]:
        batch = PartitionBatch("t", 0, {"kv_block_events": rows}, None, n // 3)
        return [
            (i.table, i.rows.column("_offset").to_pylist(), i.token) for i in plan_inserts([batch])
        ]

    assert plan(chunked) == plan(whole)
    assert len(plan(whole)) == days


@pytest.mark.parametrize("n", [1, 100])
def test_in_place_rows_are_non_nullable_where_no_value_is_null(n: int) -> None:
    """chDB reads a nullable Arrow field as Nullable(T) and converts it row by row: fields
    without nulls go out non-nullable, fields with nulls stay nullable, no data is copied."""
    rows = pa.table(
        {
            "full": pa.array(range(n), pa.uint64()),
            "holes": pa.array([None if i % 2 else i for i in range(n)], pa.uint32()),
            "names": pa.array(["a", "b"] * n)[:n].dictionary_encode(),
        }
    )
    out = _without_null_flags(rows)
    assert [(f.name, f.nullable) for f in out.schema] == [
        ("full", False),
        ("holes", n > 1),
        ("names", False),
    ]
    assert out.to_pylist() == rows.to_pylist()
    [before], [after] = rows.column("full").chunks, out.column("full").chunks
    assert after.buffers()[1].address == before.buffers()[1].address
    assert _without_null_flags(out) is out


def test_gap_tracker_reports_holes_once_and_ignores_retries() -> None:
    tracker = GapTracker()
    envs = [_env(s, 1.0, []) for s in (0, 1, 1, 4, 2, 5)]
    gaps = tracker.observe("t", 0, [(list(range(6)), envs)])
    assert [(g.offset, g.first_seq, g.last_seq) for g in gaps] == [(3, 2, 3)]
    assert tracker.observe("t", 0, [([6], [_env(9, 1.0, [], epoch=2)])])[0].first_seq == 0
    tracker.restore("t", 0, [("a", 0, 1, 10)])
    assert tracker.observe("t", 0, [([7], [_env(11, 1.0, [])])]) == []
    tracker.forget("t", 0)
    assert tracker.observe("t", 0, [([8], [_env(0, 1.0, [])])]) == []


@pytest.mark.parametrize("bound", [1, 10, 1000])
def test_gap_tracker_state_is_bounded_least_recently_seen_first(bound: int) -> None:
    """Unit test: the state's size is internal (1M epochs through a broker would cost minutes)."""
    tracker = GapTracker(max_tracked=bound)
    epochs = 3 * bound + 5
    envs = [_env(0, 1.0, [], epoch=e) for e in range(epochs)]
    assert tracker.observe("t", 0, [(list(range(epochs)), envs)]) == []
    assert tracker.tracked("t", 0) == bound
    newest = epochs - 1
    assert tracker.observe("t", 0, [([epochs], [_env(1, 1.0, [], epoch=newest)])]) == []
    holes = tracker.observe("t", 0, [([epochs + 1], [_env(3, 1.0, [], epoch=0)])])
    assert [(g.first_seq, g.last_seq) for g in holes] == [(0, 2)]
    tracker.restore("t", 1, [("a", 0, e, 5) for e in range(epochs)])
    assert tracker.tracked("t", 1) == bound
    assert tracker.observe("t", 1, [([0], [_env(6, 1.0, [], epoch=newest)])]) == []
    assert GapTracker().max_tracked == 50_000


@pytest.mark.parametrize("holes", [[(1, 1)], [(0, 0), (5, 6)], [(2, 2), (4, 8), (10, 10)]])
def test_gap_tracker_finds_holes_of_every_width(holes: list[tuple[int, int]]) -> None:
    """Holes of one seq and more, at the start and between others, each found once."""
    missing = {seq for first, last in holes for seq in range(first, last + 1)}
    seqs = [seq for seq in range(12) if seq not in missing]
    tracker = GapTracker()
    found = tracker.observe("t", 0, [(seqs, [_env(seq, 1.0, []) for seq in seqs])])
    assert [(g.first_seq, g.last_seq) for g in found] == holes
    assert [g.envelope.seq for g in found] == [last + 1 for _, last in holes]


def test_gap_envelopes_take_seqs_in_offset_order() -> None:
    tracker = GapTracker()
    gap_env = Envelope(source=Source(instance="a"), epoch=1, seq=1, ts=1.0, body=Gap(5, 6))
    found = tracker.observe(
        "t", 0, [([0, 2], [_env(0, 1.0, []), _env(2, 1.0, [])]), ([1], [gap_env])]
    )
    assert found == []


def test_decode_routes_records() -> None:
    @dataclasses.dataclass
    class Rec:
        offset: int
        key: bytes | None
        value: bytes | None

    good = encode(_env(0, 1.0, []))
    gap = encode(Envelope(source=Source(instance="a"), epoch=1, seq=1, ts=1.0, body=Gap(0, 0)))
    out = decode_records(
        "kv-events", [Rec(0, b"k", good), Rec(1, None, b"\xc1"), Rec(2, b"k", gap)]
    )
    assert out.offsets == [0]
    assert out.gap_offsets == [2]
    assert out.bad == [BadRecord(1, b"", b"\xc1", out.bad[0].reason)]
    with pytest.raises(KeyError):
        decode_records("no-such-stream", [])


@pytest.mark.parametrize(
    "change",
    [
        {"streams": ("nope",)},
        {"streams": ()},
        {"batch_rows": 0},
        {"batch_rows": 2_000_000},
        {"batch_seconds": 0},
        {"batch_seconds": float("nan")},
        {"batch_seconds": float("inf")},
        {"exit_when_idle": -1.0},
        {"exit_when_idle": float("nan")},
        {"metrics_port": 70000},
        {"group": " "},
        {"max_partition_fetch_bytes": 10**9},
        {"retry_initial_s": 5.0, "retry_max_s": 1.0},
        {"topic_prefix": ""},
        {"topic_prefix": "a b."},
        {"topic_prefix": "kv/"},
        {"topic_prefix": "p\n"},
        {"topic_prefix": "x" * 233},
    ],
)
def test_config_rejects(change: dict) -> None:
    with pytest.raises(ConfigError):
        dataclasses.replace(CollectorConfig(), **change).validate()


@pytest.mark.parametrize("host", ["127.0.0.1", "nonexistent.invalid"])
def test_metrics_address_that_cannot_be_listened_on_is_one_line(host: str) -> None:
    import socket

    from kvscope.collector.pipeline import metrics

    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        with pytest.raises(ConfigError, match=rf"cannot serve metrics on {host}:{port} \("):
            metrics.serve(port, host)


@pytest.mark.parametrize("host", ["::1", "[::1]"])
def test_metrics_are_served_on_ipv6_loopback_written_either_way(host: str) -> None:
    import urllib.request

    from kvscope.collector.pipeline import metrics

    with socket.create_server(("::1", 0), family=socket.AF_INET6) as probe:
        port = probe.getsockname()[1]
    # Its own Liveness: the module's one goes stale 120 s into a long test session.
    metrics.serve(port, host, metrics.Liveness())
    with urllib.request.urlopen(f"http://[::1]:{port}/healthz", timeout=5) as response:
        assert response.status == 200


def test_metrics_are_served_on_loopback() -> None:
    import urllib.request

    from kvscope.collector.pipeline import metrics
    from kvscope.local.broker import free_port

    port = free_port()
    metrics.serve(port)
    metrics.ROWS_INSERTED.labels("kv_block_events").inc(0)
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    for name in (
        "kvscope_collector_records_consumed_total",
        "kvscope_collector_rows_inserted_total",
        "kvscope_collector_insert_seconds",
        "kvscope_collector_paused_partitions",
        "kvscope_collector_batch_rows",
    ):
        assert name in text


def test_collector_commands_import_nothing_heavy() -> None:
    """`kvscope --help` stays fast: the collect/migrate commands import heavy deps lazily."""
    import subprocess
    import sys

    code = (
        "import sys, argparse\n"
        "from kvscope.cli.commands import collect, migrate\n"
        "from kvscope.collector.pipeline import config\n"
        "from kvscope.collector.storage import target\n"
        "p = argparse.ArgumentParser().add_subparsers()\n"
        "collect.register(p); migrate.register(p)\n"
        "heavy = {'clickhouse_connect', 'chdb', 'pyarrow', 'numpy', 'aiokafka'}\n"
        "print(sorted(heavy & set(sys.modules)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_gc_pause_is_scoped_and_restores_the_previous_state() -> None:
    assert gc.isenabled()
    with pytest.raises(ValueError), _gc_paused():
        assert not gc.isenabled()
        raise ValueError("decode failed")
    assert gc.isenabled()
    gc.disable()
    try:
        with _gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()
