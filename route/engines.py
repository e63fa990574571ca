"""The fleet as the router sees it: each engine's load, health and failures.

Two ways out of rotation, kept apart:
- down: a request to it failed to connect, or a health check (`GET /health`, what vLLM
  serves) failed; skipped for `down_s`, and a passing health check brings it back at once.
  Health checks are for engines the traffic says nothing about: one that sent a first
  byte within the last interval is not checked (its answers are the evidence, and a
  failed connection marks it down at once), one that is down or idle always is.
- ejected: passive outlier detection in the manner of Envoy's. Each failure of the engine's
  own (a 5xx, a failed connection, a break-off mid-answer, a stall) adds to its consecutive
  failures, any other answer (a client's 4xx too) resets them; at `eject_after` it is ejected
  for `eject_base_s` times the times it has been ejected (at most `eject_max_s`; the count
  decays by one per healthy base period). At most `max_ejected_share` of the fleet is ejected
  at once, but the first ejection always happens (as Envoy does). Health checks do not end
  an ejection: an engine can answer `/health` and still fail every request.

Load: the requests in flight, each streamed one still waiting for its first byte weighted by
its age (one more per `stall_s` waited), so an engine that stops answering grows heavier. An
engine is stalled when its oldest streamed request has waited `stall_s` for a first byte and
it sent no first byte in that time, while another engine answered (a first byte or a health
check) within it; a stalled engine is skipped while another is up (`select.choose`), and
each request caught stalling counts as one failure. Only streamed requests are evidence:
vLLM sends a stream's headers at once, but a non-streamed answer's only when it is complete,
however long the generation (those fail by `--request-timeout` and their 5xx instead).
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import time
from collections.abc import Callable, Mapping

from kvscope.index.protocol import ScoreResult
from kvscope.route import metrics
from kvscope.route.config import EngineSpec, RouteConfig
from kvscope.route.http_client import HttpClient, TransportError
from kvscope.route.select import Candidate

log = logging.getLogger(__name__)


@dataclasses.dataclass
class EngineState:
    """One engine's live state."""

    spec: EngineSpec
    in_flight: int = 0
    """Requests sent to it and not finished (streams count until their last chunk)."""
    down_until: float = 0.0
    """Monotonic time until which it is skipped after a connect or health failure (0: up)."""
    waiting: dict[int, float] = dataclasses.field(default_factory=dict)
    """Streamed requests without a first byte yet: ticket -> monotonic time sent."""
    stall_counted: set[int] = dataclasses.field(default_factory=set)
    """Tickets of `waiting` already counted as a stall."""
    last_answer: float = 0.0
    """Monotonic time of its latest first byte."""
    last_health: float = 0.0
    """Monotonic time of its latest passing health check."""
    failures: int = 0
    """Consecutive failures of its own."""
    ejected_until: float = 0.0
    """Monotonic time until which it is ejected (0: not ejected)."""
    times_ejected: int = 0
    """Ejections so far, decaying by one per healthy base period (the next one lasts longer)."""


class Fleet:
    """The engines by instance name, their load, health and ejections."""

    def __init__(self, config: RouteConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self.engines = {s.name: EngineState(s) for s in config.engines}
        self._down_s = config.down_s
        self._config = config
        self._clock = clock
        self._tickets = itertools.count()
        self._unknown: set[str] = set()
        for name in self.engines:
            metrics.ENGINE_UP.labels(name).set(1)
            metrics.IN_FLIGHT.labels(name).set(0)

    def is_up(self, name: str) -> bool:
        """Whether `name` may be routed to now (neither down nor ejected)."""
        state = self.engines[name]
        now = self._clock()
        return state.down_until <= now and state.ejected_until <= now

    def up_names(self) -> list[str]:
        """Names of the engines that are up, in configuration order."""
        return [n for n in self.engines if self.is_up(n)]

    def describe(self, name: str) -> str:
        """One word for /healthz: up, down, ejected or stalled."""
        state = self.engines[name]
        now = self._clock()
        if state.ejected_until > now:
            return "ejected"
        if state.down_until > now:
            return "down"
        return "stalled" if self._stalled(state, now) else "up"

    def load(self, name: str) -> int:
        """In-flight requests, each still waiting for its first byte weighted by its age."""
        state = self.engines[name]
        now = self._clock()
        stall_s = self._config.stall_s
        return state.in_flight + sum(int((now - t) // stall_s) for t in state.waiting.values())

    def candidates(self, scores: ScoreResult | None) -> list[Candidate]:
        """Every engine with its load, health and (from `scores`) best match over dp ranks.

        A source the index knows under a name no engine has is logged once: the mapping
        of `--engines` names to instances is then probably wrong. Stalls found here count
        as failures.
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
        now = self._clock()
        return [
            Candidate(
                name=name,
                in_flight=self.load(name),
                matched_tokens=best.get(name, (0, 0))[0],
                dp_rank=best.get(name, (0, 0))[1],
                stale=name in stale,
                up=self.is_up(name),
                stalled=self._check_stall(state, now),
            )
            for name, state in self.engines.items()
        ]

    def _stalled(self, state: EngineState, now: float) -> bool:
        bound = now - self._config.stall_s
        if not state.waiting or min(state.waiting.values()) > bound or state.last_answer > bound:
            return False
        return any(
            max(o.last_answer, o.last_health) > bound
            for o in self.engines.values()
            if o is not state and self.is_up(o.spec.name)
        )

    def _check_stall(self, state: EngineState, now: float) -> bool:
        """Whether `state`'s engine is stalled; each newly stalled request is a failure."""
        if not self._stalled(state, now):
            return False
        bound = now - self._config.stall_s
        for ticket, sent in state.waiting.items():
            if sent <= bound and ticket not in state.stall_counted:
                state.stall_counted.add(ticket)
                self.failed(state.spec.name, "stall")
        return True

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

    def sent(self, name: str, streamed: bool) -> int:
        """One more request in flight to `name` (a `streamed` one waits for its first byte
        as stall evidence); its ticket."""
        state = self.engines[name]
        state.in_flight += 1
        metrics.IN_FLIGHT.labels(name).inc()
        ticket = next(self._tickets)
        if streamed:
            state.waiting[ticket] = self._clock()
        return ticket

    def answered(self, name: str, ticket: int) -> None:
        """The first byte (the answer's headers) of request `ticket` arrived."""
        state = self.engines[name]
        state.waiting.pop(ticket, None)
        state.stall_counted.discard(ticket)
        state.last_answer = self._clock()

    def finished(self, name: str, ticket: int) -> None:
        """Request `ticket` to `name` finished (or failed)."""
        state = self.engines[name]
        state.waiting.pop(ticket, None)
        state.stall_counted.discard(ticket)
        state.in_flight -= 1
        metrics.IN_FLIGHT.labels(name).dec()

    def succeeded(self, name: str) -> None:
        """`name` answered without a fault of its own: its consecutive failures restart."""
        state = self.engines[name]
        state.failures = 0
        if state.times_ejected and state.ejected_until <= self._clock():
            healthy_s = self._clock() - state.ejected_until
            decay = int(healthy_s // self._config.eject_base_s)
            if decay:
                state.times_ejected = max(0, state.times_ejected - decay)
                state.ejected_until = self._clock() if state.times_ejected else 0.0

    def failed(self, name: str, kind: str) -> None:
        """A failure of `name`'s own of `kind` (counted); ejects it at `eject_after` in a row."""
        state = self.engines[name]
        metrics.ENGINE_ERRORS.labels(name, kind).inc()
        state.failures += 1
        if state.failures < self._config.eject_after or state.ejected_until > self._clock():
            return
        now = self._clock()
        ejected = sum(1 for s in self.engines.values() if s.ejected_until > now)
        if ejected and ejected + 1 > self._config.max_ejected_share * len(self.engines):
            log.warning("engine %s failed %d times in a row; not ejected: %d of %d already are",
                        name, state.failures, ejected, len(self.engines))  # fmt: skip
            return
        state.times_ejected += 1
        seconds = min(self._config.eject_base_s * state.times_ejected, self._config.eject_max_s)
        state.ejected_until = now + seconds
        state.failures = 0
        metrics.EJECTIONS.labels(name).inc()
        metrics.ENGINE_UP.labels(name).set(0)
        log.warning("engine %s (%s) ejected for %.0f s after consecutive failures (last: %s)",
                    name, state.spec.url, seconds, kind)  # fmt: skip

    def mark_down(self, name: str, kind: str) -> None:
        """Skip `name` for `down_s` after a failure of `kind` (counted by the caller)."""
        state = self.engines[name]
        if state.down_until <= self._clock():
            log.warning("engine %s (%s) is down (%s); skipped for %.0f s",
                        name, state.spec.url, kind, self._down_s)  # fmt: skip
        state.down_until = self._clock() + self._down_s
        metrics.ENGINE_UP.labels(name).set(0)

    def mark_up(self, name: str) -> None:
        """`name` answered its health check: route to it again (unless it is ejected)."""
        state = self.engines[name]
        if state.down_until > self._clock():
            log.info("engine %s (%s) is up again", name, state.spec.url)
        state.down_until = 0.0
        state.last_health = self._clock()
        metrics.ENGINE_UP.labels(name).set(int(self.is_up(name)))

    async def check_health(
        self,
        client: HttpClient,
        timeout_s: float,
        headers: Mapping[str, str],
        idle_s: float = 0.0,
    ) -> None:
        """`GET /health` (with `headers`) of every engine at once that is down or sent no
        first byte for `idle_s` (0: of every engine); marks each up or down."""

        async def check(state: EngineState) -> None:
            try:
                status, _ = await client.fetch("GET", f"{state.spec.url}/health", headers,
                                               timeout_s)  # fmt: skip
                healthy = status == 200
            except (TransportError, TimeoutError):
                healthy = False
            if healthy:
                self.mark_up(state.spec.name)
            else:
                metrics.ENGINE_ERRORS.labels(state.spec.name, "health").inc()
                self.mark_down(state.spec.name, "health")

        now = self._clock()
        idle = [s for s in self.engines.values()
                if s.down_until > now or now - s.last_answer >= idle_s]  # fmt: skip
        await asyncio.gather(*(check(s) for s in idle))

    async def watch_health(
        self,
        client: HttpClient,
        interval_s: float,
        timeout_s: float,
        headers: Mapping[str, str],
    ) -> None:
        """Every `interval_s` until cancelled, check the engines that sent no first byte in
        that time (or are down)."""
        while True:
            await asyncio.sleep(interval_s)
            await self.check_health(client, timeout_s, headers, interval_s)
