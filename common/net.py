"""Listen addresses: which are loopback, the URL clients use to reach a listener, and
whether a token can guard it."""

from __future__ import annotations

import ipaddress

from kvscope.common.kafka import unbracketed


def is_loopback(host: str) -> bool:
    """True for localhost and loopback addresses."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def connectable_url(host: str, port: int) -> str:
    """The URL clients use: a wildcard listen address is reached through loopback."""
    if host in ("0.0.0.0", "", "::"):
        host = "127.0.0.1"
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}"


def open_listener_problem(host: str, token: str | None, token_env: str, can: str) -> str | None:
    """Why a listener on `host` without `token` is refused (None when it is allowed): any
    address but loopback needs a token, so only holders of it `can` (read, send, ...)."""
    if token or is_loopback(unbracketed(host)):
        return None
    return (
        f"--host {host} is not loopback: set --token (or ${token_env}) so only holders of the "
        f"token can {can}"
    )


MIN_TOKEN_CHARS = 16
"""Shortest bearer token a listener takes (a guessable token guards nothing)."""


def token_problem(token: str | None) -> str | None:
    """Why `token` cannot guard a listener (None when it can, or when there is none).

    At least `MIN_TOKEN_CHARS` printable ASCII characters without spaces: HTTP headers are
    read as Latin-1, so a UTF-8 token sent by curl would never match.
    """
    if token is None:
        return None
    if len(token) < MIN_TOKEN_CHARS or not all("!" <= c <= "~" for c in token):
        return f"--token must be at least {MIN_TOKEN_CHARS} printable ASCII characters, no spaces"
    return None
