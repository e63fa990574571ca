"""How the router asks kvscope's index: a small `IndexClient` contract, over HTTP or in process.

`score(token_ids, model)` answers every source's cached prefix of a prompt; `routed(...)`
tells the index where the router sent it (a speculative entry that holds until the
engine's own events arrive, as llm-d's and Dynamo's predict-on-route entries do); `health()`
says whether the index can answer. Any failure to score is an `IndexUnavailable`
(`IndexRefused` for a refused token), which the router turns into routing by load
(`index_gate.IndexGate`); a lost routed hint only costs a little affinity and is counted.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

import msgspec
from kvscope.index.protocol import RoutedRequest, ScoreRequest, ScoreResult
from kvscope.route.errors import BadRequest, IndexRefused, IndexUnavailable
from kvscope.route.index_transport import IndexTransport, TransportError
from kvscope.schemas.errors import KvscopeError

if TYPE_CHECKING:
    from kvscope.route.http_client import HttpClient


@dataclasses.dataclass(frozen=True)
class Prompt:
    """A prompt as the engines hash it: its token ids, model, and what else keys its blocks."""

    token_ids: Sequence[int]
    model: str
    lora_name: str | None = None
    """The LoRA adapter's name (vLLM hashes name and path into every block)."""
    lora_path: str | None = None
    cache_salt: str | None = None
    """The request's `cache_salt` (vLLM salts the first block's hash with it)."""

    def body(self, instance: str | None = None, dp_rank: int = 0) -> bytes:
        """The JSON of a /score body (or of a /routed body, given `instance`)."""
        ids = list(self.token_ids)
        if instance is None:
            return msgspec.json.encode(
                ScoreRequest(token_ids=ids, model=self.model, lora_name=self.lora_name,
                             lora_path=self.lora_path, cache_salt=self.cache_salt)
            )  # fmt: skip
        return msgspec.json.encode(
            RoutedRequest(token_ids=ids, model=self.model, lora_name=self.lora_name,
                          lora_path=self.lora_path, cache_salt=self.cache_salt,
                          instance=instance, dp_rank=dp_rank)
        )  # fmt: skip


Health = tuple[str, str]
"""An index's state ("ok", "down", "not_ready") and why, in a few words ("" when ok)."""


class IndexClient(Protocol):
    """What the router needs from an index."""

    async def score(self, prompt: Prompt) -> ScoreResult:
        """Every source's cached prefix of the prompt; `IndexUnavailable` when it cannot say."""
        ...

    async def routed(self, prompt: Prompt, instance: str, dp_rank: int) -> bool:
        """Record that the prompt was sent to (`instance`, `dp_rank`); False when the index
        does not know that source yet (it has not published)."""
        ...

    async def health(self) -> Health:
        """Whether the index can answer now."""
        ...


class HttpIndexClient:
    """`kvscope index` over HTTP (`POST /score`, `POST /routed`).

    Sends token ids with the model and lets the index hash them the way the engines do,
    through the router's one HTTP client (`index_transport`).
    """

    def __init__(
        self, client: HttpClient, url: str, *, token: str | None, timeout_s: float
    ) -> None:
        self.url = url.rstrip("/")
        self._headers = {"Content-Type": "application/json"}
        if token:
            self._headers["Authorization"] = f"Bearer {token}"
        self._transport = IndexTransport(self.url, self._headers, client)
        self._timeout_s = timeout_s
        self._decode = msgspec.json.Decoder(ScoreResult).decode

    async def _post(self, path: str, body: bytes, timeout_s: float) -> tuple[int, bytes]:
        """POST to the index; `IndexUnavailable` when no answer came (a `TimeoutError` after
        `timeout_s` passes through: the gate counts it as the budget running out)."""
        try:
            return await self._transport.post(path, body, timeout_s)
        except TransportError as exc:
            raise IndexUnavailable(
                f"the index at {self.url} is unreachable ({exc}); "
                "start `kvscope index` or fix --index"
            ) from None

    async def score(self, prompt: Prompt) -> ScoreResult:
        """POST /score. No source of the model yet: empty scores (nothing is cached). The
        index refusing the prompt (400) is `BadRequest`, the token (401/403) `IndexRefused`;
        any other failure (transport, other status, a bad body) is `IndexUnavailable`."""
        status, answer = await self._post("/score", prompt.body(), self._timeout_s)
        if status == 404 and b"no source of model" in answer:
            return ScoreResult()  # nothing of this model published yet: nothing cached
        text = answer[:300].decode(errors="replace")
        if status == 400:
            raise BadRequest(f"the index refused the prompt: {text}")
        if status in (401, 403):
            raise IndexRefused(f"the index at {self.url} refused the token; fix --index-token")
        if status != 200:
            raise IndexUnavailable(f"the index at {self.url} answered {status}: {text[:200]}")
        try:
            return self._decode(answer)
        except msgspec.DecodeError as exc:
            raise IndexUnavailable(f"the index at {self.url} sent a bad answer: {exc}") from None

    async def routed(self, prompt: Prompt, instance: str, dp_rank: int) -> bool:
        """POST /routed (False: a 404, the source or model unknown yet); raises
        `IndexUnavailable` or `TimeoutError` on failure."""
        status, _ = await self._post(
            "/routed", prompt.body(instance, dp_rank), max(self._timeout_s, 1.0)
        )
        if status == 404:
            return False
        if status != 200:
            raise IndexUnavailable(f"the index at {self.url} refused /routed: {status}")
        return True

    async def health(self) -> Health:
        """GET /healthz: 200 ok, 503 not ready (catching up), anything else down."""
        try:
            status, _ = await self._transport.get("/healthz", max(self._timeout_s, 1.0))
        except TransportError as exc:
            return "down", f"unreachable ({exc})"
        except TimeoutError:
            return "down", "no answer to /healthz in time"
        if status == 200:
            return "ok", ""
        if status == 503:
            return "not_ready", "catching up with its feed"
        return "down", f"/healthz answered {status}"


class PrefixIndexLike(Protocol):
    """The part of `kvscope.index.state.PrefixIndex` the router uses."""

    def score(self, block_hashes: Sequence[int], *, model: str | None = None) -> ScoreResult:
        """Every source's cached prefix of the blocks."""
        ...

    def add_routed(
        self, block_hashes: Sequence[int], instance: str, dp_rank: int, *, ttl_s: float
    ) -> object:
        """A speculative entry for a routed prompt (False: the source is unknown)."""
        ...

    def block_size(self, model: str) -> int:
        """The block size `model`'s sources publish (0: none has published yet)."""
        ...


BlockHashes = Callable[..., list[int]]
"""Token ids and a block size (keywords: lora_name, lora_path, cache_salt, given only when
set) -> the engines' block hashes: `BlockHasher.block_hashes`."""


class InProcessIndexClient:
    """A `PrefixIndex` in this process (`kvscope route --index-bootstrap-servers`, tests).

    `block_hashes` turns a prompt's token ids into the engines' block hashes at the block
    size the model's sources publish (a `BlockHasher` set up like the engines: algorithm
    and seed). `failure()` says why the index cannot be trusted any more (its feed
    stopped), None while it can.
    """

    def __init__(
        self,
        index: PrefixIndexLike,
        block_hashes: BlockHashes,
        *,
        routed_ttl_s: float = 2.0,
        failure: Callable[[], str | None] = lambda: None,
    ) -> None:
        self._index = index
        self._hashes = block_hashes
        self._routed_ttl_s = routed_ttl_s
        self._failure = failure

    def _prompt_hashes(self, prompt: Prompt) -> list[int] | None:
        problem = self._failure()
        if problem:
            raise IndexUnavailable(problem)
        block_size = self._index.block_size(prompt.model)
        if not block_size:
            return None
        keys = {"lora_name": prompt.lora_name, "lora_path": prompt.lora_path,
                "cache_salt": prompt.cache_salt}  # fmt: skip
        try:
            return self._hashes(
                prompt.token_ids, block_size, **{k: v for k, v in keys.items() if v is not None}
            )
        except KvscopeError as exc:  # the hasher's config error: a LoRA name without its path
            raise BadRequest(str(exc)) from None

    async def score(self, prompt: Prompt) -> ScoreResult:
        """The index's scores, as the HTTP client would return them (none before the
        model's engines published a block: nothing of it is cached)."""
        hashes = self._prompt_hashes(prompt)
        if hashes is None:
            return ScoreResult()
        return self._index.score(hashes, model=prompt.model)

    async def routed(self, prompt: Prompt, instance: str, dp_rank: int) -> bool:
        """Add the speculative entry directly (False: the source is unknown yet)."""
        hashes = self._prompt_hashes(prompt)
        if hashes is None:
            return False
        return bool(self._index.add_routed(hashes, instance, dp_rank, ttl_s=self._routed_ttl_s))

    async def health(self) -> Health:
        """Down once its feed stopped, else ok."""
        problem = self._failure()
        return ("down", problem) if problem else ("ok", "")
