"""How long NIXL's UCX progress thread may sleep between polls: `nixl_progress_delay_us`.

NIXL's Python API starts every agent with a progress thread and a delay of 0
(`nixl_agent.__init__` sets `pthrDelay = 0`), and vLLM's `NixlConnector` offers no way to
change it: the thread polls its UCX workers without ever sleeping and takes a whole core
per engine, idle or not. On a host with few cores (CPU inference, a P/D pair on one small
machine) two such threads kept both cores of a 2-core VM busy; the VM then froze its
vCPUs for tens of seconds at a time, and hand-offs waited out NIXL's 30 s lease.

`KvscopeConnector` takes `"nixl_progress_delay_us": N` in its own
`kv_connector_extra_config` and, before it builds the inner connector in a worker, makes
every NIXL agent that process creates from then on use that delay: the thread still
wakes as soon as one of its UCX workers has an event, and otherwise sleeps up to N µs.
Unset (the default), NIXL is left as it is.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

DELAY_KEY = "nixl_progress_delay_us"


def progress_delay_us(extra_config: dict[str, Any] | None) -> int | None:
    """The delay `extra_config` asks for, or None; `ValueError` for anything but an int ≥ 0."""
    value = (extra_config or {}).get(DELAY_KEY)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{DELAY_KEY} must be a whole number of microseconds ≥ 0, not {value!r}")
    return value


def set_progress_delay(delay_us: int, api_module: str = "nixl._api") -> bool:
    """Make NIXL agents created from now on in this process use `delay_us`.

    Wraps the agent constructor NIXL's `nixl_agent` calls (`nixlBind.nixlAgent` of
    `api_module`, looked up at call time), so the config it passes is changed just before
    the agent starts its thread. Idempotent: a second call changes the delay. False, with
    a warning, when NIXL is not installed or its API no longer has that shape."""
    try:
        bindings = importlib.import_module(api_module).nixlBind
        current = bindings.nixlAgent
    except (ImportError, AttributeError) as error:
        log.warning("kvscope: %s ignored, NIXL's agent is not reachable: %s", DELAY_KEY, error)
        return False
    real: Callable[..., Any] = getattr(current, "__wrapped__", current)

    def agent_with_delay(name: str, config: Any) -> Any:
        config.pthrDelay = delay_us
        return real(name, config)

    agent_with_delay.__wrapped__ = real  # type: ignore[attr-defined]
    bindings.nixlAgent = agent_with_delay
    log.info("kvscope: NIXL's progress thread sleeps up to %d µs between polls", delay_us)
    return True
