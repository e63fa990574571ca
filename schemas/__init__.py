"""kvscope's wire format: the Kafka envelope, its bodies, codecs and engine adapters.

Pure data: depends on msgspec only, never on the rest of kvscope.
"""

from kvscope.schemas.codec import decode, encode
from kvscope.schemas.engines import (
    ENGINES,
    Engine,
    EngineBatch,
    decode_engine_batch,
    decode_engine_payload,
    normalize_event,
    normalize_hash,
)
from kvscope.schemas.errors import ConfigError, DecodeError, KvscopeError
from kvscope.schemas.streams import (
    DEFAULT_TOPIC_PREFIX,
    STREAM_BODIES,
    STREAMS,
    Stream,
    stream_of,
    topic_for,
)
from kvscope.schemas.wire import (
    SCHEMA_VERSION,
    AllBlocksCleared,
    AnyBody,
    BlockAccess,
    BlockRemoved,
    BlockStored,
    Body,
    EngineMetric,
    EngineStats,
    Envelope,
    Event,
    Gap,
    KVEventBatch,
    KVTransfer,
    RequestFinished,
    Role,
    Source,
)

__all__ = [
    "DEFAULT_TOPIC_PREFIX",
    "ENGINES",
    "SCHEMA_VERSION",
    "STREAMS",
    "STREAM_BODIES",
    "AllBlocksCleared",
    "AnyBody",
    "BlockAccess",
    "BlockRemoved",
    "BlockStored",
    "Body",
    "ConfigError",
    "DecodeError",
    "Engine",
    "EngineBatch",
    "EngineMetric",
    "EngineStats",
    "Envelope",
    "Event",
    "Gap",
    "KVEventBatch",
    "KVTransfer",
    "KvscopeError",
    "RequestFinished",
    "Role",
    "Source",
    "Stream",
    "decode",
    "decode_engine_batch",
    "decode_engine_payload",
    "encode",
    "normalize_event",
    "normalize_hash",
    "stream_of",
    "topic_for",
]
