"""The index's errors, in one module (the root is `kvscope.schemas.errors.KvscopeError`).

`IndexServiceError` is the root of everything the index raises on purpose; its name
avoids shadowing Python's built-in `IndexError`. Each class says through `retriable`
whether a retry loop should back off and try again.
"""

from __future__ import annotations

from kvscope.schemas.errors import ConfigError, KvscopeError


class IndexServiceError(KvscopeError):
    """Root of the index's errors."""


class IndexConfigError(IndexServiceError, ConfigError, ValueError):
    """Bad index configuration (hash algorithm, hash seed, block size); fix it and start again."""
