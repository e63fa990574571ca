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
from typing import TYPE_CHECKING

import msgspec
from kvscope.route.engines import Fleet

if TYPE_CHECKING:
    import httpx


class Adapter(msgspec.Struct):
    """One entry of `/v1/models`: an adapter has a `parent` (its base model) and a `root`
    (the path vLLM hashes)."""

    id: str
    root: str | None = None
    parent: str | None = None


class _Models(msgspec.Struct):
    data: list[Adapter] = msgspec.field(default_factory=list)


class Loras:
    """The adapters by name, as the engines last listed them."""

    def __init__(self) -> None:
        self._adapters: dict[str, Adapter] = {}
        self._decode = msgspec.json.Decoder(_Models).decode

    def get(self, model: str) -> Adapter | None:
        """The adapter a request's `model` names, or None (a base model, or unknown)."""
        return self._adapters.get(model)

    async def refresh(
        self, client: httpx.AsyncClient, fleet: Fleet, headers: Mapping[str, str], timeout_s: float
    ) -> None:
        """Read `/v1/models` of the first up engine; keep what is known on any failure."""
        import httpx

        up = fleet.up_names()
        if not up:
            return
        url = fleet.engines[up[0]].spec.url
        try:
            answer = await client.get(f"{url}/v1/models", headers=headers, timeout=timeout_s)
            models = self._decode(answer.content) if answer.status_code == 200 else None
        except (httpx.HTTPError, msgspec.DecodeError):
            return
        if models is not None:
            self._adapters = {
                m.id: m for m in models.data if m.parent and m.root and m.parent != m.id
            }

    async def watch(
        self,
        client: httpx.AsyncClient,
        fleet: Fleet,
        headers: Mapping[str, str],
        interval_s: float,
        timeout_s: float,
    ) -> None:
        """`refresh()` every `interval_s` until cancelled."""
        while True:
            await asyncio.sleep(interval_s)
            await self.refresh(client, fleet, headers, timeout_s)
