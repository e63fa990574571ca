"""How the router asks kvscope's index: a small `IndexClient` contract, over HTTP or in process.

`score(token_ids, model)` answers every source's cached prefix of a prompt; `routed(...)`
tells the index where the router sent it (a speculative entry that holds until the
engine's own events arrive, as llm-d's and Dynamo's predict-on-route entries do). Any
failure to score is an `IndexUnavailable` (the router answers 503); a lost routed hint
only costs a little affinity and is counted, not raised.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

import msgspec
from kvscope.index.protocol import ScoreResult
from kvscope.route.errors import BadRequest, IndexUnavailable

if TYPE_CHECKING:
    import httpx


class IndexClient(Protocol):
    """What the router needs from an index."""

    async def score(self, token_ids: Sequence[int], model: str) -> ScoreResult:
        """Every source's cached prefix of `token_ids`; `IndexUnavailable` when it cannot say."""
        ...

    async def routed(
        self, token_ids: Sequence[int], model: str, instance: str, dp_rank: int
    ) -> None:
        """Record that the prompt was sent to (`instance`, `dp_rank`)."""
        ...


class HttpIndexClient:
    """`kvscope index` over HTTP (`POST /score`, `POST /routed`), on the router's client.

    Sends token ids with the model and lets the index hash them the way the engines do.
    """

    def __init__(
        self, client: httpx.AsyncClient, url: str, *, token: str | None, timeout_s: float
    ) -> None:
        self._client = client
        self.url = url.rstrip("/")
        self._headers = {"Content-Type": "application/json"}
        if token:
            self._headers["Authorization"] = f"Bearer {token}"
        self._timeout_s = timeout_s
        self._decode = msgspec.json.Decoder(ScoreResult).decode

    async def score(self, token_ids: Sequence[int], model: str) -> ScoreResult:
        """POST /score. No source of the model yet: empty scores (nothing is cached). The
        index refusing the prompt (400) is `BadRequest`; any other failure (transport, other
        status, a bad body) is `IndexUnavailable`."""
        import httpx

        body = msgspec.json.encode({"token_ids": token_ids, "model": model})
        try:
            answer = await self._client.post(
                f"{self.url}/score", content=body, headers=self._headers, timeout=self._timeout_s
            )
        except httpx.HTTPError as exc:
            raise IndexUnavailable(
                f"the index at {self.url} is unreachable ({type(exc).__name__}: {exc}); "
                "start `kvscope index` or fix --index"
            ) from None
        if answer.status_code == 404 and b"no source of model" in answer.content:
            return ScoreResult()  # nothing of this model published yet: nothing cached
        if answer.status_code == 400:
            raise BadRequest(f"the index refused the prompt: {answer.text[:300]}")
        if answer.status_code != 200:
            raise IndexUnavailable(
                f"the index at {self.url} answered {answer.status_code}: {answer.text[:200]}"
            )
        try:
            return self._decode(answer.content)
        except msgspec.DecodeError as exc:
            raise IndexUnavailable(f"the index at {self.url} sent a bad answer: {exc}") from None

    async def routed(
        self, token_ids: Sequence[int], model: str, instance: str, dp_rank: int
    ) -> None:
        """POST /routed; raises `httpx.HTTPError` or `IndexUnavailable` on failure."""
        body = msgspec.json.encode(
            {"token_ids": token_ids, "model": model, "instance": instance, "dp_rank": dp_rank}
        )
        answer = await self._client.post(
            f"{self.url}/routed", content=body, headers=self._headers, timeout=self._timeout_s
        )
        if answer.status_code != 200:
            raise IndexUnavailable(f"the index at {self.url} refused /routed: {answer.status_code}")


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


BlockHashes = Callable[[Sequence[int], int], list[int]]
"""Token ids and a block size -> the engines' block hashes (`BlockHasher.block_hashes`)."""


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

    def _prompt_hashes(self, token_ids: Sequence[int], model: str) -> list[int] | None:
        problem = self._failure()
        if problem:
            raise IndexUnavailable(problem)
        block_size = self._index.block_size(model)
        return self._hashes(token_ids, block_size) if block_size else None

    async def score(self, token_ids: Sequence[int], model: str) -> ScoreResult:
        """The index's scores, as the HTTP client would return them (none before the
        model's engines published a block: nothing of it is cached)."""
        hashes = self._prompt_hashes(token_ids, model)
        if hashes is None:
            return ScoreResult()
        return self._index.score(hashes, model=model)

    async def routed(
        self, token_ids: Sequence[int], model: str, instance: str, dp_rank: int
    ) -> None:
        """Add the speculative entry directly."""
        hashes = self._prompt_hashes(token_ids, model)
        if hashes is not None:
            self._index.add_routed(hashes, instance, dp_rank, ttl_s=self._routed_ttl_s)
