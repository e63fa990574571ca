"""Fixtures for publisher tests: publishers shut down after each test, a restartable broker."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from kvscope.local.broker import LocalBroker, free_port
from kvscope.publisher import KafkaPublisher, PublisherConfig


@pytest.fixture
def make_publisher() -> Iterator[Callable[..., KafkaPublisher]]:
    """Build KafkaPublishers that are shut down after the test."""
    made: list[KafkaPublisher] = []

    def make(**fields: object) -> KafkaPublisher:
        publisher = KafkaPublisher(PublisherConfig(**fields))  # type: ignore[arg-type]
        made.append(publisher)
        return publisher

    yield make
    for publisher in made:
        publisher.shutdown(1.0)


@pytest.fixture
def own_broker() -> Iterator[LocalBroker]:
    """A second broker on a fixed port that the test may stop and restart (not started).

    Request it before `make_publisher`, so publishers disconnect before the broker stops
    (a broker stopped under connected clients takes seconds to exit).
    """
    broker = LocalBroker(port=free_port())
    yield broker
    broker.stop()
