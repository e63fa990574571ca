"""The registry, NullPublisher and process-wide metrics (no broker needed)."""

from __future__ import annotations

import random
import subprocess
import sys

import pytest
from kvscope.publisher import NullPublisher, Publisher, create_publisher, register_publisher
from kvscope.publisher.metrics import publisher_metrics
from kvscope.schemas import ConfigError, EngineStats


def test_null_publisher_accepts_anything_silently() -> None:
    publisher = create_publisher("null")
    assert isinstance(publisher, NullPublisher)
    publisher.publish(EngineStats(capacity_blocks=1, block_size=16, usage=0.0))
    publisher.shutdown()


def test_registry_rejects_unknown_and_duplicate_names() -> None:
    with pytest.raises(ConfigError, match=r"unknown publisher 'nope'; registered: .*kafka.*null"):
        create_publisher("nope")
    with pytest.raises(ConfigError, match="already registered"):
        register_publisher("null", NullPublisher)


def test_registry_creates_registered_publishers() -> None:
    class Recording(Publisher):
        """Records bodies in memory (a recording sink for the registry test)."""

        def __init__(self, tag: str) -> None:
            self.tag = tag
            self.bodies: list[object] = []

        def publish(self, body, ts=None):  # type: ignore[no-untyped-def]
            self.bodies.append(body)

        def shutdown(self, timeout_s: float = 5.0) -> None:
            pass

    register_publisher("test-recording", Recording)
    publisher = create_publisher("test-recording", tag="x")
    assert isinstance(publisher, Recording)
    assert publisher.tag == "x"


def test_metrics_are_created_once_per_process() -> None:
    assert publisher_metrics() is publisher_metrics()


def test_import_stays_light() -> None:
    code = (
        "import sys, kvscope.publisher, kvscope.publisher.vllm.plugin\n"
        "heavy = ('chdb', 'clickhouse_connect', 'pandas', 'matplotlib', 'vllm', 'torch')\n"
        "print(','.join(m for m in heavy if m in sys.modules))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == ""


def test_a_new_epoch_does_not_follow_the_seeded_random_state() -> None:
    """vLLM seeds `random` with its `seed` (0 by default) in every engine process; the epoch
    of a restarted engine must still differ from its previous run's."""
    from kvscope.publisher.kafka import new_epoch

    epochs = set()
    for _ in range(3):
        random.seed(0)
        epochs.add(new_epoch())
    assert len(epochs) == 3
