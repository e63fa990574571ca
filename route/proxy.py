"""The routing core: read a request, score it, choose an engine, open the engine's answer.

Per request: parse the JSON body; if an index is configured and answering, take the
prompt's token ids (given as ids, or tokenized by one engine within a budget; at most
`max_hash_tokens` of them) and the index's scores within its budget (`index_gate`: a
failing index means routing by load, never a refused request); choose an engine
(`select.choose`); open the engine's answer; post the routed hint in the background.

An engine that refuses the connection is marked down and the request goes to the next
choice (nothing was sent yet); a failure after that is a 502 (504 on a timeout). Every
fault of an engine's own (5xx, failed connection, break-off) counts toward its ejection
(`engines.Fleet`). A non-streamed answer is read whole (up to `max_answer_bytes`) before
the client gets it, so an engine breaking off becomes a 502; a stream broken off ends with
an SSE error event and a dropped connection (`BrokenOff`), never a clean end without
`[DONE]`.

Headers: hop-by-hop ones are dropped; the client's `Accept-Encoding` passes unchanged and
the engine's encoded bytes come back with their `content-encoding`. `Authorization`: the
engines' API key when one is configured, else the client's own unless it was the router's
token.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import msgspec
from kvscope.index.protocol import ScoreResult
from kvscope.route import metrics
from kvscope.route.config import RouteConfig
from kvscope.route.engines import Fleet
from kvscope.route.errors import BadRequest, NoEngineUp, RouteError, TokenizeFailed
from kvscope.route.http_client import Answer, HttpClient, TransportError
from kvscope.route.index_client import Prompt
from kvscope.route.index_gate import INDEX, IndexGate
from kvscope.route.lora import Loras
from kvscope.route.select import Decision, choose
from kvscope.route.tokens import PromptTokenizer

log = logging.getLogger(__name__)

COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"
DROPPED_HEADERS = frozenset(
    {"host", "content-length", "connection", "keep-alive", "transfer-encoding", "te",
     "upgrade", "proxy-authorization", "proxy-connection"}
)  # fmt: skip
"""Request headers not sent on: hop-by-hop, or set again by the router's own client."""
PASSED_HEADERS = ("content-type", "content-encoding", "cache-control")
"""Engine answer headers given back to the client."""
CHARS_PER_TOKEN = 16
"""A text prompt longer than `max_hash_tokens` times this is cut before tokenizing (no
tokenizer makes tokens longer on average), and its last token dropped (the cut may split it)."""
INDEX_POLL_S = 1.0
"""The index's /healthz is polled at least this often: an index that said it is not ready
is skipped until a poll says otherwise, so the poll bounds how long routing stays by load
after it caught up."""
NO_TOKENS = "no_tokens"
"""The basis of a request whose prompt could not be tokenized in time."""


class BrokenOff(Exception):
    """An engine broke off a streamed answer: the client's connection is dropped
    (`relay.Relayed`) so the answer cannot pass for complete."""


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
        client: HttpClient,
        fleet: Fleet,
        gate: IndexGate,
        tokenizer: PromptTokenizer,
    ) -> None:
        self.config = config
        self.client = client
        self.fleet = fleet
        self.gate = gate
        self.tokenizer = tokenizer
        self._turn = 0
        self._hints: set[asyncio.Task[None]] = set()
        self._engine_auth = engine_auth(config)
        self.loras = Loras(client, fleet, self._engine_auth, config.connect_timeout_s)

    async def route(
        self, path: str, raw: bytes, headers: Mapping[str, str], started: float
    ) -> Opened:
        """Route one completion or chat request (`raw`: its JSON body); see the module doc."""
        request = parse_request(path, raw)
        model: str = request.get("model") or ""
        if self.gate.index is not None and not model:
            raise BadRequest("'model' is required: the index scores the prompt per model")
        stages: dict[str, float] = {}
        prompt, scores, basis = None, None, await self.gate.skip() or INDEX
        if basis == INDEX:
            ids = await self.prompt_ids(path, request, stages)
            basis = NO_TOKENS
            if ids is not None:
                prompt = await self._prompt(ids, model, request.get("cache_salt"))
                mark = time.perf_counter()
                scores, basis = await self.gate.score(prompt)
                stages["score"] = time.perf_counter() - mark
                metrics.STAGE.labels("score").observe(stages["score"])
        prompt_tokens = len(prompt.token_ids) if prompt is not None else 0
        stream = bool(request.get("stream"))
        excluded: set[str] = set()
        while True:
            decision = self._choose(scores, prompt_tokens, excluded)
            if scores is not None and not excluded:
                self._record(decision, prompt_tokens)
            overhead = time.perf_counter() - started
            metrics.OVERHEAD.observe(overhead)
            opened = await self.open(decision.name, "POST", path, raw, headers, stream)
            if opened is not None:
                opened.headers["server-timing"] = ", ".join(
                    f"{name};dur={seconds * 1000:.3f}"
                    for name, seconds in {"kvscope-route": overhead, **stages}.items()
                )
                metrics.DECISIONS.labels(decision.name, basis).inc()
                if scores is not None and prompt is not None:
                    self._hint(prompt, decision)
                return opened
            excluded.add(decision.name)

    @contextlib.asynccontextmanager
    async def watching(self) -> AsyncIterator[None]:
        """Check the engines' health, the index's and the engines' LoRA adapters now, then
        in the background while the block runs (the app's lifespan): the engines' health and
        the index's every `--health-interval` (at most `INDEX_POLL_S`) where the traffic
        does not show it already, the adapters every `lora.REFRESH_S`."""
        config, client = self.config, self.client
        timeout_s = config.connect_timeout_s
        await asyncio.gather(
            self.fleet.check_health(client, timeout_s, self._engine_auth), self.gate.poll()
        )
        await self.loras.refresh()
        watch = asyncio.gather(
            self.fleet.watch_health(client, config.health_interval_s, timeout_s,
                                    self._engine_auth),
            self.gate.watch(min(config.health_interval_s, INDEX_POLL_S)),
            self.loras.watch(),
        )  # fmt: skip
        try:
            yield
        finally:
            watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watch

    async def _prompt(self, ids: list[int], model: str, salt: str | None) -> Prompt:
        """The prompt as the engines hash it: a LoRA adapter's under its base model."""
        adapter = await self.loras.get(model)
        if adapter is None or adapter.parent is None:
            return Prompt(ids, model, cache_salt=salt)
        return Prompt(ids, adapter.parent, lora_name=model, lora_path=adapter.root, cache_salt=salt)

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
    ) -> list[int] | None:
        """The leading (at most `max_hash_tokens`) token ids of the request's (first) prompt,
        as the engines will see them; None when tokenizing failed or ran over its budget (the
        request is then routed by load). The time tokenizing took goes into `stages`."""
        cap = self.config.max_hash_tokens
        mark = time.perf_counter()
        cut = False
        try:
            if path == CHAT:
                ids = await self._tokenize(self.tokenizer.chat(request))
            else:
                prompt = request["prompt"]
                first = prompt if isinstance(prompt, str) or _is_ids(prompt) else prompt[0]
                if _is_ids(first):
                    return self._capped(list(first))
                cut = len(first) > cap * CHARS_PER_TOKEN
                text = first[: cap * CHARS_PER_TOKEN]
                add_special = bool(request.get("add_special_tokens", True))
                asked = self.tokenizer.completion(text, request.get("model") or "", add_special)
                ids = await self._tokenize(asked)
        except TokenizeFailed as exc:
            log.debug("routing by load: %s", exc)
            return None
        finally:
            stages["tokenize"] = time.perf_counter() - mark
            metrics.STAGE.labels("tokenize").observe(stages["tokenize"])
        return self._capped(ids[:-1] if cut else ids)

    async def _tokenize(self, asked: Awaitable[list[int]]) -> list[int]:
        try:
            async with asyncio.timeout(self.config.tokenize_timeout_s):
                return await asked
        except TimeoutError:
            raise TokenizeFailed("tokenizing ran over --tokenize-timeout") from None

    def _capped(self, ids: list[int]) -> list[int]:
        if len(ids) <= self.config.max_hash_tokens:
            return ids
        metrics.CAPPED_PROMPTS.inc()
        return ids[: self.config.max_hash_tokens]

    def engine_headers(self, headers: Mapping[str, str]) -> dict[str, str]:
        """The client's headers as sent on to an engine (see the module doc)."""
        sent = {k: v for k, v in headers.items() if k.lower() not in DROPPED_HEADERS}
        if self._engine_auth or self.config.token is not None:
            sent = {k: v for k, v in sent.items() if k.lower() != "authorization"}
        return {**sent, **self._engine_auth}

    async def open(
        self,
        name: str,
        method: str,
        path: str,
        raw: bytes,
        headers: Mapping[str, str],
        stream: bool = False,
    ) -> Opened | None:
        """Send the request to engine `name`; its answer, or None when it cannot be reached
        (then it is marked down). Raises `RouteError` 502/504 for a failure after sending."""
        sent = self.engine_headers(headers)
        if raw:  # the router parsed it: JSON, whatever the client declared
            sent["content-type"] = "application/json"
        ticket = self.fleet.sent(name, stream)
        try:
            answer = await self.client.open(
                method, self.fleet.engines[name].spec.url + path, raw, sent
            )
        except TransportError as exc:
            self.fleet.finished(name, ticket)
            self.fleet.failed(name, exc.kind)
            if exc.kind == "connect":
                self.fleet.mark_down(name, "connect")
                return None
            raise RouteError(
                f"engine {name} failed: {exc}", status=504 if exc.kind == "timeout" else 502
            ) from None
        self.fleet.answered(name, ticket)
        if answer.status >= 500:
            self.fleet.failed(name, "status")
        else:
            self.fleet.succeeded(name)
        passed = {k: answer.headers[k] for k in PASSED_HEADERS if k in answer.headers}
        passed["x-kvscope-engine"] = name
        if stream and answer.status == 200:
            body = self._relay(name, ticket, answer, [], answer.chunks(), sse=True)
        else:
            body = await self._read(name, ticket, answer)
        return Opened(name, answer.status, passed, body)

    async def _read(self, name: str, ticket: int, answer: Answer) -> AsyncIterator[bytes]:
        """A non-streamed answer read whole before the client sees any of it (a break-off is
        a 502); past `max_answer_bytes` the rest is relayed as it arrives."""
        chunks: list[bytes] = []
        size = 0
        rest = answer.chunks()
        try:
            async for chunk in rest:
                chunks.append(chunk)
                size += len(chunk)
                if size > self.config.max_answer_bytes:
                    return self._relay(name, ticket, answer, chunks, rest, sse=False)
        except TransportError as exc:
            answer.release()
            self.fleet.finished(name, ticket)
            self._broke_off(name, exc)
            raise RouteError(f"engine {name} broke off its answer: {exc}", status=502) from None
        answer.release()
        self.fleet.finished(name, ticket)
        return _once(b"".join(chunks))

    async def _relay(
        self,
        name: str,
        ticket: int,
        answer: Answer,
        read: Iterable[bytes],
        rest: AsyncIterator[bytes],
        *,
        sse: bool,
    ) -> AsyncIterator[bytes]:
        """The engine's body chunk by chunk as it arrives (after `read`, what was read of it
        already); a break-off ends it with an SSE error event (`sse`) and `BrokenOff`."""
        try:
            for chunk in read:
                yield chunk
            async for chunk in rest:
                yield chunk
        except TransportError as exc:
            self._broke_off(name, exc)
            if sse:
                message = f"engine {name} broke off the answer ({exc.kind})"
                error = {"message": message, "type": "engine_error", "code": 502}
                yield b"data: " + msgspec.json.encode({"error": error}) + b"\n\n"
            raise BrokenOff(name) from None
        finally:
            answer.release()
            self.fleet.finished(name, ticket)

    def _broke_off(self, name: str, exc: TransportError) -> None:
        metrics.BREAK_OFFS.labels(name).inc()
        self.fleet.failed(name, "stream")
        log.warning("engine %s broke off an answer: %s", name, exc)

    async def forward_any(self, method: str, path: str, headers: Mapping[str, str]) -> Opened:
        """A request any engine can answer (`/v1/models`): the first one that is up."""
        for name in self.fleet.up_names():
            opened = await self.open(name, method, path, b"", headers)
            if opened is not None:
                return opened
        raise NoEngineUp("no engine is up")

    def _hint(self, prompt: Prompt, decision: Decision) -> None:
        """Post the routed hint without holding up the request."""
        task = asyncio.create_task(self._post_hint(prompt, decision))
        self._hints.add(task)
        task.add_done_callback(self._hints.discard)

    async def _post_hint(self, prompt: Prompt, decision: Decision) -> None:
        assert self.gate.index is not None
        try:
            known = await self.gate.index.routed(prompt, decision.name, decision.dp_rank)
        except Exception as exc:  # a lost hint costs a little affinity, never a request
            metrics.INDEX_ERRORS.labels("routed").inc()
            log.debug("routed hint lost: %s", exc)
            return
        if not known:
            metrics.HINTS_UNKNOWN.inc()


def engine_auth(config: RouteConfig) -> dict[str, str]:
    """The header that carries the engines' API key to them (none without a key)."""
    return {"authorization": f"Bearer {config.engine_api_key}"} if config.engine_api_key else {}


async def _once(body: bytes) -> AsyncIterator[bytes]:
    """`body` as a one-chunk stream."""
    yield body


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
    salt = request.get("cache_salt")
    if salt is not None and not (isinstance(salt, str) and salt):
        raise BadRequest("'cache_salt' must be a non-empty string")
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
