"""The ZMQ bridge: unmodified vLLM / SGLang KV events -> kvscope envelopes on Kafka.

One bridge subscribes to one or more engine PUB endpoints (e.g. one per DP rank), each
optionally with its replay endpoint. Every live frame goes through `SeqRepair` (gap
repair from the replay socket), is decoded with `decode_engine_batch` and published
through the Kafka publisher as a `KVEventBatch`.

Seq mapping (what makes completeness in ClickHouse honest): the bridge is the kvscope
publisher, so each bridge run and each engine run gets its own random epoch, and inside
an epoch every engine batch takes exactly one kvscope seq, in engine order: forwarded
as a `KVEventBatch`, or, when neither the live socket nor the replay ring has it,
covered by a `Gap` whose range has exactly as many seqs as engine batches were lost
and whose reason names the engine seqs (`replay_missing engine_seq=0-41`). A Gap record
takes one more seq of its own (as every kvscope Gap does). A restarted bridge reads
the next engine seq from its state file (`state_dir`) and asks the replay socket for
everything from there, so nothing still in the ring is lost and nothing is forwarded
twice.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import zmq
from kvscope.common.logs import throttle
from kvscope.publisher.bridge import state as bridge_state
from kvscope.publisher.bridge.frames import Frame, parse_live, parse_topic
from kvscope.publisher.bridge.metrics import FORWARDED, LOST, MALFORMED_MESSAGES, UNKNOWN_EVENTS
from kvscope.publisher.bridge.replay import ReplayClient
from kvscope.publisher.bridge.seq import Fetch, SeqRepair
from kvscope.publisher.bridge.state import BridgeState
from kvscope.schemas import (
    ENGINES,
    AnyBody,
    ConfigError,
    DecodeError,
    Engine,
    Gap,
    KVEventBatch,
    Role,
    Source,
    decode_engine_batch,
)

log = logging.getLogger(__name__)
throttle((__name__, ReplayClient.__module__, SeqRepair.__module__))
"""Per-frame warnings (undecodable or malformed frames, replay failures) once a minute each."""


@dataclass(frozen=True)
class Endpoint:
    """One engine publisher to subscribe to."""

    zmq: str
    """The engine's PUB endpoint, e.g. tcp://10.0.0.5:5557 (the bridge connects to it)."""
    replay: str | None = None
    """The engine's replay (ROUTER) endpoint; without it every gap is recorded as lost."""
    dp_rank: int | None = None
    """DP rank of this publisher when its batches do not carry one (default 0)."""


@dataclass(kw_only=True)
class BridgeConfig:
    """Settings of one `kvscope bridge` process."""

    engine: Engine = "vllm"
    """Payload dialect of the engine: vllm or sglang."""
    endpoints: Sequence[Endpoint] = ()
    """Publishers to subscribe to; at least one."""
    instance: str = ""
    """Instance name in the source; empty: from an llm-d topic, else the endpoint's host:port."""
    model: str = ""
    """Model name in the source; empty: from an llm-d topic `kv@<ip>:<port>@<model>`."""
    role: Role = "both"
    """prefill, decode or both."""
    engine_version: str = ""
    """Engine version put in the source, when known."""
    state_dir: str | None = None
    """Directory of the state file that lets a restarted bridge continue without loss."""
    keep_token_ids: bool = False
    """Forward token ids of stored blocks (counts are always kept)."""
    replay_timeout_s: float = 2.0
    """Give up on a replay answer after this long without a message."""
    rcvhwm: int = 100_000
    """ZMQ receive high-water mark of each subscription (messages)."""
    topic: str = ""
    """ZMQ topic prefix to subscribe to ("" = all)."""
    checkpoint_interval_s: float = 1.0
    """How often Kafka is flushed and the state file written (a crash repeats at most this)."""
    flush_timeout_s: float = 10.0
    """How long a checkpoint waits for Kafka."""

    def validate(self) -> BridgeConfig:
        """Fail fast on unusable settings (raises `ConfigError`)."""
        if self.engine not in ENGINES:
            raise ConfigError(f"engine {self.engine!r}: choose {' or '.join(ENGINES)}")
        if not self.endpoints:
            raise ConfigError("give at least one --zmq endpoint")
        for ep in self.endpoints:
            for url in (ep.zmq, ep.replay):
                if url is not None and not url.startswith(("tcp://", "ipc://", "inproc://")):
                    raise ConfigError(f"{url!r} is not a ZMQ endpoint (tcp://HOST:PORT)")
        for name in ("replay_timeout_s", "rcvhwm", "checkpoint_interval_s", "flush_timeout_s"):
            if not 0 < getattr(self, name) < math.inf:
                raise ConfigError(f"{name} must be a finite number > 0, got {getattr(self, name)}")
        if self.state_dir is not None:
            bridge_state.check(self.state_dir)
        return self


class PublisherForSource(Protocol):
    """What the bridge needs of the publisher of one source: a `kafka.SourcePublisher` fits."""

    epoch: int

    def publish(self, body: AnyBody, ts: float | None = None) -> None:
        """Publish one body with the next seq; a `Gap` body reserves and reports its count."""


PublisherFactory = Callable[[Source], PublisherForSource]
"""`KafkaPublisher.for_source`: a handle for one source under a new random epoch."""


class EndpointLink:
    """Forwards one endpoint's repaired stream: decode, wrap, publish, remember the position."""

    def __init__(
        self,
        config: BridgeConfig,
        endpoint: Endpoint,
        publishers: PublisherFactory,
        state: BridgeState,
    ) -> None:
        """Resumes after the last engine seq a previous run of the bridge forwarded."""
        self._config = config
        self._endpoint = endpoint
        self._publishers = publishers
        self._state = state
        saved = state.get(endpoint.zmq)
        self.start_seq = saved if saved is not None else 0
        """The engine seq the bridge wants first (0, or the one after the last forwarded)."""
        self._pub: PublisherForSource | None = None
        self._held: list[Gap] = []
        """Gaps reported before the epoch's first batch, held until a batch names the DP rank
        of the source (`forward`) or none follows (`settle`)."""
        self._topic = ""
        self.forwarded = 0
        """Batches forwarded since start."""
        self.lost_batches = 0
        """Engine batches reported lost since start."""
        self._forwarded_metric = FORWARDED.labels(endpoint.zmq)

    @property
    def url(self) -> str:
        """The engine PUB endpoint this link forwards."""
        return self._endpoint.zmq

    def see_topic(self, topic: str) -> None:
        """Remember the engine's topic (it may name instance and model, llm-d style).

        vLLM 0.32 and SGLang 0.5.23 send it on live and replay frames, older releases only
        on live ones: give their bridges --instance/--model when their first records may
        come from the replay ring.
        """
        if topic:
            self._topic = topic

    def fetch_with(self, replay: ReplayClient) -> Fetch:
        """`replay.fetch`, noting the topic the answer carries before anything is published."""

        def fetch(start_seq: int) -> list[Frame] | None:
            frames = replay.fetch(start_seq)
            if frames:
                self.see_topic(frames[0].topic)
            return frames

        return fetch

    def forward(self, frame: Frame) -> None:
        """Decode and publish one engine batch (it takes the next kvscope seq)."""
        try:
            batch, unknown = decode_engine_batch(
                frame.payload, self._config.engine, keep_token_ids=self._config.keep_token_ids
            )
        except DecodeError as exc:
            log.warning("engine seq %d from %s undecodable: %s", frame.seq, self._endpoint.zmq, exc)
            self.lost(frame.seq, frame.seq, "undecodable")
            return
        if unknown:
            log.warning(
                "engine seq %d from %s: skipped %d events of unknown types %.200s",
                frame.seq,
                self._endpoint.zmq,
                len(unknown),
                sorted(set(unknown)),
            )
            UNKNOWN_EVENTS.labels(self._endpoint.zmq).inc(len(unknown))
        publisher = self._publisher(batch)
        self._release(publisher)
        publisher.publish(batch, ts=batch.ts)
        self.forwarded += 1
        self._forwarded_metric.inc()
        self._state.set(self._endpoint.zmq, frame.seq + 1)

    def lost(self, first_seq: int, last_seq: int, reason: str) -> None:
        """Publish a Gap: one kvscope seq per lost engine batch, the engine range in the reason.

        Before the epoch's first batch (and without a configured DP rank) the Gap is held:
        the next batch names the DP rank of the source, `settle` publishes it if none came.
        A jump of more than `MAX_LOST_BATCHES` engine seqs is no loss an engine can have
        (its replay ring holds thousands): it is taken as an engine restart (a new epoch),
        since a Gap that large would push kvscope's seq past what can be encoded.
        """
        count = last_seq - first_seq + 1
        if count > MAX_LOST_BATCHES:
            log.warning(
                "engine seq jumped by %d from %s: taken as an engine restart (new epoch)",
                count,
                self._endpoint.zmq,
            )
            LOST.labels(self._endpoint.zmq, "seq_jump").inc()
            self.restart()
            self._state.set(self._endpoint.zmq, last_seq + 1)
            return
        gap = Gap(first_seq=0, last_seq=count - 1, reason=gap_reason(reason, first_seq, last_seq))
        if self._pub is None and self._endpoint.dp_rank is None:
            self._held.append(gap)  # the source's DP rank comes from the next batch
        else:
            self._publisher(None).publish(gap)
        self.lost_batches += count
        LOST.labels(self._endpoint.zmq, reason).inc(count)
        self._state.set(self._endpoint.zmq, last_seq + 1)

    def settle(self) -> None:
        """Publish the held Gaps when no batch followed them (source: the endpoint's DP rank)."""
        if self._held:
            self._release(self._publisher(None))

    def restart(self) -> None:
        """The engine restarted: the next batch opens a new epoch."""
        self.settle()
        self._pub = None

    def _release(self, publisher: PublisherForSource) -> None:
        for gap in self._held:
            publisher.publish(gap)
        self._held.clear()

    def _publisher(self, batch: KVEventBatch | None) -> PublisherForSource:
        if self._pub is None:
            source = self._source(batch)
            self._pub = self._publishers(source)
            log.info(
                "forwarding %s as %s/%d, epoch %d",
                self._endpoint.zmq,
                source.instance,
                source.dp_rank,
                self._pub.epoch,
            )
        return self._pub

    def _source(self, batch: KVEventBatch | None) -> Source:
        config = self._config
        parsed = parse_topic(self._topic)
        instance = config.instance or (parsed.instance if parsed else "")
        if not instance:
            instance = self._endpoint.zmq.split("://", 1)[-1]
        dp_rank = batch.dp_rank if batch is not None else None
        if dp_rank is None:
            dp_rank = self._endpoint.dp_rank or 0
        return Source(
            instance=instance,
            model=config.model or (parsed.model if parsed else ""),
            role=config.role,
            dp_rank=dp_rank,
            engine=config.engine,
            engine_version=config.engine_version,
        )


FINAL_DRAIN_S = 2.0
"""Longest time a stopping bridge keeps reading what its engines sent before the stop."""
FINAL_QUIET_MS = 100
"""A subscription this long without a message is drained."""

MAX_LOST_BATCHES = 2**32
"""Most engine batches one Gap may report (beyond: an engine restart, see `lost`)."""


def gap_reason(reason: str, first_seq: int, last_seq: int) -> str:
    """A Gap reason naming the exact engine seqs lost: `replay_missing engine_seq=0-41`."""
    return f"{reason} engine_seq={first_seq}-{last_seq}"


class Bridge:
    """Subscribes to every configured endpoint and forwards until stopped.

    `run()` blocks (the CLI); `start()`/`stop()` run it on a named thread (tests, embedding).
    The caller owns the Kafka publisher and flushes/shuts it down after `stop()`.
    """

    def __init__(
        self,
        config: BridgeConfig,
        publishers: PublisherFactory,
        flush: Callable[[float], bool] | None = None,
    ) -> None:
        """`flush(timeout_s)`: deliver everything published so far, True on success.

        It is called at each checkpoint (`checkpoint_interval_s`) and on stop; the state
        file is written only after it succeeded. Sockets are opened by `run()`.
        """
        self.config = config.validate()
        self._publishers = publishers
        self._flush = flush
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self.state = BridgeState(config.state_dir)
        self.links: dict[str, EndpointLink] = {}

    def start(self) -> Bridge:
        """Run the bridge on a background thread; returns once it has subscribed."""
        self._thread = threading.Thread(target=self.run, name="kvscope-bridge", daemon=True)
        self._thread.start()
        self._ready.wait(10)
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        """Ask `run()` to finish and wait for it (safe before `start()`)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None

    def run(self) -> None:
        """Subscribe, then forward every frame until `stop()`; saves the state on the way out."""
        context: zmq.SyncContext = zmq.Context.instance()
        poller = zmq.Poller()
        sockets: dict[zmq.SyncSocket, tuple[EndpointLink, SeqRepair]] = {}
        for endpoint in self.config.endpoints:
            link = EndpointLink(self.config, endpoint, self._publishers, self.state)
            replay = (
                ReplayClient(context, endpoint.replay, self.config.replay_timeout_s)
                if endpoint.replay
                else None
            )
            fetch = link.fetch_with(replay) if replay else None
            repair = SeqRepair(link, fetch, next_seq=link.start_seq)
            sub = context.socket(zmq.SUB)
            sub.setsockopt(zmq.RCVHWM, self.config.rcvhwm)
            sub.setsockopt(zmq.LINGER, 0)
            sub.setsockopt(zmq.SUBSCRIBE, self.config.topic.encode())
            sub.connect(endpoint.zmq)
            poller.register(sub, zmq.POLLIN)
            sockets[sub] = (link, repair)
            self.links[endpoint.zmq] = link
            log.info(
                "bridge subscribed to %s (replay %s), expecting engine seq %d",
                endpoint.zmq,
                endpoint.replay,
                link.start_seq,
            )
        for link, repair in sockets.values():
            repair.catch_up()  # what the engine published while no bridge ran
            link.settle()
        self._ready.set()
        try:
            next_checkpoint = time.monotonic() + self.config.checkpoint_interval_s
            while not self._stop.is_set():
                for sock, _ in poller.poll(100):
                    link, repair = sockets[sock]
                    self._drain(sock, link, repair)
                if time.monotonic() >= next_checkpoint:
                    self.checkpoint()
                    next_checkpoint = time.monotonic() + self.config.checkpoint_interval_s
        finally:
            if self._stop.is_set():  # a clean stop: forward what the engines already sent
                self._drain_rest(sockets)
            for sock in sockets:
                sock.close()
            self.checkpoint()
            log.info(
                "bridge stopped: %s",
                ", ".join(
                    f"{k} forwarded {v.forwarded} lost {v.lost_batches}"
                    for k, v in self.links.items()
                ),
            )

    def checkpoint(self) -> bool:
        """Flush Kafka, then save the positions taken before the flush; False if it failed."""
        positions = self.state.snapshot()
        if self._flush is not None and not self._flush(self.config.flush_timeout_s):
            log.warning("Kafka flush timed out: bridge state not saved this time")
            return False
        return self.state.save(positions)

    def _drain_rest(self, sockets: dict[zmq.SyncSocket, tuple[EndpointLink, SeqRepair]]) -> None:
        """After `stop()`: handle what waits on each subscription, until it is quiet.

        Nothing an engine sends after its last batch could reveal that batch as lost, so a
        bridge stopped right after the engine (the sidecar's shutdown order) reads it here.
        Bounded by `FINAL_DRAIN_S` in all, for an engine that keeps publishing.
        """
        deadline = time.monotonic() + FINAL_DRAIN_S
        for sock, (link, repair) in sockets.items():
            while time.monotonic() < deadline and sock.poll(FINAL_QUIET_MS):
                self._drain(sock, link, repair, deadline)

    def _drain(
        self,
        sock: zmq.SyncSocket,
        link: EndpointLink,
        repair: SeqRepair,
        deadline: float | None = None,
    ) -> None:
        """Handle every message waiting on one subscription (until `stop()`, or `deadline`)."""
        while (time.monotonic() < deadline) if deadline is not None else not self._stop.is_set():
            try:
                message = sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            try:
                frame = parse_live(message)
            except ValueError as exc:
                log.warning("ignoring malformed message from %s: %s", link.url, exc)
                MALFORMED_MESSAGES.labels(link.url).inc()
                continue
            link.see_topic(frame.topic)
            repair.on_live(frame)
            link.settle()
