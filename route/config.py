"""`kvscope route`'s settings: the engines (instance name -> URL), the index, the listener and
the balance between cache affinity and load. One frozen dataclass; the CLI reads its defaults
from here and `validate()` names the flag at fault.
"""

from __future__ import annotations

import dataclasses
import socket
from urllib.parse import urlsplit

from kvscope.cachemodel.scoring import DEFAULT_AFFINITY
from kvscope.common.net import is_loopback, open_listener_problem, token_problem
from kvscope.index.config import IndexConfig
from kvscope.schemas.errors import ConfigError

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8100
TOKEN_ENV = "KVSCOPE_ROUTE_TOKEN"
INDEX_TOKEN_ENV = "KVSCOPE_INDEX_TOKEN"
ENGINE_API_KEY_ENV = "KVSCOPE_ENGINE_API_KEY"


@dataclasses.dataclass(frozen=True)
class EngineSpec:
    """One engine behind the router."""

    name: str
    """The instance name the engine's kvscope plugin publishes (the index's `instance`)."""
    url: str
    """Base URL of its OpenAI-compatible server, without a trailing slash."""


def instance_name(url: str) -> str:
    """The name kvscope's vLLM plugin gives the engine at `url` when KVSCOPE_INSTANCE is unset.

    The plugin names an engine `<hostname>:<port>` of the machine it runs on; an engine the
    router reaches through loopback runs here, so loopback becomes this machine's hostname.
    """
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    if is_loopback(host):
        host = socket.gethostname()
    return f"{host}:{port}"


def parse_engines(text: str) -> tuple[EngineSpec, ...]:
    """`--engines`: comma-separated `URL` or `NAME=URL` items (NAME: the engine's instance).

    A bare URL is named as the plugin names the engine by default (`instance_name`).
    """
    specs: list[EngineSpec] = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        name, sep, url = item.partition("=")
        if not sep:
            name, url = "", item
        url = url.strip().rstrip("/")
        try:
            parts = urlsplit(url)
            _ = parts.port  # raises ValueError for a port that is not a number
        except ValueError as exc:
            raise ConfigError(f"--engines: {item!r} is not a URL ({exc})") from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(f"--engines: {item!r} is not an http(s)://HOST:PORT URL")
        specs.append(EngineSpec(name.strip() or instance_name(url), url))
    if not specs:
        raise ConfigError("--engines: give at least one engine URL")
    for kind, values in (("name", [s.name for s in specs]), ("URL", [s.url for s in specs])):
        dupes = sorted({v for v in values if values.count(v) > 1})
        if dupes:
            raise ConfigError(f"--engines: the same {kind} twice: {', '.join(dupes)}")
    return tuple(specs)


@dataclasses.dataclass(frozen=True)
class RouteConfig:
    """Everything `kvscope route` needs; `validate()` before use."""

    engines: tuple[EngineSpec, ...]
    """The engines to route to (`--engines`)."""
    index_url: str | None = None
    """Base URL of `kvscope index` (`--index`); None: no index over HTTP."""
    embedded_index: IndexConfig | None = None
    """An index held in the router's own process, fed from Kafka
    (`--index-bootstrap-servers`): scores without a round trip. None with `index_url` None:
    route by load alone."""
    host: str = DEFAULT_HOST
    """Listen address; anything but loopback needs a token."""
    port: int = DEFAULT_PORT
    """Listen port (0: any free port)."""
    token: str | None = dataclasses.field(default=None, repr=False)
    """Bearer token every request but /healthz must carry (None: no check, loopback only)."""
    index_token: str | None = dataclasses.field(default=None, repr=False)
    """Bearer token the index wants (`kvscope index --token`)."""
    affinity: float = DEFAULT_AFFINITY
    """Weight of cache affinity against load, 0..1: 1 follows the cache whatever the load
    (load only breaks ties), 0 ignores the cache (least loaded)."""
    tokenizer: str | None = None
    """A local Hugging Face tokenizer (path or name) for text prompts; None: ask an engine's
    `/tokenize` (exactly what the engine will do, one round trip more)."""
    connect_timeout_s: float = 2.0
    """Connecting to an engine; longer means the engine is treated as down."""
    request_timeout_s: float = 600.0
    """Waiting for an engine's answer (or the next streamed chunk)."""
    index_timeout_s: float = 0.02
    """The per-request budget for the index's scores; past it the request is routed by load
    (fail open, basis `index_timeout`)."""
    tokenize_timeout_s: float = 1.0
    """The per-request budget for an engine's `/tokenize`; past it the request is routed by
    load (basis `no_tokens`), and the engine stays in rotation."""
    max_hash_tokens: int = 32768
    """At most this many leading prompt tokens are tokenized and scored (a longer prompt's
    score covers its first `max_hash_tokens`), so a huge prompt cannot stall the router."""
    engine_api_key: str | None = dataclasses.field(default=None, repr=False)
    """The engines' API key (`vllm serve --api-key`): sent to them as a bearer token."""
    eject_after: int = 5
    """Consecutive failures of an engine (5xx, connect failure, break-off, stall) that eject
    it from rotation (Envoy's `consecutive_5xx`)."""
    eject_base_s: float = 10.0
    """An ejection lasts this times the times the engine has been ejected (Envoy's
    `base_ejection_time`), at most `eject_max_s`."""
    eject_max_s: float = 300.0
    """The longest ejection (Envoy's `max_ejection_time`)."""
    max_ejected_share: float = 0.5
    """At most this share of the engines is ejected at once; the first ejection always
    happens (Envoy's `max_ejection_percent`)."""
    stall_s: float = 5.0
    """An engine that has sent no first byte for this long while another engine answered is
    stalled: it draws no cache affinity, and each stalled request counts as a failure."""
    max_answer_bytes: int = 64 << 20
    """A non-streamed answer is read whole up to this size before the client gets it (so a
    break-off becomes a 502); a bigger one is passed on as it arrives."""
    down_s: float = 5.0
    """How long an engine that failed a request or a health check is skipped."""
    health_interval_s: float = 2.0
    """Seconds between health checks (`GET /health`) of every engine."""
    max_body_bytes: int = 8 << 20
    """Largest request body, refused with a 413 while read (a 1M-token prompt fits)."""

    def validate(self) -> RouteConfig:
        """Raise `ConfigError` naming the flag of a setting that cannot work; return self."""
        if not self.engines:
            raise ConfigError("--engines: give at least one engine URL")
        if not 0 <= self.port < 65536:
            raise ConfigError(f"--port must be 0..65535, got {self.port}")
        if not 0.0 <= self.affinity <= 1.0:
            raise ConfigError(f"--affinity must be within 0..1, got {self.affinity}")
        for flag, value in (
            ("--connect-timeout", self.connect_timeout_s),
            ("--request-timeout", self.request_timeout_s),
            ("--index-timeout", self.index_timeout_s),
            ("--down-seconds", self.down_s),
            ("--health-interval", self.health_interval_s),
            ("--tokenize-timeout", self.tokenize_timeout_s),
            ("--eject-seconds", self.eject_base_s),
            ("--eject-max-seconds", self.eject_max_s),
            ("--stall-seconds", self.stall_s),
            ("--max-hash-tokens", self.max_hash_tokens),
            ("--eject-after", self.eject_after),
            ("--max-answer-bytes", self.max_answer_bytes),
        ):
            if not value > 0:
                raise ConfigError(f"{flag} must be > 0, got {value}")
        if not 0.0 <= self.max_ejected_share <= 1.0:
            raise ConfigError(
                f"--max-ejected-share must be within 0..1, got {self.max_ejected_share}"
            )
        if self.engine_api_key is not None and not all(
            "!" <= c <= "~" for c in self.engine_api_key
        ):
            raise ConfigError("--engine-api-key must be printable ASCII without spaces")
        if self.index_url is not None and self.embedded_index is not None:
            raise ConfigError(
                "--index and --index-bootstrap-servers both given: ask an index over HTTP "
                "or hold one in the router, not both"
            )
        if self.embedded_index is not None:
            self.embedded_index.validate()
        if self.index_url is not None:
            parts = urlsplit(self.index_url)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ConfigError(f"--index: {self.index_url!r} is not an http(s)://HOST:PORT URL")
        problem = token_problem(self.token) or open_listener_problem(
            self.host, self.token, TOKEN_ENV, "send requests through the router"
        )
        if problem:
            raise ConfigError(problem)
        return self
