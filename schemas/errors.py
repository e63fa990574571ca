"""kvscope's error hierarchy.

Every error kvscope raises on purpose derives from `KvscopeError`. Each class says
through `retriable` whether a retry loop should back off and try again (a sink that
is down) or give up on the item (a record that can never decode). Errors of the service
side (storage, local tooling) live in `kvscope.collector.errors`.
"""

from __future__ import annotations


class KvscopeError(Exception):
    """Root of all kvscope errors."""

    retriable: bool = False


class ConfigError(KvscopeError):
    """Bad configuration or command-line input; fix it and start again."""


class DecodeError(KvscopeError):
    """Bytes that are not a valid kvscope record or engine payload (permanent)."""
