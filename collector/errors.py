"""The service side's errors, in one module (the root is `kvscope.schemas.errors.KvscopeError`).

Each class says through `retriable` whether a retry loop should back off and try again;
the collector's retry loops ask the error instead of assuming.
"""

from __future__ import annotations

from kvscope.schemas.errors import KvscopeError


class SinkError(KvscopeError):
    """Storage (ClickHouse) failed; unless said otherwise the same write may succeed later."""

    retriable = True

    def __init__(self, message: str, *, retriable: bool = True) -> None:
        super().__init__(message)
        self.retriable = retriable


class BrokerError(KvscopeError):
    """The local broker could not be found, started, or did not answer."""


class EngineError(KvscopeError):
    """A vLLM engine of the demo failed; the message carries its last output."""


class EngineRefused(EngineError):
    """An engine of the demo answered a request with an HTTP error: it saw the request and
    turned it down (a timeout or a dropped connection is an `EngineError` only, since
    then the engine may still serve it)."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status
        """The HTTP status the engine answered."""


class PipelineError(KvscopeError):
    """A part of the demo pipeline failed; the message says what to do."""


class DemoError(KvscopeError):
    """The demo could not finish; the message says what to do."""


class OutputError(KvscopeError):
    """Output files could not be written (a directory that cannot be created, a full disk)."""
