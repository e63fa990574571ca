"""A real Prometheus scrapes a running collector, bridge and publisher; the rules work on it.

Everything is real and on loopback: the local broker, `kvscope collect` (into chDB),
`kvscope bridge` subscribed to a ZMQ PUB socket this test drives with vLLM-shaped frames
(with a hole in the engine's seq, so the bridge records a loss), and an engine stand-in
running kvscope's publisher and TransferTimer (tests/support/metrics_engine.py). A garbage
record makes the collector write an ingest error. Prometheus (Debian's package) loads
docker/prometheus/kvscope.rules.yml and scrapes the three every second. Then, through
Prometheus's HTTP API: every metric the rules read has series carrying every label the
rules use; every recording rule produces series; every rule evaluates without error; every
Prometheus panel of the Grafana dashboards evaluates. Bounded by DEADLINE_S.
"""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
import zmq
from aiokafka import AIOKafkaProducer
from kvscope.publisher.bridge.frames import encode_seq
from kvscope.schemas.streams import topic_for
from support.collector_testkit import SESSION_TIMEOUT_MS
from support.deploy_files import (
    DOCKER,
    RULES,
    SCRAPE_LABELS,
    exposed_metrics,
    grouping_labels,
    matcher_labels,
    metric_names,
    recorded_names,
    required_tool,
    rules,
)

DEADLINE_S = 120.0
SUPPORT = Path(__file__).resolve().parents[2] / "support"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _api(base: str, path: str, **params: str) -> Any:
    url = f"{base}/api/v1/{path}?{urllib.parse.urlencode(params)}"
    with urllib.request.urlopen(url, timeout=10) as answer:
        body = json.load(answer)
    assert body["status"] == "success", body
    return body["data"]


def _wait(what: str, check: Callable[[], Any], deadline: float) -> None:
    """Call `check` until it returns None (done); it returns what is still missing."""
    missing: Any = "not checked yet"
    while time.monotonic() < deadline:
        try:
            missing = check()
        except (OSError, AssertionError) as exc:
            missing = exc
        if missing is None:
            return
        time.sleep(0.5)
    pytest.fail(f"{what}: not reached within {DEADLINE_S:.0f} s; missing: {missing!r}")


def _kvscope(*args: str, log: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "kvscope.cli", *args],
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
    )


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _frame_payload(i: int) -> bytes:
    """A vLLM-shaped KV-event batch (map form): a store, then a removal."""
    return msgspec.msgpack.encode(
        {
            "ts": 1_700_000_000.0 + i,
            "events": [
                {"type": "BlockStored", "block_hashes": [1000 + i], "block_size": 16},
                {"type": "BlockRemoved", "block_hashes": [1000 + i]},
            ],
        }
    )


@pytest.fixture
def stack(bootstrap_servers: str, topic_prefix: str, tmp_path: Path) -> Iterator[dict]:
    """Collector, bridge and engine stand-in running; their metrics ports and a ZMQ PUB."""
    ports = {name: _free_port() for name in ("collector", "bridge", "engine", "dead")}
    pub_url = f"ipc://{tmp_path}/kv-events"
    context = zmq.Context.instance()
    pub = context.socket(zmq.PUB)
    pub.bind(pub_url)
    procs = [
        _kvscope(
            "collect",
            f"--bootstrap-servers={bootstrap_servers}",
            f"--clickhouse=chdb://{tmp_path}/chdb?database=scrape",
            f"--topic-prefix={topic_prefix}",
            f"--group=scrape-{tmp_path.name}",
            f"--session-timeout-ms={SESSION_TIMEOUT_MS}",
            f"--metrics-port={ports['collector']}",
            log=tmp_path / "collector.log",
        ),
        _kvscope(
            "bridge",
            f"--zmq={pub_url}",
            "--instance=engine-z",
            "--model=m",
            f"--bootstrap-servers={bootstrap_servers}",
            f"--topic-prefix={topic_prefix}",
            f"--prometheus-port={ports['bridge']}",
            log=tmp_path / "bridge.log",
        ),
    ]
    engine = subprocess.Popen(
        [
            sys.executable,
            str(SUPPORT / "metrics_engine.py"),
            bootstrap_servers,
            topic_prefix,
            str(ports["engine"]),
            str(ports["dead"]),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=(tmp_path / "engine.log").open("w"),
        text=True,
    )
    try:
        assert engine.stdout is not None and engine.stdout.readline().strip() == "ready"
        yield {"ports": ports, "pub": pub, "logs": tmp_path}
    finally:
        if engine.stdin is not None:
            engine.stdin.close()
        for proc in [engine, *procs]:
            _stop(proc)
        pub.close(linger=0)


@pytest.fixture
def prometheus(stack: dict, tmp_path: Path) -> Iterator[str]:
    """A real Prometheus on loopback scraping the stack every second with kvscope's rules."""
    binary = required_tool("prometheus", "apt-get install prometheus")
    port = _free_port()
    ports = stack["ports"]
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(RULES)],
        "scrape_configs": [
            {"job_name": job, "static_configs": [{"targets": [f"127.0.0.1:{ports[name]}"]}]}
            for job, name in (
                ("kvscope-collector", "collector"),
                ("kvscope-bridge", "bridge"),
                ("kvscope-engine", "engine"),
            )
        ],
    }
    config_path = tmp_path / "prometheus.yml"
    config_path.write_text(json.dumps(config))  # JSON is YAML
    proc = subprocess.Popen(
        [
            binary,
            f"--config.file={config_path}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
        ],
        stdout=(tmp_path / "prometheus.log").open("w"),
        stderr=subprocess.STDOUT,
    )
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        _stop(proc)


async def _send_garbage(bootstrap_servers: str, topic: str) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap_servers)
    await producer.start()
    try:
        await producer.send_and_wait(topic, b"not msgpack at all", key=b"garbage")
    finally:
        await producer.stop()


def test_prometheus_scrapes_every_series_the_rules_use(
    stack: dict, prometheus: str, bootstrap_servers: str, topic_prefix: str
) -> None:
    deadline = time.monotonic() + DEADLINE_S
    asyncio.run(_send_garbage(bootstrap_servers, topic_for("kv-events", topic_prefix)))
    pub = stack["pub"]
    sent = {"seq": 0}

    def bridge_forwarded() -> str | None:
        # Until the bridge's subscription is up, PUB drops frames (as for a late bridge).
        pub.send_multipart([b"kv-events", encode_seq(sent["seq"]), _frame_payload(sent["seq"])])
        sent["seq"] += 1
        result = _api(prometheus, "query", query="sum(kvscope_bridge_forwarded_batches_total)")
        done = bool(result["result"]) and float(result["result"][0]["value"][1]) > 0
        return None if done else "no forwarded batch scraped"

    _wait("the bridge forwards frames", bridge_forwarded, deadline)
    hole = sent["seq"] + 5  # seqs the bridge never sees, and no replay socket to ask
    pub.send_multipart([b"kv-events", encode_seq(hole), _frame_payload(hole)])

    exposed = exposed_metrics()
    wanted: dict[str, set[str]] = {}
    for rule in rules():
        raw = {m for m in metric_names(rule["expr"]) if m in exposed}
        labels = grouping_labels(rule["expr"]) - SCRAPE_LABELS - {"le"}
        for metric in raw:
            wanted.setdefault(metric, set()).update(labels & exposed[metric])
        for metric, matched in matcher_labels(rule["expr"]).items():
            wanted.setdefault(metric, set()).update(matched)

    def missing_series() -> dict[str, str] | None:
        missing = {}
        for metric, labels in sorted(wanted.items()):
            series = _api(prometheus, "series", **{"match[]": metric})
            have = set().union(*(set(s) for s in series)) if series else set()
            if not series or not labels <= have:
                missing[metric] = f"labels {sorted(labels - have)}" if series else "no series"
        return missing or None

    _wait("every metric the rules read, with its labels", missing_series, deadline)
    for job in ("kvscope-collector", "kvscope-bridge", "kvscope-engine"):
        up = _api(prometheus, "query", query=f'up{{job="{job}"}}')["result"]
        assert [r["value"][1] for r in up] == ["1"], job

    def recorded_everywhere() -> list[str] | None:
        absent = [
            name
            for name in sorted(recorded_names())
            if not _api(prometheus, "query", query=name)["result"]
        ]
        return absent or None

    _wait("every recording rule has series", recorded_everywhere, deadline)

    groups = _api(prometheus, "rules")["groups"]
    evaluated = {r["name"]: r for g in groups for r in g["rules"]}
    assert set(evaluated) == {r.get("record") or r["alert"] for r in rules()}
    assert {n: r["health"] for n, r in evaluated.items() if r["health"] != "ok"} == {}

    for path in sorted((DOCKER / "grafana" / "dashboards").glob("*.json")):
        for panel in json.loads(path.read_text())["panels"]:
            for target in panel["targets"]:
                if "expr" in target:
                    _api(prometheus, "query", query=target["expr"])
