"""An index inside the router's process: `kvscope index`'s state and Kafka feed, no HTTP.

With `kvscope route --index-bootstrap-servers B` the router holds its own `PrefixIndex`,
cold started like `kvscope index` (`--index-clickhouse`, else the topic's beginning) and fed
from the kv-events topic on the router's event loop. A score is then a function call (tens
of µs, hashing included) instead of a round trip to `kvscope index` (milliseconds), and the
routed hints land before the next request. The price: one more reader of the topic and
the index's memory in every router replica. Needs the `index` extra (numba).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from kvscope.index.config import IndexConfig
from kvscope.route.index_client import InProcessIndexClient
from kvscope.schemas.errors import ConfigError

if TYPE_CHECKING:
    from kvscope.index.feed import IndexFeed
    from kvscope.index.stored import SnapshotReader

INSTALL_HINT = "pip install 'kvscope[index]'"


def reading(config: IndexConfig) -> str:
    """Where an in-process index is fed from, for the start banner and /healthz."""
    return f"in process, reading {config.topic} from {config.kafka.bootstrap_servers}"


class EmbeddedIndex:
    """The router's own index: built from `config`, cold started from `snapshots`."""

    def __init__(self, config: IndexConfig, snapshots: SnapshotReader | None = None) -> None:
        try:
            from kvscope.index.service import IndexService
        except ImportError as exc:
            raise ConfigError(
                f"--index-bootstrap-servers needs {exc.name or 'the index extra'}: {INSTALL_HINT}"
            ) from None
        self.config = config
        self.service = IndexService(config, snapshots)
        self._feed: IndexFeed | None = None

    def client(self) -> InProcessIndexClient:
        """The router's view of this index (scores and routed hints as function calls)."""
        return InProcessIndexClient(
            self.service.index,
            self.service.hasher.block_hashes,
            routed_ttl_s=self.config.routed_ttl_s,
            failure=self.failure,
        )

    def failure(self) -> str | None:
        """Why the router must not trust the index now, or None when it can: not running,
        stopped by a bug, not caught up with the topic yet, or disconnected from Kafka for
        longer than `disconnected_grace_s` (a shorter outage keeps answers, honestly
        lagging). The feed reconnects by itself; the reason clears when it has."""
        feed = self._feed
        if feed is None or feed.task is None:
            return "the router's index is not running"
        if feed.task.done():
            error = None if feed.task.cancelled() else feed.task.exception()
            why = f"{type(error).__name__}: {error}" if error else "stopped"
            return f"the router's index stopped reading {self.config.topic} ({why}); restart it"
        status = feed.status()
        if status.ready:
            return None
        grace = self.config.disconnected_grace_s
        if not status.connected and feed.caught_up_once and status.for_s() <= grace:
            return None  # a short outage: the state is exact as of `lag_s` ago
        return f"the router's index is {status.reason()}"

    @property
    def caught_up(self) -> bool:
        """Whether the feed has applied the topic up to its end (as of its connection)."""
        return self._feed is not None and self._feed.caught_up.is_set()

    def describe(self) -> str:
        """One line for /healthz: where it reads from, and whether it is current."""
        feed = self._feed
        if feed is not None and not feed.connected:
            state = f"disconnected for {feed.status().for_s():.0f} s: {feed.last_error}"
        else:
            state = "caught up" if self.caught_up else "catching up"
        return f"{reading(self.config)} ({state})"

    @contextlib.asynccontextmanager
    async def feeding(self) -> AsyncIterator[None]:
        """Cold start and feed the index while the block runs (the router's lifespan)."""
        async with self.service.feeding() as feed:
            self._feed = feed
            try:
                yield
            finally:
                self._feed = None
