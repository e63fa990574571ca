"""LoRA adapters the engines serve, so that a LoRA request's prompt is hashed as vLLM hashes it.

vLLM serves an adapter under its own model name and keys every block of a LoRA request by
`("lora", name, path)` (`_gen_lora_extra_hash_keys` in vllm/v1/core/kv_cache_utils.py);
the engine publishes those blocks under its base model. The engines' `GET /v1/models` lists
each adapter with its path (`root`) and base model (`parent`): the router reads it from an
up engine at start and at every health check, so adapters loaded at runtime are found too.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import msgspec
from kvscope.route.engines import Fleet
from kvscope.route.http_client import HttpClient, TransportError


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
        self, client: HttpClient, fleet: Fleet, headers: Mapping[str, str], timeout_s: float
    ) -> None:
        self._client = client
        self._fleet = fleet
        self._headers = headers
        self._timeout_s = timeout_s
        self._adapters: dict[str, Adapter] = {}
        self._decode = msgspec.json.Decoder(_Models).decode

    def get(self, model: str) -> Adapter | None:
        """The adapter a request's `model` names, or None (a base model, or unknown)."""
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
            self._adapters = {
                m.id: m for m in models.data if m.parent and m.root and m.parent != m.id
            }

    async def watch(self, interval_s: float) -> None:
        """`refresh()` every `interval_s` until cancelled."""
        while True:
            await asyncio.sleep(interval_s)
            await self.refresh()
