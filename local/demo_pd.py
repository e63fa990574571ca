"""`kvscope demo --engine vllm-pd`: a real prefill→decode pair instead of the simulator.

Starts the pair of `pd_pair` (two vLLM CPU engines, `KvscopeConnector` around
`NixlConnector`, KV events on) publishing to the demo's broker, serves the demo's
shared-prefix workload through the toy-proxy flow, and stops both engines, which flushes
kvscope's publishers. A refused hand-off (the first NIXL handshake can time out on a
loaded machine) is logged and counted, not fatal: its failed-transfer record is part of
what the report shows. Both engines failing every request is an `EngineError`.
"""

from __future__ import annotations

import importlib.util
import logging
import uuid
from pathlib import Path

from kvscope.analytics.report.progress import StepProgress
from kvscope.collector.errors import EngineError
from kvscope.local.demo_vllm_engine import prompts
from kvscope.local.pd_pair import (
    SERVED_MODEL,
    START_TIMEOUT_S,
    PdPair,
    disaggregated_completion,
)
from kvscope.schemas.errors import ConfigError

log = logging.getLogger(__name__)

MAX_TOKENS = 8


def check_nixl() -> None:
    """Fail early with the install advice when NIXL is missing."""
    if importlib.util.find_spec("nixl") is None:
        raise ConfigError(
            "--engine vllm-pd needs NIXL: pip install 'kvscope[pd]' && "
            "pip install --no-deps nixl==1.5.1 (see README)"
        )


def run_pd_pair(
    model_path: Path,
    requests: int,
    work_dir: Path,
    bootstrap_servers: str,
    topic_prefix: str,
    progress: StepProgress,
    start_timeout_s: float = START_TIMEOUT_S,
) -> int:
    """Serve `requests` prompts through the pair (both engines ready within
    `start_timeout_s`); return how many hand-offs succeeded."""
    kvscope = {
        "KVSCOPE_BOOTSTRAP_SERVERS": bootstrap_servers,
        "KVSCOPE_TOPIC_PREFIX": topic_prefix,
        "KVSCOPE_STATS_INTERVAL_S": "0.5",
    }
    pair = PdPair(
        model_path.resolve(),
        work_dir / "pd",
        kvscope,
        kv_events=True,
        start_timeout_s=start_timeout_s,
    )
    progress.step("starting the prefill and decode vLLM engines (NIXL)")
    served = 0
    with pair:
        progress.step("serving through the prefill→decode proxy", total=requests)
        for i, tokens in enumerate(prompts(requests, seed=0)):
            body = {"model": SERVED_MODEL, "prompt": tokens, "max_tokens": MAX_TOKENS}
            try:
                disaggregated_completion(
                    pair.prefill.url, pair.decode.url, body, f"demo-{uuid.uuid4().hex[:12]}"
                )
                served += 1
            except EngineError as error:
                log.warning("a prefill→decode hand-off failed: %s", error)
            progress.update(i + 1)
        progress.step("stopping the engines (kvscope flushes to Kafka)")
    if served == 0:
        raise EngineError(
            f"no request made it through the prefill→decode pair; see {pair.work_dir}/*.log"
        )
    return served
