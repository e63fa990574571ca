"""Hostile engines and misconfigured bridges (issue 17), with the real broker and publisher.

- An engine seq jumping to near 2^64 made a Gap whose kvscope seqs could not be encoded,
  retried forever: now it opens a new epoch and every record stays encodable.
- 3,000 undecodable frames made 3,000 Prometheus label values and 3,000 WARNING lines.
- `--metrics-url http://u:secret@host/metrics` logged the password and used it in the
  instance name; scraped bodies and replay answers had no size limit.
"""

from __future__ import annotations

import base64
import contextlib
import http.server
import logging
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import msgspec
import pytest
import zmq
from kvscope.publisher import KafkaPublisher, PublisherConfig
from kvscope.publisher.bridge.frames import Frame
from kvscope.publisher.bridge.loop import Bridge, BridgeConfig, Endpoint, EndpointLink
from kvscope.publisher.bridge.replay import ReplayClient
from kvscope.publisher.bridge.scrape import MetricsScraper
from kvscope.publisher.bridge.state import BridgeState
from kvscope.schemas import Gap, topic_for
from prometheus_client import REGISTRY
from support.e2e_support import wait_for
from support.publisher_readback import consume

BATCH = msgspec.msgpack.encode([1_700_000_000.0, [["BlockRemoved", [7], None]], 0])


@pytest.fixture
def kafka(bootstrap_servers: str, topic_prefix: str) -> Iterator[KafkaPublisher]:
    publisher = KafkaPublisher(
        PublisherConfig(bootstrap_servers=bootstrap_servers, topic_prefix=topic_prefix, linger_ms=2)
    )
    yield publisher
    publisher.shutdown(5)


def _link(kafka: KafkaPublisher, zmq_url: str) -> EndpointLink:
    config = BridgeConfig(engine="vllm", endpoints=[Endpoint(zmq=zmq_url)], instance="hostile")
    return EndpointLink(config, config.endpoints[0], kafka.for_source, BridgeState(None))


@pytest.mark.parametrize("jump_to", [2**32 + 10, 2**63, 2**64 - 1])
def test_an_engine_seq_jump_near_2_64_opens_a_new_epoch(
    jump_to: int, kafka: KafkaPublisher, bootstrap_servers: str, topic_prefix: str
) -> None:
    link = _link(kafka, f"tcp://jump-{jump_to}:1")
    link.forward(Frame(0, "", BATCH))
    link.lost(1, jump_to - 1, "replay_missing")
    link.forward(Frame(jump_to, "", BATCH))
    assert kafka.flush(10)
    records = consume(
        bootstrap_servers, [topic_for("kv-events", topic_prefix)], lambda r: len(r) >= 2
    )
    assert len(records) == 2
    assert not any(isinstance(r.envelope.body, Gap) for r in records)
    assert records[0].envelope.epoch != records[1].envelope.epoch
    assert [r.envelope.seq for r in records] == [0, 0]


def test_undecodable_frames_make_one_label_and_one_warning(
    kafka: KafkaPublisher, caplog: pytest.LogCaptureFixture
) -> None:
    url = "tcp://undecodable:1"
    link = _link(kafka, url)
    with caplog.at_level(logging.WARNING):
        for seq in range(3_000):
            link.forward(Frame(seq, "", b"\xc1 not msgpack"))
    assert kafka.flush(10)
    lost = [
        s
        for metric in REGISTRY.collect()
        if metric.name == "kvscope_bridge_lost_batches"
        for s in metric.samples
        if s.labels.get("endpoint") == url and s.name.endswith("_total")
    ]
    assert [(s.labels["reason"], s.value) for s in lost] == [("undecodable", 3000.0)]
    assert sum("undecodable" in r.getMessage() for r in caplog.records) == 1


class _Metrics(http.server.BaseHTTPRequestHandler):
    body: ClassVar[bytes] = b""
    seen_auth: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        """Answer every GET with `body`, remembering the Authorization header."""
        type(self).seen_auth.append(self.headers.get("Authorization", ""))
        self.send_response(200)
        self.end_headers()
        # the scraper stops reading at its limit
        with contextlib.suppress(ConnectionResetError, BrokenPipeError):
            self.wfile.write(type(self).body)

    def log_message(self, *args: object) -> None:
        """Quiet."""


@pytest.fixture
def metrics_server() -> Iterator[tuple[str, type[_Metrics]]]:
    handler = type("Handler", (_Metrics,), {"seen_auth": [], "body": b""})
    server = http.server.HTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.server_port}", handler
    server.shutdown()


def test_metrics_url_password_is_sent_not_logged(
    metrics_server: tuple[str, type[_Metrics]], caplog: pytest.LogCaptureFixture
) -> None:
    hostport, handler = metrics_server
    handler.body = b"vllm:num_requests_running 3\n"
    with caplog.at_level(logging.INFO):
        scraper = MetricsScraper(f"http://al%40ce:s3cr%3At@{hostport}/metrics", lambda m: None)
        scraper.scrape_once()
        scraper.start()
        scraper.stop()
    assert handler.seen_auth[0] == "Basic " + base64.b64encode(b"al@ce:s3cr:t").decode()
    assert scraper.url == f"http://{hostport}/metrics"
    assert all("s3cr" not in r.getMessage() for r in caplog.records)
    assert any(hostport in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("size", [17 * 1024 * 1024, 64 * 1024 * 1024])
def test_a_huge_metrics_body_fails_the_scrape(
    size: int, metrics_server: tuple[str, type[_Metrics]]
) -> None:
    hostport, handler = metrics_server
    handler.body = b"#" * size
    with pytest.raises(ValueError, match="body over"):
        MetricsScraper(f"http://{hostport}/metrics", lambda m: None).scrape_once()


def test_a_replay_answer_over_the_limit_is_dropped(tmp_path: Path) -> None:
    context = zmq.Context.instance()
    url = f"ipc://{tmp_path}/replay"
    router = context.socket(zmq.ROUTER)
    router.bind(url)

    def answer() -> None:
        identity, _, _ = router.recv_multipart()
        for seq in range(50):
            router.send_multipart([identity, b"", seq.to_bytes(8, "big"), BATCH])
        router.send_multipart([identity, b"", (-1).to_bytes(8, "big", signed=True), b""])

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    try:
        assert ReplayClient(context, url, max_batches=20).fetch(0) is None
    finally:
        thread.join(5)
        router.close(0)


def _samples(name: str, url: str) -> float:
    return sum(
        s.value
        for metric in REGISTRY.collect()
        if metric.name == name
        for s in metric.samples
        if s.labels.get("endpoint") == url and s.name.endswith("_total")
    )


def test_malformed_live_messages_are_counted_and_skipped(tmp_path: Path) -> None:
    """Wrong frame counts and seq lengths on the PUB socket: counted, never forwarded."""
    url = f"ipc://{tmp_path}/pub"
    forwarded: list[object] = []

    class Recorder:
        epoch = 1

        def publish(self, body: object, ts: float | None = None) -> None:
            """Keep what the bridge forwards."""
            forwarded.append(body)

    pub = zmq.Context.instance().socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    pub.bind(url)
    config = BridgeConfig(engine="vllm", endpoints=[Endpoint(zmq=url)], instance="i")
    bridge = Bridge(config, lambda source: Recorder()).start()
    try:
        seq0 = (0).to_bytes(8, "big")
        malformed = [[b""], [b"", seq0], [b"", seq0, BATCH, b"x"], [b"", b"\x00" * 4, BATCH]]
        wait_for(lambda: pub.send_multipart([b"", seq0, BATCH]) or forwarded, what="subscribed")
        for message in malformed:
            pub.send_multipart(message)
        pub.send_multipart([b"", (1).to_bytes(8, "big"), BATCH])
        wait_for(lambda: bridge.state.get(url) == 2, what="seq 1 forwarded")
    finally:
        bridge.stop()
        pub.close()
    assert _samples("kvscope_bridge_malformed_messages", url) == len(malformed)
    assert _samples("kvscope_bridge_lost_batches", url) == 0
    assert {type(b).__name__ for b in forwarded} == {"KVEventBatch"}
