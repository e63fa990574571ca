"""LoRA adapters the engines serve, so that a LoRA request's prompt is hashed as vLLM hashes it.

vLLM serves an adapter under its own model name and keys every block of a LoRA request by
`("lora", name, path)` (`_gen_lora_extra_hash_keys` in vllm/v1/core/kv_cache_utils.py);
the engine publishes those blocks under its base model. The engines' `GET /v1/models` lists
each adapter with its path (`root`) and base model (`parent`). The router reads it from an
up engine at start, again when a request names a model that was not listed (an adapter
loaded at runtime is found by its first request; at most once per `MISS_REFRESH_S`), and
every `REFRESH_S` (an adapter unloaded, or loaded again from another path).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Mapping

import msgspec
from kvscope.route.engines import Fleet
from kvscope.route.http_client import HttpClient, TransportError

REFRESH_S = 30.0
"""`/v1/models` is read at least this often."""
MISS_REFRESH_S = 1.0
"""Names the last read did not list send a read at most once per this long, so a client
naming unknown models cannot add a round trip to every request."""


class Adapter(msgspec.Struct):
    """One entry of `/v1/models`: an adapter has a `parent` (its base model) and a `root`
    (the path vLLM hashes)."""

    id: str
    root: str | None = None
    parent: str | None = None


class _Models(msgspec.Struct):
    data: list[Adapter] = msgspec.field(default_factory=list)


class Loras:
    """The adapters by name, as the engines last listed them (read through `client` with
    `headers`, each read within `timeout_s`)."""

    def __init__(
        self,
        client: HttpClient,
        fleet: Fleet,
        headers: Mapping[str, str],
        timeout_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._client = client
        self._fleet = fleet
        self._headers = headers
        self._timeout_s = timeout_s
        self._clock = clock
        self._adapters: dict[str, Adapter] = {}
        self._listed: frozenset[str] = frozenset()
        self._missed_at = -math.inf
        """When a name not listed last sent a read."""
        self._decode = msgspec.json.Decoder(_Models).decode

    async def get(self, model: str) -> Adapter | None:
        """The adapter a request's `model` names, or None (a base model, or unknown); a
        name not listed at the last read is read for first (see the module doc)."""
        if model not in self._listed and self._clock() - self._missed_at >= MISS_REFRESH_S:
            self._missed_at = self._clock()
            await self.refresh()
        return self._adapters.get(model)

    async def refresh(self) -> None:
        """Read `/v1/models` of the first up engine; keep what is known on any failure."""
        up = self._fleet.up_names()
        if not up:
            return
        url = self._fleet.engines[up[0]].spec.url
        try:
            status, body = await self._client.fetch(
                "GET", f"{url}/v1/models", self._headers, self._timeout_s
            )
            models = self._decode(body) if status == 200 else None
        except (TransportError, TimeoutError, msgspec.DecodeError):
            return
        if models is not None:
            self._listed = frozenset(m.id for m in models.data)
            self._adapters = {
                m.id: m for m in models.data if m.parent and m.root and m.parent != m.id
            }

    async def watch(self) -> None:
        """`refresh()` every `REFRESH_S` until cancelled."""
        while True:
            await asyncio.sleep(REFRESH_S)
            await self.refresh()
