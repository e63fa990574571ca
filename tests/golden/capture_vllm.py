"""Capture real vLLM ZMQ KV-event frames as golden test data (tests/data/vllm/).

Runs the tiny random Llama (tests/tinyllama.py) in vLLM with prefix caching and KV
events on, subscribes to vLLM's ZMQ PUB socket and records every frame
`[topic, seq (8 bytes big-endian), msgpack payload]` of a few scenarios. Each scenario
runs in its own process, because the hash format is an environment variable
(`VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES`) that vLLM reads for its whole run.

For each scenario NAME it writes:
- `NAME.msgpack`: a msgpack array of frames, each an array of three binaries
  `[topic, seq, payload]`, exactly as received;
- `NAME.json`: the scenario settings, the vLLM version, and the counts vLLM's own
  decoder (`msgspec.msgpack.Decoder(vllm.distributed.kv_events.KVEventBatch)`) finds.

Usage (from the repository root; takes about a minute):
    python tests/golden/capture_vllm.py                  # every scenario
    python tests/golden/capture_vllm.py --only evictions # one scenario
See docs/golden-data.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import msgspec

TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS))

from kvscope.local.demo_vllm import offline_vllm_env  # noqa: E402
from support.tinyllama import BLOCK_SIZE, build_tiny_llama, tiny_engine_kwargs  # noqa: E402

DEFAULT_OUT = TESTS / "data" / "vllm"
QUIET_S = 1.5
"""A capture ends once no frame has arrived for this long after the last request."""


@dataclass(frozen=True)
class Scenario:
    """One capture: what vLLM is configured with and which workload it runs."""

    int_hashes: bool
    """VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES: 64-bit ints (True) or 32-byte hashes."""
    workload: str
    """`prefix` (shared prefixes, then reset_prefix_cache) or `evict` (small cache)."""
    num_blocks: int
    """num_gpu_blocks_override: the KV cache size in blocks of BLOCK_SIZE tokens."""
    max_model_len: int
    topic: str = ""
    """The ZMQ topic vLLM puts in front of every frame."""


SCENARIOS: dict[str, Scenario] = {
    "int_hashes": Scenario(True, "prefix", num_blocks=64, max_model_len=512),
    "bytes_hashes": Scenario(False, "prefix", num_blocks=64, max_model_len=512),
    "evictions": Scenario(True, "evict", num_blocks=12, max_model_len=256),
    "evictions_bytes": Scenario(False, "evict", num_blocks=12, max_model_len=256),
    "topic": Scenario(True, "prefix", num_blocks=64, max_model_len=512, topic="kv@tiny-llama"),
}
"""Pairs that differ only in the hash format run the same prompts, so their blocks match."""


def _tokens(seed: int, count: int) -> list[int]:
    """`count` deterministic token ids from the tiny vocabulary (skipping special ids)."""
    return [3 + (seed * 7919 + i * 104729) % 500 for i in range(count)]


def _run_workload(llm: Any, scenario: Scenario) -> None:
    """Drive the engine: generate, share prefixes or force evictions, reset the cache."""
    from vllm import SamplingParams

    max_tokens = 40 if scenario.workload == "prefix" else 8  # long decodes fill blocks too
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)

    def generate(*prompts: list[int]) -> None:
        llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)

    if scenario.workload == "prefix":
        shared = _tokens(1, 3 * BLOCK_SIZE)
        generate(shared + _tokens(2, 40), shared + _tokens(3, 70))
        generate(shared + _tokens(2, 40))  # prefix hit: no new stores for shared blocks
        generate(_tokens(4, 5 * BLOCK_SIZE + 3))
        if not llm.reset_prefix_cache():
            raise RuntimeError("reset_prefix_cache() refused: blocks still in use")
        generate(shared + _tokens(5, 33))  # publishes AllBlocksCleared, then new stores
    else:
        for seed in range(10, 18):
            generate(_tokens(seed, 4 * BLOCK_SIZE + seed))
        generate(_tokens(10, 4 * BLOCK_SIZE + 10))  # evicted by now: stored again


class _Subscriber:
    """A ZMQ SUB socket on a background thread that keeps every frame it receives.

    It binds: vLLM binds its PUB socket only for wildcard (`tcp://*:P`) or ipc/inproc
    endpoints and connects it to any other address, so a loopback endpoint
    `tcp://127.0.0.1:P` needs the subscriber to be the side that binds.
    """

    def __init__(self) -> None:
        import zmq

        self._socket = zmq.Context.instance().socket(zmq.SUB)
        self._socket.setsockopt(zmq.SUBSCRIBE, b"")
        port = self._socket.bind_to_random_port("tcp://127.0.0.1")
        self.endpoint = f"tcp://127.0.0.1:{port}"
        self.frames: list[list[bytes]] = []
        self.last_frame_at = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="golden-sub", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            if self._socket.poll(50):
                self.frames.append(self._socket.recv_multipart())
                self.last_frame_at = time.monotonic()

    def wait_quiet(self, quiet_s: float = QUIET_S) -> None:
        """Return once no frame has arrived for `quiet_s` seconds from now."""
        self.last_frame_at = max(self.last_frame_at, time.monotonic())
        while time.monotonic() - self.last_frame_at < quiet_s:
            time.sleep(0.05)

    def close(self) -> list[list[bytes]]:
        """Stop receiving and return the frames."""
        self._stop.set()
        self._thread.join()
        self._socket.close(linger=0)
        return self.frames


def vllm_counts(frames: list[list[bytes]]) -> dict[str, int]:
    """What vLLM's own decoder finds in the payloads (the golden expectation)."""
    from vllm.distributed.kv_events import (
        AllBlocksCleared,
        BlockRemoved,
        BlockStored,
        KVEventBatch,
    )

    decoder = msgspec.msgpack.Decoder(KVEventBatch)
    counts = dict.fromkeys(
        (
            "stored_events",
            "hashes_stored",
            "removed_events",
            "hashes_removed",
            "cleared_events",
            "int_hashes_above_2_63",
            "bytes_hashes",
        ),
        0,
    )
    for _topic, _seq, payload in frames:
        for event in decoder.decode(payload).events:
            hashes: list[int | bytes] = []
            if isinstance(event, BlockStored):
                counts["stored_events"] += 1
                counts["hashes_stored"] += len(event.block_hashes)
                hashes = list(event.block_hashes)
            elif isinstance(event, BlockRemoved):
                counts["removed_events"] += 1
                counts["hashes_removed"] += len(event.block_hashes)
                hashes = list(event.block_hashes)
            elif isinstance(event, AllBlocksCleared):
                counts["cleared_events"] += 1
            for value in hashes:
                if isinstance(value, bytes):
                    counts["bytes_hashes"] += 1
                elif value >= 1 << 63:
                    counts["int_hashes_above_2_63"] += 1
    return counts


def capture(name: str, model_dir: Path, out: Path) -> dict[str, Any]:
    """Run one scenario in this process (env already set) and write its two files."""
    import vllm
    from vllm import LLM
    from vllm.config import KVEventsConfig

    scenario = SCENARIOS[name]
    subscriber = _Subscriber()
    events_config = KVEventsConfig(
        enable_kv_cache_events=True,
        publisher="zmq",
        endpoint=subscriber.endpoint,
        topic=scenario.topic,
    )
    llm = LLM(
        **tiny_engine_kwargs(
            model_dir,
            kv_events_config=events_config,
            num_gpu_blocks_override=scenario.num_blocks,
            max_model_len=scenario.max_model_len,
            max_num_batched_tokens=scenario.max_model_len,
        )
    )
    time.sleep(0.5)  # let vLLM's PUB connect and receive the subscription
    _run_workload(llm, scenario)
    subscriber.wait_quiet()
    frames = subscriber.close()

    seqs = [int.from_bytes(seq, "big") for _, seq, _ in frames]
    if seqs != list(range(len(seqs))):
        raise RuntimeError(f"{name}: frames lost or reordered, seqs {seqs}")
    if {topic for topic, _, _ in frames} != {scenario.topic.encode()}:
        raise RuntimeError(f"{name}: no frames, or frames with another topic")
    meta = {
        "scenario": name,
        "vllm_version": vllm.__version__,
        "settings": asdict(scenario),
        "block_size": BLOCK_SIZE,
        "frames": len(frames),
        "counts": vllm_counts(frames),
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.msgpack").write_bytes(msgspec.msgpack.encode(frames))
    (out / f"{name}.json").write_text(json.dumps(meta, indent=2) + "\n")
    return meta


def _run_child(name: str, model_dir: Path, out: Path, tmp: Path) -> None:
    env = {
        **os.environ,
        **offline_vllm_env(tmp / name),
        "VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES": "1" if SCENARIOS[name].int_hashes else "0",
    }
    command = [sys.executable, __file__, "--child", name, "--model", str(model_dir)]
    started = time.monotonic()
    subprocess.run([*command, "--out", str(out)], env=env, check=True, timeout=300)
    meta = json.loads((out / f"{name}.json").read_text())
    print(
        f"{name}: {meta['frames']} frames, {meta['counts']} ({time.monotonic() - started:.1f} s)",
        flush=True,
    )


def main(argv: list[str] | None = None) -> int:
    """Capture the chosen scenarios, each in a child process of its own."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output directory")
    parser.add_argument("--only", nargs="+", choices=sorted(SCENARIOS), help="scenarios")
    parser.add_argument("--child", choices=sorted(SCENARIOS), help=argparse.SUPPRESS)
    parser.add_argument("--model", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        capture(args.child, args.model, args.out)
        return 0
    with tempfile.TemporaryDirectory(prefix="kvscope-golden-") as tmp_name:
        tmp = Path(tmp_name)
        model_dir = build_tiny_llama(tmp / "model")
        for name in args.only or SCENARIOS:
            _run_child(name, model_dir, args.out.resolve(), tmp)
    return 0


if __name__ == "__main__":
    sys.exit(main())
