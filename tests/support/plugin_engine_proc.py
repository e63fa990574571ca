"""A real in-process vLLM `LLMEngine` with kvscope's plugin and stat logger, for the e2e test.

Run as a subprocess (vLLM reads its environment at import, and plugins load once per
process): `python plugin_engine_proc.py MODEL_DIR PUB_URL GO_FILE [outage] [switch]
[replay=URL]` (`replay=URL`: vLLM's replay endpoint, which the sidecar mode's bridge uses).
The KVSCOPE_* variables come from the environment; with `switch` they move into the one
switch instead (`publisher: kvscope`, `kafka://BROKERS?setting=value&zmq=PUB_URL`) and
leave the environment, so the switch alone configures kvscope. KV events go to ZMQ at
PUB_URL (vLLM's own publisher, which the plugin tees into Kafka); `KvscopeStatLogger` is
passed as `stat_loggers=[...]`.
Prints "ready", waits for GO_FILE, runs the workload (shared prefixes, evictions from a
12-block cache, a prefix-cache reset), then prints one JSON line with vLLM's own numbers
(`truth ...`) and exits; kvscope flushes at exit. With `outage` it runs three requests,
prints "phase1", waits for GO_FILE.2 (the test starts the broker meanwhile), runs two more
and prints the truth.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from urllib.parse import urlencode

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from support.tinyllama import apply_env, tiny_engine_kwargs

COUNTERS = ("vllm:prefix_cache_queries", "vllm:prefix_cache_hits", "vllm:num_preemptions")


def switch_endpoint(pub_url: str) -> str:
    """The one switch's endpoint carrying this process's `KVSCOPE_*` settings, which leave
    the environment, and vLLM's ZMQ publisher at `pub_url` beside kvscope."""
    names = [name for name in os.environ if name.startswith("KVSCOPE_")]
    settings = {name.removeprefix("KVSCOPE_").lower(): os.environ.pop(name) for name in names}
    brokers = settings.pop("bootstrap_servers")
    return f"kafka://{brokers}?{urlencode({**settings, 'zmq': pub_url})}"


def main() -> None:
    model_dir, pub_url, go_file = sys.argv[1:4]
    outage = "outage" in sys.argv[4:]
    switch = "switch" in sys.argv[4:]
    replay = next((a.split("=", 1)[1] for a in sys.argv[4:] if a.startswith("replay=")), None)
    apply_env(Path(go_file).parent)
    from kvscope.publisher.vllm.stats import KvscopeStatLogger
    from vllm import EngineArgs, SamplingParams
    from vllm.config import KVEventsConfig
    from vllm.v1.engine.llm_engine import LLMEngine

    if switch:
        from kvscope.publisher.vllm.switch import allow_kvscope_publisher

        allow_kvscope_publisher()
    kwargs = tiny_engine_kwargs(
        Path(model_dir),
        kv_events_config=KVEventsConfig(
            enable_kv_cache_events=True,
            publisher="kvscope" if switch else "zmq",
            endpoint=switch_endpoint(pub_url) if switch else pub_url,
            replay_endpoint=replay,
        ),
        num_gpu_blocks_override=12,
        max_model_len=256,
        max_num_batched_tokens=256,
        disable_log_stats=False,
    )
    engine = LLMEngine.from_engine_args(EngineArgs(**kwargs), stat_loggers=[KvscopeStatLogger])
    print("ready", flush=True)
    while not Path(go_file).exists():
        time.sleep(0.02)

    params = SamplingParams(max_tokens=8, temperature=0.0)
    shared = list(range(3, 3 + 96))
    prompts = [shared + [200 + i] * (40 + 16 * i) for i in range(6)]
    finished: dict[str, list[int]] = {}

    def run(batch: list[tuple[str, list[int]]]) -> None:
        for request_id, tokens in batch:
            engine.add_request(request_id, {"prompt_token_ids": tokens}, params)
        while engine.has_unfinished_requests():
            for output in engine.step():
                if output.finished:
                    finished[output.request_id] = [
                        len(output.prompt_token_ids),
                        output.num_cached_tokens or 0,
                        len(output.outputs[0].token_ids),
                    ]

    run([(f"a{i}", p) for i, p in enumerate(prompts[:3])])
    if outage:
        time.sleep(0.3)
        print("phase1", flush=True)
        while not Path(f"{go_file}.2").exists():
            time.sleep(0.02)
        run([(f"b{i}", p) for i, p in enumerate(prompts[3:5])])
    else:
        engine.reset_prefix_cache()
        run([(f"b{i}", p) for i, p in enumerate(prompts[3:])])
        run([(f"c{i}", p) for i, p in enumerate(prompts[:2])])
    counters = {m.name: m.value for m in engine.get_metrics() if m.name in COUNTERS}
    time.sleep(0.3)  # let vLLM's ZMQ thread send its last batches
    print("truth " + json.dumps({"counters": counters, "requests": finished}), flush=True)


if __name__ == "__main__":
    main()
