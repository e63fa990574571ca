"""Fixtures of the analytics tests."""

from __future__ import annotations

from typing import Any

import pytest
from kvscope.collector.storage.migrate import migrate
from kvscope.collector.storage.target import parse_target


@pytest.fixture
def tables(clickhouse: Any, clickhouse_url: str) -> Any:
    """The test database with kvscope's migrations applied."""
    migrate(clickhouse, parse_target(clickhouse_url))
    return clickhouse
