"""Fail open: the index helps routing, it never decides whether a request is served.

Per request the gate asks the index within a budget (`--index-timeout`, 20 ms by default)
and says on what basis the request is routed: `index` (its scores), `load` (no index
configured), or load because the index failed: `index_down` (unreachable, failing, its
feed stopped), `index_timeout` (over budget), `index_not_ready` (catching up: its own
/healthz says so, or its answer's `ready` is false) or `index_refused` (it refused the
token). An index whose /healthz (polled in the background) says it is not ready costs no
call at all, nor does the router's own index once its feed stopped (it is asked each
request: that costs no I/O). While the index answers requests ready, those answers are its
health and the poll is skipped. Each change of state is logged once, not each request. A
client's bad prompt (the index answers 400) still reaches the client as its 400.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from kvscope.index.protocol import ScoreResult
from kvscope.route import metrics
from kvscope.route.errors import IndexRefused, IndexUnavailable
from kvscope.route.index_client import Health, IndexClient, Prompt

if TYPE_CHECKING:
    from kvscope.route.embedded import EmbeddedIndex

log = logging.getLogger(__name__)

RECOVERY_POLL_S = 0.2
"""How often the index's health is asked while it is down or catching up (an HTTP GET each,
about 0.3 ms of the router's CPU: under 0.2% of a core while it lasts)."""
UNMATCHED_WARNING = 1000
"""Scored requests without one confirmed block match after which the router warns that the
hashing probably differs from the engines' (`--hash-seed`, `--hash-algo`)."""

INDEX = "index"
LOAD = "load"
"""The bases of a decision that did not fail open."""


class IndexGate:
    """The router's view of its index: scores within a budget, and the index's state."""

    def __init__(
        self,
        index: IndexClient | None,
        budget_s: float,
        health: Callable[[], Awaitable[Health]] | None = None,
        *,
        live: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.index = index
        self._budget_s = budget_s
        self._health = health or (index.health if index is not None else None)
        self.state = "ok" if index is not None else "none"
        """ok, down, timeout, not_ready, refused (none: no index configured)."""
        self.detail = ""
        self._polled: Health = ("ok", "")
        self._live = live
        """Ask `health` on every request (it costs no I/O: the router's own index)."""
        self._clock = clock
        self._answered_at = -math.inf
        """When the index last answered a request ready."""
        self._unmatched = 0
        """Scored requests so far, while none matched a block an engine published (-1 once
        one did, or once warned)."""

    async def skip(self) -> str | None:
        """The basis to route by without asking (no index, one that said it is not ready,
        or the router's own whose feed stopped), else None: asking is worth it. A health
        poll that got no answer is no reason to skip: on a loaded machine it may time out
        while the index answers, and a refused connection costs a request little."""
        if self.index is None:
            return LOAD
        if self._live:
            await self.poll()
        state, detail = self._polled
        if state == "not_ready" or (state == "down" and self._live):
            self._enter(state, detail)
            return f"index_{state}"
        return None

    async def score(self, prompt: Prompt) -> tuple[ScoreResult | None, str]:
        """The index's scores of `prompt` and the basis `index`, or None and the basis the
        request is routed by instead. Raises only `BadRequest` (the index refused the
        prompt: the client's error)."""
        skipped = await self.skip()
        if skipped is not None or self.index is None:
            return None, skipped or LOAD
        try:
            async with asyncio.timeout(self._budget_s):  # no task per request, unlike wait_for
                result = await self.index.score(prompt)
        except TimeoutError:
            return self._failed("timeout", f"no answer within {self._budget_s * 1000:.0f} ms")
        except IndexRefused as exc:
            return self._failed("refused", str(exc))
        except IndexUnavailable as exc:
            return self._failed("down", str(exc))
        if not result.ready:
            return self._failed("not_ready", "it answers but has not caught up with its feed")
        self._answered_at = self._clock()
        self._polled = ("ok", "")
        self._enter("ok", "")
        self._check_matching(result)
        return result, INDEX

    def _check_matching(self, result: ScoreResult) -> None:
        """Warn once when many prompts in a row matched no published block at all: the index
        cannot tell for sure (it sees hashes, not tokens), but a fleet that never shares a
        prefix is rarer than a hash seed or algorithm that differs from the engines'."""
        if self._unmatched < 0:
            return
        if any(s.matched_blocks > s.speculative_blocks for s in result.sources):
            self._unmatched = -1
            return
        self._unmatched += 1
        if self._unmatched >= UNMATCHED_WARNING:
            self._unmatched = -1
            log.warning(
                "%d prompts in a row matched no block any engine published: if prompts do "
                "share prefixes, the index hashes them differently from the engines; give it "
                "their --prefix-caching-hash-algo and PYTHONHASHSEED (--hash-algo, "
                "--hash-seed; unset on the engines means unset here too)",
                UNMATCHED_WARNING,
            )

    def _failed(self, state: str, detail: str) -> tuple[None, str]:
        metrics.INDEX_ERRORS.labels("score").inc()
        self._enter(state, detail)
        return None, f"index_{state}"

    def _enter(self, state: str, detail: str) -> None:
        """Log a change of state once."""
        if state == self.state:
            return
        if state == "ok":
            log.warning("the index answers again: routing by its scores")
        else:
            log.warning("the index is %s (%s): routing by load until it recovers",
                        state.replace("_", " "), detail)  # fmt: skip
        self.state, self.detail = state, detail

    async def poll(self) -> None:
        """Ask the index's health once (the router's health loop calls this)."""
        if self._health is None:
            return
        self._polled = await self._health()
        if self._polled[0] == "ok" and self.state in ("down", "not_ready"):
            self._enter("ok", "")

    async def watch(self, interval_s: float) -> None:
        """`poll()` every `interval_s` until cancelled, unless the index answered a request
        ready within it; every `RECOVERY_POLL_S` while the index is not ok (down or catching
        up), so routing returns to the index's scores within that much of its recovery (a
        restarted index is ready in about 2 s)."""
        while True:
            healthy = self._polled[0] == "ok" and self.state not in ("down", "not_ready")
            await asyncio.sleep(interval_s if healthy else min(interval_s, RECOVERY_POLL_S))
            if self.state != "ok" or self._clock() - self._answered_at >= interval_s:
                await self.poll()

    def describe(self) -> dict[str, str]:
        """The index's state for /healthz: reported, never assumed."""
        state = self._polled[0] if self._polled[0] != "ok" else self.state
        detail = self._polled[1] if self._polled[0] != "ok" else self.detail
        return {"state": state, "detail": detail} if detail else {"state": state}


def embedded_health(embedded: EmbeddedIndex | None) -> Callable[[], Awaitable[Health]] | None:
    """The state of the router's own index: down once its feed stopped, not ready while it
    catches up (None without one: the gate asks the client's own `health`)."""
    if embedded is None:
        return None

    async def health() -> Health:
        failure = embedded.failure()
        if failure:
            return "down", failure
        return ("ok", "") if embedded.caught_up else ("not_ready", "catching up with its feed")

    return health
