"""The index's errors: one root, so callers catch one class."""

from __future__ import annotations

from kvscope.schemas.errors import ConfigError, KvscopeError


class IndexServiceError(KvscopeError):
    """Root of the index's own errors."""


class IndexConfigError(IndexServiceError, ConfigError, ValueError):
    """A bad flag or request value: the message names it and says what is expected."""
