"""A real in-process vLLM engine with kvscope's plugin -> Kafka -> collector -> ClickHouse.

The engine runs in its own Python process (vLLM reads its environment at import and loads
plugins once per process) in in-process mode: scheduler and front end in one process.
The plugin is loaded by vLLM from kvscope's entry point; `KvscopeStatLogger` is passed as
`stat_loggers=[...]`. Checked against what vLLM published on ZMQ and its own counters.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from support.e2e_support import collect
from support.vllm_e2e import assert_same_blocks_as_zmq, distinct, plugin_env, run_engine


@pytest.mark.vllm
def test_in_process_engine_publishes_exactly_what_vllm_published(
    tiny_llama: Path,
    tmp_path: Path,
    bootstrap_servers: str,
    topic_prefix: str,
    clickhouse: Any,
    clickhouse_url: str,
) -> None:
    env = plugin_env(bootstrap_servers, topic_prefix, "pod-a:8000", stats_interval_s="0.001")
    capture, truth = run_engine(tiny_llama, tmp_path, env)

    collect(clickhouse, clickhouse_url, bootstrap_servers, topic_prefix)
    assert_same_blocks_as_zmq(clickhouse, capture)

    counters = truth["counters"]
    assert counters["vllm:prefix_cache_hits"] > 0
    totals = clickhouse.query(
        "SELECT sum(prefix_queries), sum(prefix_hits), sum(preemptions), count() FROM engine_stats"
    ).result_rows[0]
    assert totals[:3] == (
        counters["vllm:prefix_cache_queries"],
        counters["vllm:prefix_cache_hits"],
        counters["vllm:num_preemptions"],
    )
    assert totals[3] >= 10, "a 1 ms interval gives a snapshot for almost every engine step"
    assert distinct(clickhouse, "engine_stats", "capacity_blocks, block_size") == [(12, 32)]

    requests = clickhouse.query(
        "SELECT request_id, prompt_tokens, cached_tokens, output_tokens FROM requests"
        " ORDER BY request_id"
    ).result_rows
    assert {r[0]: list(r[1:]) for r in requests} == truth["requests"]
    assert len(requests) == len(truth["requests"]) == 8
    assert any(cached > 0 for _, _, cached, _ in requests)

    source = ("pod-a:8000", str(tiny_llama), 0, "vllm")
    columns = "instance, model, dp_rank, engine"
    for table in ("kv_block_events", "engine_stats", "requests"):
        assert distinct(clickhouse, table, columns) == [source]
    assert clickhouse.query("SELECT count() FROM stream_gaps").result_rows == [(0,)]
