"""The sender's retry decisions ask the error: retriable ones back off with jitter."""

from __future__ import annotations

import random

import pytest
from aiokafka.errors import (
    AuthenticationFailedError,
    KafkaConnectionError,
    KafkaTimeoutError,
    NotLeaderForPartitionError,
    UnsupportedSaslMechanismError,
)
from kvscope.common.backoff import Backoff
from kvscope.publisher.sender import _reconnect_delay, loss_reason
from kvscope.schemas import ConfigError, KvscopeError


class _Transient(KvscopeError):
    """A kvscope error that says it may succeed later (as the collector's SinkError does)."""

    retriable = True


RETRIABLE = [
    KafkaConnectionError("down"),
    KafkaTimeoutError(),
    NotLeaderForPartitionError(),
    _Transient("x"),
]
PERMANENT = [
    AuthenticationFailedError(),
    UnsupportedSaslMechanismError(),
    ConfigError("x"),
    ValueError("x"),
]


@pytest.mark.parametrize("exc", RETRIABLE, ids=lambda e: type(e).__name__)
def test_retriable_connect_errors_take_the_next_jittered_delay(exc: BaseException) -> None:
    backoff = Backoff(0.1, 5.0, random.Random(1))
    delays = [_reconnect_delay(backoff, exc) for _ in range(6)]
    assert backoff.attempts == 6
    assert all(0.05 <= d <= min(5.0, 0.1 * 2**i) for i, d in enumerate(delays))
    assert loss_reason(exc) == "broker_unavailable"


@pytest.mark.parametrize("exc", PERMANENT, ids=lambda e: type(e).__name__)
def test_other_connect_errors_wait_the_maximum(exc: BaseException) -> None:
    backoff = Backoff(0.1, 5.0, random.Random(1))
    assert _reconnect_delay(backoff, exc) == 5.0
    assert backoff.attempts == 0
    assert loss_reason(exc) == "send_failed"


def test_a_lost_future_without_an_error_counts_as_unavailable() -> None:
    assert loss_reason(None) == "broker_unavailable"
