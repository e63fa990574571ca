"""kvscope's engine side: light enough to live inside an inference engine process.

`Publisher` is the contract (never block, never raise, report every drop as a `Gap`);
`KafkaPublisher` is one background sender per process with one `Publisher` per source
(`for_source()`); `NullPublisher` is what engines get when kvscope is off;
`create_publisher(name, ...)` picks one by name; `TransferTimer` times KV transfers
inside a connector. Never imports ClickHouse, chDB,
pandas or matplotlib.
"""

from kvscope.publisher.base import (
    NullPublisher,
    Publisher,
    create_publisher,
    register_publisher,
)
from kvscope.publisher.config import PublisherConfig
from kvscope.publisher.kafka import KafkaPublisher, SourcePublisher, shared_kafka_publisher
from kvscope.publisher.transfer_timer import TransferTimer

__all__ = [
    "KafkaPublisher",
    "NullPublisher",
    "Publisher",
    "PublisherConfig",
    "SourcePublisher",
    "TransferTimer",
    "create_publisher",
    "register_publisher",
    "shared_kafka_publisher",
]
