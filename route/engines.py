"""The fleet as the router sees it: each engine's in-flight requests and whether it is up.

An engine is skipped for `down_s` after a request to it fails to connect or a health check
(`GET /health`, what vLLM serves) fails; a passing health check brings it back at once.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from kvscope.index.protocol import ScoreResult
from kvscope.route import metrics
from kvscope.route.config import EngineSpec
from kvscope.route.select import Candidate

if TYPE_CHECKING:
    import httpx

log = logging.getLogger(__name__)


@dataclasses.dataclass
class EngineState:
    """One engine's live state."""

    spec: EngineSpec
    in_flight: int = 0
    """Requests sent to it and not finished (streams count until their last chunk)."""
    down_until: float = 0.0
    """Monotonic time until which it is skipped (0: up)."""


class Fleet:
    """The engines by instance name, their load and health."""

    def __init__(
        self,
        specs: Iterable[EngineSpec],
        down_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.engines = {s.name: EngineState(s) for s in specs}
        self._down_s = down_s
        self._clock = clock
        self._unknown: set[str] = set()
        for name in self.engines:
            metrics.ENGINE_UP.labels(name).set(1)
            metrics.IN_FLIGHT.labels(name).set(0)

    def is_up(self, name: str) -> bool:
        """Whether `name` may be routed to now."""
        return self.engines[name].down_until <= self._clock()

    def up_names(self) -> list[str]:
        """Names of the engines that are up, in configuration order."""
        return [n for n in self.engines if self.is_up(n)]

    def candidates(self, scores: ScoreResult | None) -> list[Candidate]:
        """Every engine with its load, health and (from `scores`) best match over dp ranks.

        A source the index knows under a name no engine has is logged once: the mapping
        of `--engines` names to instances is then probably wrong.
        """
        best: dict[str, tuple[int, int]] = {}
        stale: set[str] = set()
        for source in scores.sources if scores is not None else ():
            if source.instance not in self.engines:
                self._warn_unknown(source.instance)
                continue
            if source.stale:
                stale.add(source.instance)
            if source.matched_tokens > best.get(source.instance, (-1, 0))[0]:
                best[source.instance] = (source.matched_tokens, source.dp_rank)
        return [
            Candidate(
                name=name,
                in_flight=state.in_flight,
                matched_tokens=best.get(name, (0, 0))[0],
                dp_rank=best.get(name, (0, 0))[1],
                stale=name in stale,
                up=self.is_up(name),
            )
            for name, state in self.engines.items()
        ]

    def _warn_unknown(self, instance: str) -> None:
        if instance in self._unknown:
            return
        self._unknown.add(instance)
        log.warning(
            "the index knows instance %r, which is none of --engines (%s): name engines "
            "NAME=URL with the instance their plugin publishes (KVSCOPE_INSTANCE)",
            instance,
            ", ".join(self.engines),
        )

    def acquire(self, name: str) -> None:
        """One more request in flight to `name`."""
        self.engines[name].in_flight += 1
        metrics.IN_FLIGHT.labels(name).inc()

    def release(self, name: str) -> None:
        """A request to `name` finished (or failed)."""
        self.engines[name].in_flight -= 1
        metrics.IN_FLIGHT.labels(name).dec()

    def mark_down(self, name: str, kind: str) -> None:
        """Skip `name` for a while after a failure of `kind` (counted)."""
        state = self.engines[name]
        if state.down_until <= self._clock():
            log.warning("engine %s (%s) is down (%s); skipped for %.0f s",
                        name, state.spec.url, kind, self._down_s)  # fmt: skip
        state.down_until = self._clock() + self._down_s
        metrics.ENGINE_ERRORS.labels(name, kind).inc()
        metrics.ENGINE_UP.labels(name).set(0)

    def mark_up(self, name: str) -> None:
        """`name` answered its health check: route to it again."""
        state = self.engines[name]
        if state.down_until > self._clock():
            log.info("engine %s (%s) is up again", name, state.spec.url)
        state.down_until = 0.0
        metrics.ENGINE_UP.labels(name).set(1)

    async def check_health(self, client: httpx.AsyncClient, timeout_s: float) -> None:
        """`GET /health` of every engine at once; marks each up or down."""
        import httpx

        async def check(state: EngineState) -> None:
            try:
                answer = await client.get(f"{state.spec.url}/health", timeout=timeout_s)
                healthy = answer.status_code == 200
            except httpx.HTTPError:
                healthy = False
            if healthy:
                self.mark_up(state.spec.name)
            else:
                self.mark_down(state.spec.name, "health")

        await asyncio.gather(*(check(s) for s in self.engines.values()))

    async def watch_health(
        self, client: httpx.AsyncClient, interval_s: float, timeout_s: float
    ) -> None:
        """Check health every `interval_s` until cancelled."""
        while True:
            await asyncio.sleep(interval_s)
            await self.check_health(client, timeout_s)
