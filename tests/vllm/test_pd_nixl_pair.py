"""A real prefill→decode hand-off: two vLLM CPU engines, NIXL over UCX on loopback,
`KvscopeConnector` wrapping `NixlConnector` on both, the toy-proxy flow, the real broker,
collector and chDB.

One pair serves the whole module (two engines take minutes to start on 2 shared cores):
warm-up requests until one is served, at most `WARMUP_ATTEMPTS` (the first NIXL handshake
may time out under load, more than once: each such request is a failed record and the
engine keeps serving), one request per prompt length of the sweep, one
request whose `kv_transfer_params` name a peer that is not there, one more request after
that, and last one whose prefill engine is killed between its answer and the decode's
read (then a plain completion on the decode engine). The tests below check what reached
`kv_transfers`.
"""

from __future__ import annotations

import json
import math
import re
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from kvscope.collector.errors import EngineError, EngineRefused
from kvscope.local.broker import LocalBroker, free_port
from kvscope.local.pd_pair import (
    BLOCK_SIZE,
    SERVED_MODEL,
    Disaggregated,
    PdPair,
    decode,
    disaggregated_completion,
    post_json,
    prefill,
)
from kvscope.local.processes import log_tail
from kvscope.publisher.vllm.connector.plans import PEER_INSTANCE_KEY
from support.chdb_database import fresh_database
from support.e2e_support import collect

PROMPT_LENGTHS = (64, 96, 100, 160)
"""Whole blocks and a partial last block (100 tokens: 3 full + 1 partial)."""
MAX_TOKENS = 8
pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1800)]  # the pair starts in the first test
PREFILL, DECODE = "pd-prefill", "pd-decode"
"""kvscope instance names, different from the NIXL engine ids (prefill-0, decode-0)."""
WARMUP_ATTEMPTS = 4
"""vLLM 0.32 gives the handshake's metadata reply 5 s (`RCVTIMEO`, not configurable): on a
loaded 2-core machine it timed out for the warm-up and for the next request (CI, stop 23)."""
KILLED_READ_TIMEOUT_S = 30.0
"""How long the client waits for the decode whose prefill engine was killed. Its read usually
fails at once; in one CI run (2026-11-29) UCX never reported the dead peer and the read
hung until the client gave up, after 120 s."""


def prompt(length: int, salt: int) -> list[int]:
    """`length` token ids, distinct per salt so no request hits another's prefix cache."""
    return [3 + salt] + [3 + (salt * 31 + 7 * j) % 500 for j in range(length - 1)]


def body(tokens: list[int]) -> dict[str, Any]:
    return {"model": SERVED_MODEL, "prompt": tokens, "max_tokens": MAX_TOKENS, "temperature": 0}


def kv_bytes_per_block(model_dir: Path) -> int:
    """K and V, every layer, one block, float32: computed from the model's config."""
    config = json.loads((model_dir / "config.json").read_text())
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    per_token = 2 * config["num_hidden_layers"] * config["num_key_value_heads"] * head_dim * 4
    return per_token * BLOCK_SIZE


@dataclass
class PairRun:
    """What the module's pair served and what the collector stored."""

    warmups: dict[str, Disaggregated | None] = field(default_factory=dict)
    """Warm-up request id -> what it served (None: refused, its handshake timed out)."""
    sweep: dict[str, tuple[int, Disaggregated]] = field(default_factory=dict)
    ghost_id: str = ""
    ghost_error: str = ""
    after: Disaggregated | None = None
    killed_id: str = ""
    killed_error: str = ""
    """The decode request whose prefill engine was killed after prefilling it."""
    survivor_text: str = ""
    """A plain completion on the decode engine after that."""
    reference: dict[str, str] = field(default_factory=dict)
    rows: list[dict[str, Any]] = field(default_factory=list)
    """kv_transfers rows with a request id (the wrapper's)."""
    anonymous: int = 0
    """kv_transfers rows without one (connector stats: none while the wrapper is in place)."""
    nixl: dict[str, float] = field(default_factory=dict)
    """NIXL's own stats on the decode engine's /metrics: xfer time sum and count, bytes sum."""
    nixl_buckets: dict[float, float] = field(default_factory=dict)
    """NIXL's transfer-time histogram there: cumulative count per bucket bound (`le`)."""
    accesses: list[tuple[str, str, int]] = field(default_factory=list)
    """kv_accesses rows: (instance, request id, held_until_free)."""
    bytes_per_block: int = 0
    lease_lines: list[str] = field(default_factory=list)
    """The prefill engine's log lines saying NIXL freed blocks no decode had read yet."""


def _rid() -> str:
    return f"pd{uuid.uuid4().hex[:10]}"


def _serve(pair: PdPair, run: PairRun) -> None:
    p, d = pair.prefill.url, pair.decode.url
    for _ in range(WARMUP_ATTEMPTS):
        rid = _rid()
        try:
            run.warmups[rid] = disaggregated_completion(p, d, body(prompt(64, 90)), rid)
            break
        except EngineRefused:  # a timeout or lost connection propagates: the outcome is unknown
            run.warmups[rid] = None  # a timed-out first handshake: checked in the tests
    for salt, length in enumerate(PROMPT_LENGTHS):
        rid = _rid()
        run.sweep[rid] = (length, disaggregated_completion(p, d, body(prompt(length, salt)), rid))
    run.ghost_id = _rid()
    params = prefill(p, body(prompt(96, 50)), run.ghost_id)
    ghost = {k: v for k, v in params.items() if k != PEER_INSTANCE_KEY}
    ghost.update(remote_engine_id="ghost-0", remote_port=free_port())
    try:
        decode(d, body(prompt(96, 50)), run.ghost_id, ghost)
    except EngineError as error:
        run.ghost_error = str(error)
    after_id = _rid()
    run.after = disaggregated_completion(p, d, body(prompt(128, 60)), after_id)
    post_json(f"{p}/reset_prefix_cache", {})  # the reference is computed afresh
    for rid, (length, _) in run.sweep.items():
        salt = PROMPT_LENGTHS.index(length)
        answer = post_json(f"{p}/v1/completions", body(prompt(length, salt)))
        run.reference[rid] = answer["choices"][0]["text"]
    # Last: the prefill engine dies between its answer and the decode's read.
    run.killed_id = _rid()
    params = prefill(p, body(prompt(96, 70)), run.killed_id)
    pair.kill(pair.prefill)
    try:  # UCX may never report the dead peer: the read then hangs until the client gives up
        decode(d, body(prompt(96, 70)), run.killed_id, params, KILLED_READ_TIMEOUT_S)
    except EngineError as error:
        run.killed_error = str(error)
    answer = post_json(f"{d}/v1/completions", body(prompt(64, 80)))
    run.survivor_text = answer["choices"][0]["text"]
    run.nixl, run.nixl_buckets = nixl_metrics(d)


NIXL_SERIES = re.compile(
    r"^vllm:(nixl_xfer_time_seconds_sum|nixl_xfer_time_seconds_count|"
    r"nixl_bytes_transferred_sum)\{[^}]*\} ([0-9.e+-]+)$",
    re.M,
)
NIXL_BUCKETS = re.compile(
    r'^vllm:nixl_xfer_time_seconds_bucket\{[^}]*le="([0-9.e+-]+)"[^}]*\} ([0-9.e+-]+)$', re.M
)


def nixl_metrics(url: str) -> tuple[dict[str, float], dict[float, float]]:
    """NIXL's own transfer stats as vLLM exports them (through the wrapper's prom metrics),
    and its transfer-time histogram's finite buckets (bound -> cumulative count)."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=30) as response:
        text = response.read().decode()
    stats = {name: float(value) for name, value in NIXL_SERIES.findall(text)}
    buckets = {float(le): float(count) for le, count in NIXL_BUCKETS.findall(text)}
    return stats, buckets


@pytest.fixture(scope="module")
def pair_run(
    tiny_llama: Path,
    broker: LocalBroker,
    chdb_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[PairRun]:
    prefix = f"t{uuid.uuid4().hex[:10]}."
    database = f"test_{uuid.uuid4().hex[:12]}"
    kvscope = {
        "KVSCOPE_BOOTSTRAP_SERVERS": broker.bootstrap_servers,
        "KVSCOPE_TOPIC_PREFIX": prefix,
        "KVSCOPE_STATS_INTERVAL_S": "0.5",
    }
    work = tmp_path_factory.mktemp("pd")
    pair = PdPair(tiny_llama, work, kvscope, prefill_instance=PREFILL, decode_instance=DECODE)
    run = PairRun(bytes_per_block=kv_bytes_per_block(tiny_llama))
    try:
        pair.start()
        _serve(pair, run)
    except EngineError as error:
        logs = "\n".join(f"--- {e.log_path}:\n{log_tail(e.log_path)}" for e in pair.engines)
        raise EngineError(f"{error}\nwarm-ups {run.warmups}\n{logs}") from None
    finally:
        pair.stop()
        run.lease_lines = lease_lines(pair.prefill.log_path) if pair.engines else []
    with fresh_database(chdb_path, database) as client:
        url = f"chdb://{chdb_path}?database={database}"
        collect(client, url, broker.bootstrap_servers, prefix)
        columns = (
            "request_id, role, instance, src_instance, dst_instance, backend, blocks, bytes, "
            "chunks, latency_s, status, seq"
        )
        result = client.query(f"SELECT {columns} FROM kv_transfers ORDER BY instance, seq")
        rows = [dict(zip(result.column_names, row, strict=True)) for row in result.result_rows]
        run.rows = [r for r in rows if r["request_id"]]
        run.anonymous = len(rows) - len(run.rows)
        held = "SELECT instance, request_id, held_until_free FROM kv_accesses"
        run.accesses = [tuple(row) for row in client.query(held).result_rows]
        # The measured numbers docs/publisher.md quotes, kept beside the engines' logs.
        summary = {
            "rows": run.rows,
            "nixl": run.nixl,
            "nixl_buckets": run.nixl_buckets,
            "sweep": {k: v[1].decode_wall_s for k, v in run.sweep.items()},
        }
        (work / "summary.json").write_text(json.dumps(summary, default=str, indent=1))
        yield run


LEASE_LINE = re.compile(
    r"^.*(?:Releasing expired KV blocks|Potentially invalid KV blocks).*$", re.M
)


def lease_lines(log_path: Path) -> list[str]:
    """NIXL's lines for a lease that expired before the decode's read, and for that read."""
    if not log_path.exists():
        return []
    return LEASE_LINE.findall(log_path.read_text(errors="replace"))


def by_id(run: PairRun) -> dict[str, list[dict[str, Any]]]:
    rows: dict[str, list[dict[str, Any]]] = {}
    for row in run.rows:
        rows.setdefault(row["request_id"], []).append(row)
    return rows


def record_id(proxy_id: str) -> str:
    """The request id a completion carries in vLLM: `cmpl-<X-Request-Id>-<prompt index>`."""
    return f"cmpl-{proxy_id}-0"


def test_one_decode_side_record_per_request_the_proxy_sent(pair_run: PairRun) -> None:
    sent = [*pair_run.warmups, *pair_run.sweep, pair_run.ghost_id, pair_run.killed_id]
    assert pair_run.after is not None
    sent.append(pair_run.after.request_id)
    records = by_id(pair_run)
    assert sorted(records) == sorted(record_id(rid) for rid in sent)
    assert all(len(rows) == 1 for rows in records.values())
    assert pair_run.anonymous == 0  # the stat logger leaves transfers to the wrapper
    assert {(r["role"], r["instance"], r["backend"]) for r in pair_run.rows} == {
        ("decode", DECODE, "nixl")
    }
    assert all(r["chunks"] == 1 for r in pair_run.rows if r["status"] == "ok")


def test_a_prefills_access_says_its_blocks_were_held_until_the_transfer(
    pair_run: PairRun,
) -> None:
    """The prefill engine finishes a request after one token and keeps its blocks until the
    decode side has read them: its access says so. A decode engine's access says so only
    for a request that ended while its read was still in flight (the read then failed, as
    the one from the killed prefill engine can, hanging until the client gives up):
    vLLM keeps such blocks until the read ends. A served decode never holds."""
    held = {(i, rid): h for i, rid, h in pair_run.accesses}
    read = {r["request_id"] for r in pair_run.rows if r["status"] == "ok"}
    failed = {r["request_id"] for r in pair_run.rows if r["status"] != "ok"}
    assert read, "the run read KV from the prefill engine"
    for request_id in read:
        assert held.get((PREFILL, request_id)) == 1, request_id
        assert held.get((DECODE, request_id)) == 0, request_id
    decode_held = {rid for (instance, rid), h in held.items() if instance == DECODE and h}
    assert decode_held <= failed, sorted(decode_held - failed)


def test_each_hand_off_names_the_pair_and_its_blocks_bytes_and_latency(pair_run: PairRun) -> None:
    records = by_id(pair_run)
    for rid, (length, served) in pair_run.sweep.items():
        (row,) = records[record_id(rid)]
        blocks = math.ceil(length / BLOCK_SIZE)
        assert (row["src_instance"], row["dst_instance"], row["status"]) == (PREFILL, DECODE, "ok")
        assert (row["blocks"], row["bytes"]) == (blocks, blocks * pair_run.bytes_per_block)
        assert 0 < row["latency_s"] <= served.decode_wall_s


def test_decode_output_equals_a_non_disaggregated_engines(pair_run: PairRun) -> None:
    decoded = {rid: served.text for rid, (_, served) in pair_run.sweep.items()}
    assert all(decoded.values())
    assert decoded == pair_run.reference


def test_a_dead_peer_is_a_failed_record_and_the_engine_keeps_serving(pair_run: PairRun) -> None:
    (ghost,) = by_id(pair_run)[record_id(pair_run.ghost_id)]
    assert (ghost["status"], ghost["src_instance"], ghost["dst_instance"]) == (
        "failed",
        "ghost-0",
        DECODE,
    )
    assert pair_run.ghost_error  # vLLM's kv_load_failure_policy "fail" refuses the request
    assert pair_run.after is not None and pair_run.after.text
    (after,) = by_id(pair_run)[record_id(pair_run.after.request_id)]
    assert (after["status"], after["src_instance"]) == ("ok", PREFILL)


def test_a_prefill_engine_killed_before_the_read_is_a_failed_record(pair_run: PairRun) -> None:
    (killed,) = by_id(pair_run)[record_id(pair_run.killed_id)]
    assert (killed["status"], killed["src_instance"], killed["dst_instance"]) == (
        "failed",
        PREFILL,
        DECODE,
    )
    assert pair_run.killed_error
    assert pair_run.survivor_text  # the decode engine still serves


def test_a_failed_first_handshake_is_a_failed_record(pair_run: PairRun) -> None:
    records = by_id(pair_run)
    statuses = [records[record_id(rid)][0]["status"] for rid in pair_run.warmups]
    served = ["ok" if done is not None else "failed" for done in pair_run.warmups.values()]
    assert statuses == served


def test_wrapper_records_exactly_nixls_transfers_and_bytes(pair_run: PairRun) -> None:
    """One ok record per read NIXL completed, with NIXL's own byte count."""
    ok = [r for r in pair_run.rows if r["status"] == "ok"]
    nixl = pair_run.nixl
    assert nixl["nixl_xfer_time_seconds_count"] == len(ok)
    assert nixl["nixl_bytes_transferred_sum"] == sum(r["bytes"] for r in ok)


@pytest.mark.xfail(
    strict=False,
    reason="open finding (issue 18): in one run of about six under load NIXL's summed "
    "transfer time exceeded the wrapper's by 3.0 ms (5.6362 s vs 5.6332 s, 0.05%) while "
    "counts and bytes matched; every vLLM 0.32 code path read posts and completes the read "
    "inside the wrapper's window and both clocks are CLOCK_MONOTONIC, so the cause is not "
    "known yet; the failure message now carries per-transfer evidence",
)
def test_wrapper_latency_contains_nixls_own_transfer_duration(pair_run: PairRun) -> None:
    """NIXL times each read from post to completion; that lies inside the wrapper's window
    (the `start_load_kv` that posts it to the `get_transfer_results` that sees it done).
    So each NIXL duration is at most its transfer's wrapper latency: NIXL's sum is never
    larger, and NIXL's histogram has at least as many transfers under every bucket bound
    as the wrapper's latencies."""
    ok = sorted(r["latency_s"] for r in pair_run.rows if r["status"] == "ok")
    nixl = pair_run.nixl
    evidence = f"wrapper latencies {ok}, NIXL {nixl}"
    assert 0 < nixl["nixl_xfer_time_seconds_sum"] <= sum(ok), evidence
    evidence += f", NIXL buckets {pair_run.nixl_buckets}"
    assert pair_run.nixl_buckets, evidence
    for le, nixl_under in pair_run.nixl_buckets.items():
        assert nixl_under >= sum(1 for latency in ok if latency <= le), (le, evidence)


@pytest.mark.xfail(
    strict=False,
    reason="known vLLM 0.32 + NIXL stall, not kvscope's: NixlConnector alone, unwrapped, "
    "stalls too (docs/publisher.md, 2026-11-29: 4 expired leases in 25 hand-offs against the "
    "wrapper's 2 in 20); on 2 shared cores the decode's read can wait until the prefill's lease "
    "(10 s in the local pair) frees its blocks",
)
def test_no_served_requests_blocks_were_freed_before_the_decode_read_them(
    pair_run: PairRun,
) -> None:
    """NIXL frees a prefill's blocks when its lease expires (`KV_LEASE_DURATION_S` after the
    request finished) unless the decode side has read them; a read after that reads freed
    blocks ("Potentially invalid KV blocks"). No request the decode side served may be among
    those lines (the request sent to a dead peer is: nobody reads its blocks)."""
    assert pair_run.after is not None
    served = [rid for rid, done in pair_run.warmups.items() if done is not None]
    served += [*pair_run.sweep, pair_run.after.request_id]
    freed_first = [
        line for line in pair_run.lease_lines if any(f"{record_id(r)}-" in line for r in served)
    ]
    assert freed_first == []
