"""Fixtures of the real-vLLM tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from kvscope.local.broker import LocalBroker
from support.route_fleet import SharedFleet, shared_fleet


@pytest.fixture(scope="session")
def route_fleet(
    tiny_llama: Path, broker: LocalBroker, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SharedFleet]:
    """The two engines test_route_engines.py and test_route_index_e2e.py share: starting a
    fleet costs ~40 s on this machine, and neither test needs engines of its own (each
    sends prompts the other never sends). Stopped when the session ends."""
    with shared_fleet(
        tiny_llama, tmp_path_factory.mktemp("route-fleet"), broker.bootstrap_servers
    ) as fleet:
        yield fleet
