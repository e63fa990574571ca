"""The ZMQ frames vLLM and SGLang KV-event publishers send, and llm-d style topics.

Live (PUB) frames, both engines: `[topic, seq, payload]`, `seq` an 8-byte big-endian
unsigned int counting batches from 0 per engine process, `payload` the msgpack batch.

Replay (ROUTER) answers, as a DEALER sees them after the empty delimiter frame:
- vLLM 0.32, SGLang 0.5.23: `[topic, seq, payload]` per buffered batch, then
  `[b"", END, b""]`;
- older releases of both: `[seq, payload]` per buffered batch (no topic frame), then
  `[END, b""]`;
where END is -1 as an 8-byte big-endian signed int. The request is one frame: the
first wanted seq as 8 bytes big-endian.

Topic metadata: SGLang's publisher with a snapshot endpoint (sgl-project/sglang#34407)
appends `\x00sgl-kv-epoch=<epoch>` (and on its snapshot barrier batch
`\x00sgl-kv-snapshot=<id>`) to the configured topic; everything from the first NUL byte
on is metadata, not part of the topic.
"""

from __future__ import annotations

from typing import NamedTuple

END_SEQ = (-1).to_bytes(8, "big", signed=True)
"""The marker that ends a replay answer."""


class Frame(NamedTuple):
    """One engine batch as it arrived: its engine seq, its topic and the msgpack payload."""

    seq: int
    """The engine's batch counter (0-based, restarts with the engine process)."""
    topic: str
    """The ZMQ topic ("" when the engine publishes none, or in an SGLang replay)."""
    payload: bytes


class TopicInfo(NamedTuple):
    """What an llm-d style topic `kv@<pod-ip>:<port>@<model>` names."""

    instance: str
    """`<pod-ip>:<port>`."""
    model: str


def encode_seq(seq: int) -> bytes:
    """A seq as the 8-byte big-endian frame both engines use."""
    return seq.to_bytes(8, "big")


def parse_live(frames: list[bytes]) -> Frame:
    """Parse a PUB message `[topic, seq, payload]`; ValueError when it has another shape."""
    if len(frames) != 3 or len(frames[1]) != 8:
        raise ValueError(f"expected [topic, 8-byte seq, payload], got {len(frames)} frames")
    topic, seq, payload = frames
    return Frame(int.from_bytes(seq, "big"), topic_name(topic), payload)


def parse_replay(frames: list[bytes]) -> Frame | None:
    """Parse one replay answer message (after the empty delimiter); None for the END marker.

    Accepts the vLLM shape `[topic, seq, payload]` and the SGLang shape `[seq, payload]`.
    """
    if len(frames) == 3:
        topic, seq, payload = frames
    elif len(frames) == 2:
        topic, (seq, payload) = b"", frames
    else:
        raise ValueError(f"unexpected replay message of {len(frames)} frames")
    if seq == END_SEQ:
        return None
    if len(seq) != 8:
        raise ValueError(f"replay seq frame has {len(seq)} bytes, expected 8")
    return Frame(int.from_bytes(seq, "big"), topic_name(topic), payload)


def topic_name(raw: bytes) -> str:
    """The topic an engine configured, without the metadata an engine appends after a NUL."""
    return raw.split(b"\x00", 1)[0].decode("utf-8", "replace")


def parse_topic(topic: str) -> TopicInfo | None:
    """Instance and model from an llm-d style topic `kv@<pod-ip>:<port>@<model>`.

    The model may itself contain `@`; None when the topic does not have this form.
    """
    parts = topic.split("@", 2)
    if len(parts) != 3 or parts[0] != "kv" or not parts[1] or not parts[2]:
        return None
    return TopicInfo(instance=parts[1], model=parts[2])
