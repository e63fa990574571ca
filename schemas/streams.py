"""The six streams (`Stream`): their topic names and which bodies travel on each."""

from __future__ import annotations

from enum import StrEnum
from typing import Final

from kvscope.schemas.wire import (
    BlockAccess,
    EngineMetric,
    EngineStats,
    KVEventBatch,
    KVTransfer,
    RequestFinished,
)

DEFAULT_TOPIC_PREFIX: Final = "kvscope."


class Stream(StrEnum):
    """One stream = one topic (`{prefix}{value}`) = one raw table. Members are strings, so
    a member and its value are the same dict key and print the same."""

    KV_EVENTS = "kv-events"
    ENGINE_STATS = "engine-stats"
    REQUESTS = "requests"
    KV_TRANSFERS = "kv-transfers"
    ENGINE_HISTOGRAMS = "engine-histograms"
    KV_ACCESSES = "kv-accesses"


STREAM_BODIES: Final[dict[str, type]] = {
    Stream.KV_EVENTS: KVEventBatch,
    Stream.ENGINE_STATS: EngineStats,
    Stream.REQUESTS: RequestFinished,
    Stream.KV_TRANSFERS: KVTransfer,
    Stream.ENGINE_HISTOGRAMS: EngineMetric,
    Stream.KV_ACCESSES: BlockAccess,
}
"""Stream name -> body type. A `Gap` body may travel on any stream (it names that stream's seqs)."""

STREAMS: Final = tuple(stream.value for stream in Stream)
"""The stream names as plain strings, in `Stream`'s order."""


_STREAM_OF_TYPE: Final[dict[type, str]] = {
    body: str(stream) for stream, body in STREAM_BODIES.items()
}


def stream_of(body: object) -> str:
    """The stream a (non-Gap) body belongs to (a dict lookup: publishers call it per record)."""
    stream = _STREAM_OF_TYPE.get(type(body))
    if stream is not None:
        return stream
    for stream, body_type in STREAM_BODIES.items():
        if isinstance(body, body_type):
            return str(stream)
    raise ValueError(f"{type(body).__name__} has no stream of its own")


def topic_for(stream: str, prefix: str = DEFAULT_TOPIC_PREFIX) -> str:
    """The Kafka topic of a stream."""
    if stream not in STREAM_BODIES:
        raise ValueError(f"unknown stream {stream!r}; known: {', '.join(STREAMS)}")
    return f"{prefix}{stream}"


TOPIC_CHARS: Final = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")
"""Characters Kafka allows in a topic name."""
MAX_TOPIC_CHARS: Final = 249
"""Kafka's longest topic name."""


def topic_prefix_problem(prefix: str) -> str | None:
    """Why `prefix` cannot start kvscope's topic names (Kafka's naming rules), or None."""
    if not prefix:
        return "the topic prefix is empty"
    bad = sorted(set(prefix) - TOPIC_CHARS)
    if bad:
        shown = ", ".join(repr(c) for c in bad[:5])
        return f"topic prefix {prefix!r} has {shown}: use letters, digits, '.', '_' or '-'"
    longest = max(len(stream) for stream in STREAMS)
    if len(prefix) + longest > MAX_TOPIC_CHARS:
        return f"topic prefix is {len(prefix)} characters: at most {MAX_TOPIC_CHARS - longest}"
    return None
