"""The routing core: read a request, score it, choose an engine, open the engine's answer.

Per request: parse the JSON body; if an index is configured, take the prompt's token ids
(given as ids, or tokenized as the engines do) and the index's scores; choose an engine
(`select.choose`); open the engine's answer as a stream; post the routed hint in the
background. An engine that refuses the connection is marked down and the request goes to
the next choice (nothing was sent yet); a failure after that is a 502.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgspec
from kvscope.index.protocol import ScoreResult
from kvscope.route import metrics
from kvscope.route.config import RouteConfig
from kvscope.route.engines import Fleet
from kvscope.route.errors import BadRequest, NoEngineUp, RouteError
from kvscope.route.index_client import IndexClient
from kvscope.route.select import Decision, choose
from kvscope.route.tokens import PromptTokenizer

if TYPE_CHECKING:
    import httpx

log = logging.getLogger(__name__)

COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"
DROPPED_HEADERS = frozenset(
    {"host", "content-length", "connection", "keep-alive", "transfer-encoding", "te",
     "upgrade", "proxy-authorization", "proxy-connection", "accept-encoding"}
)  # fmt: skip
"""Request headers not sent on: hop-by-hop, or set again by the router's own client."""
PASSED_HEADERS = ("content-type", "content-encoding", "cache-control")
"""Engine answer headers given back to the client."""


@dataclass
class Opened:
    """An engine's answer, headers read, body still to stream."""

    engine: str
    status: int
    headers: dict[str, str]
    body: AsyncIterator[bytes]


class Router:
    """Chooses engines and forwards requests; one per `kvscope route` process."""

    def __init__(
        self,
        config: RouteConfig,
        client: httpx.AsyncClient,
        fleet: Fleet,
        index: IndexClient | None,
        tokenizer: PromptTokenizer,
    ) -> None:
        self.config = config
        self.client = client
        self.fleet = fleet
        self.index = index
        self.tokenizer = tokenizer
        self._turn = 0
        self._hints: set[asyncio.Task[None]] = set()

    async def route(
        self, path: str, raw: bytes, headers: Mapping[str, str], started: float
    ) -> Opened:
        """Route one completion or chat request (`raw`: its JSON body); see the module doc."""
        request = parse_request(path, raw)
        model: str = request.get("model") or ""
        ids: list[int] | None = None
        scores: ScoreResult | None = None
        stages: dict[str, float] = {}
        if self.index is not None:
            if not model:
                raise BadRequest("'model' is required: the index scores the prompt per model")
            ids = await self.prompt_ids(path, request, stages)
            mark = time.perf_counter()
            try:
                scores = await self.index.score(ids, model)
            except RouteError:
                metrics.INDEX_ERRORS.labels("score").inc()
                raise
            stages["score"] = time.perf_counter() - mark
            metrics.STAGE.labels("score").observe(stages["score"])
        excluded: set[str] = set()
        while True:
            decision = self._choose(scores, len(ids or ()), excluded)
            if ids is not None and not excluded:
                self._record(decision, len(ids))
            overhead = time.perf_counter() - started
            metrics.OVERHEAD.observe(overhead)
            opened = await self.open(decision.name, "POST", path, raw, headers)
            if opened is not None:
                opened.headers["server-timing"] = ", ".join(
                    f"{name};dur={seconds * 1000:.3f}"
                    for name, seconds in {"kvscope-route": overhead, **stages}.items()
                )
                metrics.DECISIONS.labels(decision.name, "load" if ids is None else "index").inc()
                if ids is not None:
                    self._hint(ids, model, decision)
                return opened
            excluded.add(decision.name)

    def _choose(
        self, scores: ScoreResult | None, prompt_tokens: int, excluded: set[str]
    ) -> Decision:
        candidates = [c for c in self.fleet.candidates(scores) if c.name not in excluded]
        self._turn += 1
        return choose(candidates, prompt_tokens, self.config.affinity, self._turn)

    @staticmethod
    def _record(decision: Decision, prompt_tokens: int) -> None:
        metrics.PROMPT_TOKENS.inc(prompt_tokens)
        metrics.PREDICTED_HIT_TOKENS.labels(decision.name).inc(decision.matched_tokens)
        if decision.best_tokens > decision.matched_tokens:
            metrics.BEST_NOT_CHOSEN.inc()
            metrics.FORGONE_HIT_TOKENS.inc(decision.best_tokens - decision.matched_tokens)

    async def prompt_ids(
        self, path: str, request: Mapping[str, Any], stages: dict[str, float]
    ) -> list[int]:
        """The token ids of the request's (first) prompt, as the engines will see them; the
        time tokenizing took goes into `stages` ("tokenize")."""
        mark = time.perf_counter()
        if path == CHAT:
            ids = await self.tokenizer.chat(request)
        else:
            prompt = request["prompt"]
            first = prompt if isinstance(prompt, str) or _is_ids(prompt) else prompt[0]
            if _is_ids(first):
                return list(first)
            add_special = bool(request.get("add_special_tokens", True))
            ids = await self.tokenizer.completion(first, request.get("model") or "", add_special)
        stages["tokenize"] = time.perf_counter() - mark
        metrics.STAGE.labels("tokenize").observe(stages["tokenize"])
        return ids

    async def open(
        self, name: str, method: str, path: str, raw: bytes, headers: Mapping[str, str]
    ) -> Opened | None:
        """Send the request to engine `name`; its answer, or None when it cannot be reached
        (then it is marked down). Raises `RouteError` 502/504 for a failure after sending."""
        import httpx

        state = self.fleet.engines[name]
        sent = {k: v for k, v in headers.items() if k.lower() not in DROPPED_HEADERS}
        if self.config.token is not None:
            sent.pop("authorization", None)
        if raw:  # the router parsed it: JSON, whatever the client declared
            sent["content-type"] = "application/json"
        request = self.client.build_request(
            method, state.spec.url + path, content=raw, headers=sent
        )
        self.fleet.acquire(name)
        try:
            answer = await self.client.send(request, stream=True)
        except (httpx.ConnectError, httpx.ConnectTimeout):
            self.fleet.release(name)
            self.fleet.mark_down(name, "connect")
            return None
        except httpx.HTTPError as exc:
            self.fleet.release(name)
            kind = "timeout" if isinstance(exc, httpx.TimeoutException) else "protocol"
            metrics.ENGINE_ERRORS.labels(name, kind).inc()
            raise RouteError(
                f"engine {name} failed: {type(exc).__name__}: {exc}",
                status=504 if kind == "timeout" else 502,
            ) from None
        if answer.status_code >= 500:
            metrics.ENGINE_ERRORS.labels(name, "status").inc()
        passed = {k: answer.headers[k] for k in PASSED_HEADERS if k in answer.headers}
        passed["x-kvscope-engine"] = name
        return Opened(name, answer.status_code, passed, self._relay(name, answer))

    async def _relay(self, name: str, answer: httpx.Response) -> AsyncIterator[bytes]:
        """The engine's body chunk by chunk as it arrives; the request ends with it."""
        import httpx

        try:
            async for chunk in answer.aiter_raw():
                yield chunk
        except httpx.HTTPError as exc:
            metrics.ENGINE_ERRORS.labels(name, "stream").inc()
            log.warning("engine %s broke off an answer: %s", name, exc)
        finally:
            await answer.aclose()
            self.fleet.release(name)

    async def forward_any(self, method: str, path: str, headers: Mapping[str, str]) -> Opened:
        """A request any engine can answer (`/v1/models`): the first one that is up."""
        for name in self.fleet.up_names():
            opened = await self.open(name, method, path, b"", headers)
            if opened is not None:
                return opened
        raise NoEngineUp("no engine is up")

    def _hint(self, ids: Sequence[int], model: str, decision: Decision) -> None:
        """Post the routed hint without holding up the request."""
        task = asyncio.create_task(self._post_hint(ids, model, decision))
        self._hints.add(task)
        task.add_done_callback(self._hints.discard)

    async def _post_hint(self, ids: Sequence[int], model: str, decision: Decision) -> None:
        assert self.index is not None
        try:
            await self.index.routed(ids, model, decision.name, decision.dp_rank)
        except Exception as exc:  # a lost hint costs a little affinity, never a request
            metrics.INDEX_ERRORS.labels("routed").inc()
            log.debug("routed hint lost: %s", exc)


def _is_ids(value: object) -> bool:
    """A prompt given as token ids: a non-empty list of ints."""
    return isinstance(value, list) and bool(value) and all(type(v) is int for v in value)


def parse_request(path: str, raw: bytes) -> dict[str, Any]:
    """The JSON body of a completion or chat request; `BadRequest` naming what is wrong."""
    try:
        request = msgspec.json.decode(raw)
    except msgspec.DecodeError as exc:
        raise BadRequest(f"the body is not JSON: {exc}") from None
    if not isinstance(request, dict):
        raise BadRequest("the body must be a JSON object")
    model = request.get("model")
    if model is not None and not isinstance(model, str):
        raise BadRequest("'model' must be a string")
    if "stream" in request and not isinstance(request["stream"], bool):
        raise BadRequest("'stream' must be true or false")
    if path == COMPLETIONS:
        prompt = request.get("prompt")
        if not (
            (isinstance(prompt, str) and prompt)
            or _is_ids(prompt)
            or (isinstance(prompt, list) and prompt and all(
                (isinstance(p, str) and p) or _is_ids(p) for p in prompt))
        ):  # fmt: skip
            raise BadRequest(
                "'prompt' must be a non-empty string, a list of token ids, or a list of either"
            )
    else:
        messages = request.get("messages")
        if not (
            isinstance(messages, list) and messages and all(isinstance(m, dict) for m in messages)
        ):
            raise BadRequest("'messages' must be a non-empty list of message objects")
    return request
