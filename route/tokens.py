"""Text prompts into the token ids the engines will see, so the index can score them.

Two ways, one contract (`PromptTokenizer`):
- `EngineTokenizer` asks an engine's own `POST /tokenize` (vLLM serves it, chat requests
  through the engine's chat template): always exactly what the engine does, one local round
  trip more per request. One engine per request (the least loaded), within a budget: its
  failure or slowness is the request's (`TokenizeFailed`: routed by load), never a reason to
  take the engine out of rotation; its 4xx is the client's error, passed on.
- `LocalTokenizer` runs the same Hugging Face tokenizer in the router (`--tokenizer`):
  no round trip, but the operator must give the engines' tokenizer (and chat template).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

import msgspec
from kvscope.route.engines import Fleet
from kvscope.route.errors import BadRequest, TokenizeFailed
from kvscope.route.http_client import HttpClient, TransportError
from kvscope.schemas.errors import ConfigError

JSON = {"Content-Type": "application/json"}

CHAT_FIELDS = (
    "model",
    "messages",
    "add_generation_prompt",
    "continue_final_message",
    "add_special_tokens",
    "chat_template",
    "chat_template_kwargs",
    "tools",
)
"""Fields of a chat request that change its tokens (sent on to the engine's /tokenize)."""


class PromptTokenizer(Protocol):
    """Token ids of a completion prompt or a chat request, as the engines compute them."""

    async def completion(self, prompt: str, model: str, add_special_tokens: bool) -> list[int]:
        """The ids of a text prompt of `/v1/completions`."""
        ...

    async def chat(self, request: Mapping[str, Any]) -> list[int]:
        """The ids of a `/v1/chat/completions` request (its messages through the template)."""
        ...


class _Tokens(msgspec.Struct):
    tokens: list[int]


class _EngineError(msgspec.Struct):
    message: str = ""


class _EngineErrorBody(msgspec.Struct):
    error: _EngineError | str | None = None
    message: str | None = None


class EngineTokenizer:
    """The least loaded up engine's `/tokenize`; a refused request (4xx) is the client's
    error, any other failure `TokenizeFailed`. `headers` go with each call (the engines'
    API key)."""

    def __init__(
        self,
        client: HttpClient,
        fleet: Fleet,
        timeout_s: float,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self._client = client
        self._fleet = fleet
        self._timeout_s = timeout_s
        self._headers = {**JSON, **(headers or {})}
        self._decode = msgspec.json.Decoder(_Tokens).decode

    async def completion(self, prompt: str, model: str, add_special_tokens: bool) -> list[int]:
        """POST /tokenize {"prompt"}."""
        return await self._ask(
            {"model": model, "prompt": prompt, "add_special_tokens": add_special_tokens}
        )

    async def chat(self, request: Mapping[str, Any]) -> list[int]:
        """POST /tokenize {"messages", ...} (the engine applies its chat template)."""
        return await self._ask({k: request[k] for k in CHAT_FIELDS if k in request})

    async def _ask(self, body: Mapping[str, Any]) -> list[int]:
        up = self._fleet.up_names()
        if not up:
            raise TokenizeFailed("no engine is up to tokenize the prompt")
        name = min(up, key=self._fleet.load)
        url = self._fleet.engines[name].spec.url
        try:
            status, answer = await self._client.fetch(
                "POST", f"{url}/tokenize", self._headers, self._timeout_s,
                msgspec.json.encode(body),
            )  # fmt: skip
        except TransportError as exc:
            raise TokenizeFailed(f"{name}'s /tokenize failed: {exc}") from None
        except TimeoutError:
            raise TokenizeFailed(f"{name}'s /tokenize did not answer in time") from None
        if 400 <= status < 500:
            raise BadRequest(_engine_message(answer), status=status)
        if status == 200:
            try:
                return self._decode(answer).tokens
            except msgspec.DecodeError:
                pass
        raise TokenizeFailed(f"{name}'s /tokenize answered {status}")


def _engine_message(content: bytes) -> str:
    """The message of an engine's JSON error (OpenAI or FastAPI shape), else its text."""
    try:
        body = msgspec.json.decode(content, type=_EngineErrorBody)
    except msgspec.DecodeError:
        return content.decode(errors="replace")[:500]
    if isinstance(body.error, _EngineError) and body.error.message:
        return body.error.message
    return body.message or (body.error if isinstance(body.error, str) else "") or "rejected"


class LocalTokenizer:
    """A Hugging Face tokenizer loaded in the router (`--tokenizer PATH_OR_NAME`)."""

    def __init__(self, name_or_path: str) -> None:
        try:
            from transformers import AutoTokenizer
        except ImportError:
            raise ConfigError(
                "--tokenizer needs transformers: pip install 'kvscope[route]'"
            ) from None
        try:
            self._tokenizer: Any = AutoTokenizer.from_pretrained(name_or_path)
        except (OSError, ValueError) as exc:
            raise ConfigError(f"--tokenizer {name_or_path}: cannot load it ({exc})") from None
        backend = _backend_encode(self._tokenizer)
        self._encode: Callable[..., list[int]] = backend or self._tokenizer.encode

    async def completion(self, prompt: str, model: str, add_special_tokens: bool) -> list[int]:
        """The tokenizer's ids of the text, special tokens as the engine adds them."""
        return self._encode(prompt, add_special_tokens=add_special_tokens)

    async def chat(self, request: Mapping[str, Any]) -> list[int]:
        """The messages through the tokenizer's chat template."""
        try:
            ids = self._tokenizer.apply_chat_template(
                request["messages"],
                tools=request.get("tools"),
                chat_template=request.get("chat_template"),
                add_generation_prompt=request.get("add_generation_prompt", True),
                continue_final_message=request.get("continue_final_message", False),
                tokenize=True,
                return_dict=False,
                **(request.get("chat_template_kwargs") or {}),
            )
        except Exception as exc:  # the client's messages and template: any failure is theirs
            raise BadRequest(f"cannot apply the chat template: {exc}") from None
        return [int(i) for i in ids]


def _backend_encode(tokenizer: Any) -> Callable[..., list[int]] | None:
    """The `tokenizers` library's own encode behind a fast Hugging Face tokenizer, set as
    `transformers`' `encode` sets it for a call without truncation or padding: the same
    ids without the wrapper's work (2-20% of a call's CPU for 100-10,000 characters on the
    test tokenizer, 2026-11-29); None for a tokenizer without one."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    backend.no_truncation()
    backend.no_padding()
    backend.encode_special_tokens = bool(getattr(tokenizer, "split_special_tokens", False))

    def encode(text: str, add_special_tokens: bool) -> list[int]:
        ids: list[int] = backend.encode(text, add_special_tokens=add_special_tokens).ids
        return ids

    return encode
