"""A real vLLM engine (tiny model, KV events over ZMQ, no kvscope plugin) for bridge tests.

Run as a subprocess:
`python vllm_engine_proc.py MODEL_DIR PUB_URL REPLAY_URL TOPIC GO_FILE METRICS_PORT`.
It starts the engine with stats on and serves its Prometheus registry (what `vllm serve`
exposes on /metrics, minus the HTTP-server metrics) on 127.0.0.1:METRICS_PORT, prints
"ready", waits for GO_FILE, runs a small workload (8 requests: shared prefixes, then
reset_prefix_cache, then more prompts), prints "done" and waits for its stdin to close.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tinyllama import apply_env, tiny_engine_kwargs


def main() -> None:
    model_dir, pub_url, replay_url, topic, go_file, metrics_port = sys.argv[1:7]
    apply_env(Path(go_file).parent)
    from prometheus_client import start_http_server
    from vllm import LLM, SamplingParams
    from vllm.config import KVEventsConfig

    events = KVEventsConfig(
        enable_kv_cache_events=True,
        publisher="zmq",
        endpoint=pub_url,
        replay_endpoint=replay_url,
        topic=topic,
    )
    kwargs = tiny_engine_kwargs(
        Path(model_dir),
        kv_events_config=events,
        num_gpu_blocks_override=12,
        max_model_len=256,
        max_num_batched_tokens=256,
        disable_log_stats=False,
    )
    llm = LLM(**kwargs)
    start_http_server(int(metrics_port), addr="127.0.0.1")
    print("ready", flush=True)
    while not Path(go_file).exists():
        time.sleep(0.05)
    params = SamplingParams(max_tokens=8, temperature=0.0)
    shared = list(range(3, 3 + 96))
    prompts = [{"prompt_token_ids": shared + [200 + i] * (40 + 16 * i)} for i in range(6)]
    llm.generate(prompts[:3], params, use_tqdm=False)
    llm.reset_prefix_cache()
    llm.generate(prompts[3:], params, use_tqdm=False)
    llm.generate(prompts[:2], params, use_tqdm=False)
    time.sleep(0.5)  # let the ZMQ publisher thread send the last batches
    print("done", flush=True)
    sys.stdin.read()  # keep /metrics up until the test is done with it


if __name__ == "__main__":
    main()
