"""A Kafka fault injector: a TCP proxy in front of the real broker that refuses on demand.

The local broker (Tansu) accepts every record kvscope can produce, and a real broker
cannot be made to refuse a write on demand (in production that happens when, say, an
operator revokes the producer's write ACL). This proxy stands in for that moment and
nothing else: it forwards every Kafka request to the real broker and every answer back,
except that while `refusing` it answers each Produce request (api_key 0) itself with
TOPIC_AUTHORIZATION_FAILED for every partition, an error aiokafka does not retry, so
the send fails at once. It rewrites the broker addresses in Metadata answers to its own,
so the client keeps talking through it after the bootstrap.

While `down()` it also closes every client connection at once, as a broker that is not
running would: a test restarting a memory-storage broker recreates its topics before the
client can reach it again (`up()`), as a real Kafka's topics would have survived.

It leaves evidence: every record it refused, decoded from the request's record batches
(`refused()`), so a test can compare what the publisher reports lost with what was
really refused. Only non-flexible request versions are handled (aiokafka's Produce goes
up to v7 and Metadata up to v5, both non-flexible).
"""

from __future__ import annotations

import asyncio
import struct
import threading
from dataclasses import dataclass
from io import BytesIO
from typing import Any

from aiokafka.errors import TopicAuthorizationFailedError
from aiokafka.protocol import metadata, produce
from aiokafka.record.memory_records import MemoryRecords

_PRODUCE = 0
_METADATA = 3
_SIZE = struct.Struct(">i")
_HEADER = struct.Struct(">hhi")  # api_key, api_version, correlation_id


@dataclass(frozen=True)
class RefusedRecord:
    """One record of a refused Produce request: where it was going and its bytes."""

    topic: str
    partition: int
    key: bytes | None
    value: bytes | None


class RefusingProxy:
    """Forwards Kafka traffic to `upstream` ("host:port"); refuses writes or connections.

    Runs its own event loop on a daemon thread; `start()` returns once it listens on a
    free loopback port (`bootstrap_servers`), `stop()` closes it. `refuse()` and
    `accept()` switch the write fault on and off from any thread (decided per Produce
    request when it arrives; `hold()` and `release()` delay the refusals), `down()` and
    `up()` the connection fault.
    """

    def __init__(self, upstream: str) -> None:
        host, port = upstream.rsplit(":", 1)
        self._upstream = (host, int(port))
        self._refusing = threading.Event()
        self._down = threading.Event()
        self._holding = threading.Event()
        self._held: list[tuple[asyncio.Future[bytes], bytes]] = []
        self._lock = threading.Lock()
        self._refused: list[RefusedRecord] = []
        self._requests_refused = 0
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self.port = 0

    @property
    def bootstrap_servers(self) -> str:
        """The `host:port` a client uses to go through the proxy."""
        return f"127.0.0.1:{self.port}"

    def start(self) -> RefusingProxy:
        """Listen on a free loopback port and serve until `stop()`."""
        self._thread.start()
        future = asyncio.run_coroutine_threadsafe(self._listen(), self._loop)
        self.port = future.result(10)
        return self

    def stop(self) -> None:
        """Close the listener and every connection, and end the loop thread."""
        if self._server is not None:
            asyncio.run_coroutine_threadsafe(self._close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def refuse(self) -> None:
        """From now on answer every Produce request with TOPIC_AUTHORIZATION_FAILED."""
        self._refusing.set()

    def accept(self) -> None:
        """From now on forward Produce requests to the broker again."""
        self._refusing.clear()

    def hold(self) -> None:
        """While refusing, keep the answers to Produce requests back until `release()`
        (the client sees its writes in flight, then refused in the order it sent them)."""
        self._holding.set()

    def release(self) -> None:
        """Send the answers held back, and from now on answer at once."""
        self._holding.clear()
        asyncio.run_coroutine_threadsafe(self._release(), self._loop).result(10)

    def down(self) -> None:
        """Close every client connection and, until `up()`, each new one at once."""
        self._down.set()
        asyncio.run_coroutine_threadsafe(self._drop_connections(), self._loop).result(10)

    def up(self) -> None:
        """Serve client connections again."""
        self._down.clear()

    def refused(self) -> list[RefusedRecord]:
        """Every record refused so far, in the order the requests arrived."""
        with self._lock:
            return list(self._refused)

    def requests_refused(self) -> int:
        """How many Produce requests were answered with the error."""
        with self._lock:
            return self._requests_refused

    async def _listen(self) -> int:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return int(self._server.sockets[0].getsockname()[1])

    async def _close(self) -> None:
        assert self._server is not None
        self._server.close()
        await self._drop_connections()

    async def _release(self) -> None:
        held, self._held = self._held, []
        for slot, answer in held:
            if not slot.done():
                slot.set_result(answer)

    async def _drop_connections(self) -> None:
        for connection in list(self._connections):
            connection.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        """One client connection: its own upstream connection, answers kept in request order."""
        if self._down.is_set():
            client_w.close()
            return
        try:
            upstream_r, upstream_w = await asyncio.open_connection(*self._upstream)
        except OSError:
            client_w.close()
            return
        # One slot per request in arrival order: Kafka clients expect answers in that order.
        slots: asyncio.Queue[asyncio.Future[bytes]] = asyncio.Queue()
        forwarded: asyncio.Queue[tuple[int, int, asyncio.Future[bytes]]] = asyncio.Queue()
        tasks = [
            asyncio.create_task(self._requests(client_r, upstream_w, slots, forwarded)),
            asyncio.create_task(self._answers(upstream_r, forwarded)),
            asyncio.create_task(_write_in_order(slots, client_w)),
        ]
        this = asyncio.current_task()
        assert this is not None
        self._connections.add(this)
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            self._connections.discard(this)
            for task in tasks:
                task.cancel()
            for writer in (client_w, upstream_w):
                writer.close()

    async def _requests(
        self,
        client: asyncio.StreamReader,
        upstream: asyncio.StreamWriter,
        slots: asyncio.Queue[asyncio.Future[bytes]],
        forwarded: asyncio.Queue[tuple[int, int, asyncio.Future[bytes]]],
    ) -> None:
        """Client to broker: forward each request, or answer a Produce request while refusing."""
        while frame := await _read_frame(client):
            api_key, version, correlation_id = _HEADER.unpack_from(frame)
            slot: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
            await slots.put(slot)
            if api_key == _PRODUCE and self._refusing.is_set():
                answer = self._refusal(frame, version, correlation_id)
                if self._holding.is_set():
                    self._held.append((slot, answer))
                else:
                    slot.set_result(answer)
                continue
            await forwarded.put((api_key, version, slot))
            upstream.write(_SIZE.pack(len(frame)) + frame)
            await upstream.drain()

    async def _answers(
        self,
        upstream: asyncio.StreamReader,
        forwarded: asyncio.Queue[tuple[int, int, asyncio.Future[bytes]]],
    ) -> None:
        """Broker to client: each answer fills the slot of its request (Metadata rewritten)."""
        while frame := await _read_frame(upstream):
            api_key, version, slot = await forwarded.get()
            if api_key == _METADATA:
                frame = self._rewrite_metadata(frame, version)
            slot.set_result(frame)

    def _refusal(self, frame: bytes, version: int, correlation_id: int) -> bytes:
        """The error answer to a Produce request; its records are kept as evidence."""
        body = BytesIO(frame)
        body.seek(_HEADER.size)
        (client_id_length,) = struct.unpack(">h", body.read(2))
        body.seek(max(client_id_length, 0), 1)
        request = getattr(produce, f"ProduceRequest_v{version}").decode(body)
        assert request.required_acks != 0, "the proxy only refuses acknowledged writes"
        refused: list[RefusedRecord] = []
        answer: list[tuple[str, list[tuple[Any, ...]]]] = []
        for topic, partitions in request.topics:
            for partition, messages in partitions:
                refused += _records(topic, partition, messages)
            answer.append((topic, [_partition_error(p, version) for p, _ in partitions]))
        with self._lock:
            self._refused += refused
            self._requests_refused += 1
        response = getattr(produce, f"ProduceResponse_v{version}")
        fields = {"topics": answer} if version == 0 else {"topics": answer, "throttle_time_ms": 0}
        return struct.pack(">i", correlation_id) + response(**fields).encode()

    def _rewrite_metadata(self, frame: bytes, version: int) -> bytes:
        """A Metadata answer naming this proxy instead of the broker, so clients stay on it."""
        response_type = getattr(metadata, f"MetadataResponse_v{version}")
        answer = response_type.decode(frame[4:])
        answer.brokers = [
            (node_id, "127.0.0.1", self.port, *rest) for node_id, _, _, *rest in answer.brokers
        ]
        return frame[:4] + answer.encode()


def _partition_error(partition: int, version: int) -> tuple[Any, ...]:
    """One partition's entry in a Produce answer of `version`: refused, no offset."""
    code = TopicAuthorizationFailedError.errno
    if version < 2:
        return (partition, code, -1)
    if version < 5:
        return (partition, code, -1, -1)
    return (partition, code, -1, -1, -1)


def _records(topic: str, partition: int, messages: bytes) -> list[RefusedRecord]:
    """The records in one partition's record batches."""
    records = MemoryRecords(messages)
    found: list[RefusedRecord] = []
    while (batch := records.next_batch()) is not None:
        found += [RefusedRecord(topic, partition, r.key, r.value) for r in batch]
    return found


async def _read_frame(reader: asyncio.StreamReader) -> bytes:
    """One size-prefixed Kafka frame without its size; b"" once the peer closed."""
    try:
        size = await reader.readexactly(_SIZE.size)
        return await reader.readexactly(_SIZE.unpack(size)[0])
    except (asyncio.IncompleteReadError, ConnectionError):
        return b""


async def _write_in_order(
    slots: asyncio.Queue[asyncio.Future[bytes]], writer: asyncio.StreamWriter
) -> None:
    """Send the answers to the client in the order its requests came."""
    while True:
        frame = await (await slots.get())
        writer.write(_SIZE.pack(len(frame)) + frame)
        await writer.drain()
