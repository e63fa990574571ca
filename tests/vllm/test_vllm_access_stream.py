"""The access stream of a real vLLM engine, and its last EngineStats at shutdown.

The in-process engine of `plugin_engine_proc.py` (8 requests with shared prefixes,
evictions from a 12-block cache, a prefix-cache reset) runs with kvscope's plugin and
stat logger on defaults (the access stream is on) and a stats interval longer than the
run, so the only EngineStats is the one published at shutdown, after vLLM's engine core
has stopped. Checked against what vLLM itself published on ZMQ and its own per-request
`num_cached_tokens`. Three of the requests end exactly on a block boundary (prompt plus 8
output tokens a multiple of 32): the block their last sampled token fills is never cached,
so their access must not name it.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from kvscope.analytics.queries import run_query
from kvscope.analytics.whatif import load_accesses
from kvscope.cachemodel.access_replay import replay
from kvscope.cachemodel.whatif import REAL_ENGINE_ERROR_PP
from support.e2e_support import collect
from support.vllm_e2e import distinct, plugin_env, run_engine

FAR = {"since": "1970-01-01 00:00:00", "until": "2100-01-01 00:00:00"}


@pytest.mark.vllm
def test_one_access_per_request_with_vllms_hashes_and_hits(
    tiny_llama: Path,
    tmp_path: Path,
    bootstrap_servers: str,
    topic_prefix: str,
    clickhouse: Any,
    clickhouse_url: str,
) -> None:
    env = plugin_env(bootstrap_servers, topic_prefix, "pod-a:8000", stats_interval_s="3600")
    capture, truth = run_engine(tiny_llama, tmp_path, env)
    collect(clickhouse, clickhouse_url, bootstrap_servers, topic_prefix)

    # the shutdown defect: the one EngineStats comes after the engine core stopped
    assert distinct(clickhouse, "engine_stats", "capacity_blocks, block_size") == [(12, 32)]
    assert clickhouse.query("SELECT count() FROM engine_stats").result_rows == [(1,)]

    rows = clickhouse.query(
        "SELECT request_id, prompt_tokens, block_size, hit_blocks, held_blocks, block_hashes,"
        " arrival_ts, lookup_ts, free_ts FROM kv_accesses ORDER BY seq"
    ).result_rows
    requests = truth["requests"]  # request id -> [prompt tokens, num_cached_tokens, output]
    assert sorted(r[0] for r in rows) == sorted(requests)
    assert len(rows) == len(requests) == 8
    zmq_stored = [h for kind, h in capture.block_rows() if kind == "stored"]
    published: set[int] = set()
    for request_id, prompt, bs, hit_blocks, held, hashes, arrival, lookup, free in rows:
        prompt_tokens, cached_tokens, output_tokens = requests[request_id]
        assert (prompt, bs) == (prompt_tokens, 32)
        assert hit_blocks * bs == cached_tokens, request_id
        # no KV is computed for the last sampled token: a block it would fill is not cached
        assert len(hashes) == (prompt + output_tokens - 1) // bs, request_id
        assert set(hashes) <= set(zmq_stored), "every published block is one vLLM stored"
        assert math.ceil(prompt / bs) <= held <= math.ceil((prompt + output_tokens) / bs)
        assert arrival <= lookup <= free
        published.update(hashes)
    assert set(zmq_stored) <= published, "every stored block belongs to a request's access"
    boundary = [r for r in requests.values() if (r[0] + r[2]) % 32 == 0]
    assert boundary, "some request's prompt and output end on a block boundary"
    assert any(r[3] for r in rows), "the workload has prefix hits"

    source = ("pod-a:8000", str(tiny_llama), 0, "vllm")
    for table in ("kv_block_events", "engine_stats", "kv_accesses"):
        assert distinct(clickhouse, table, "instance, model, dp_rank, engine") == [source]
    assert clickhouse.query("SELECT count() FROM stream_gaps").result_rows == [(0,)]

    # replayed at the engine's own capacity, the accesses give the engine's own hits (the
    # prefix-cache reset placed where vLLM performed it, not where its batch was stamped)
    accesses, clears = load_accesses(
        lambda name, params: run_query(clickhouse, name, params),
        {**FAR, "instance": "", "model": ""},
    )
    replayed = replay(accesses, {"pod-a:8000/0": 12}, "fixed", clears)["pod-a:8000/0"]
    assert replayed.hits == sum(r[1] for r in requests.values())
    assert replayed.queries == sum(r[0] for r in requests.values())

    what_if = run_query(clickhouse, "capacity_what_if", {**FAR, "fractions": [0.5, 1.0]})
    assert {r["method"] for r in what_if} == {"access-replay"}
    assert {r["error_pp"] for r in what_if} == {REAL_ENGINE_ERROR_PP["access-replay"]}
    assert {r["error_basis"] for r in what_if} == {"real-engines"}
    assert {int(r["capacity_blocks"]) for r in what_if} == {12}
