"""What kvscope costs a real vLLM engine: tokens/s with ZMQ KV events alone vs kvscope on.

Each run is a fresh Python process with a real vLLM CPU engine in-process (the tiny
random Llama of tests/support/tinyllama.py, prefix caching, 96 blocks of 32 tokens so it
evicts, KV events on vLLM's ZMQ publisher, vLLM's stat logging on as `vllm serve` has
it). The workload: 400 prompts sharing 12 long prefixes (12 blocks each) plus a short
unique suffix, 8 output tokens each, fed through `LLMEngine.step()` after a warm-up.

- `zmq`: vLLM's ZMQ KV events alone (kvscope not configured);
- `kvscope`: the same plus kvscope's plugin (KV events and the access stream, one
  `BlockAccess` per request) and `KvscopeStatLogger` (engine stats every second, one
  record per finished request), to a local broker.

Attribution (kvscope mode, settles what a noisy tokens/s ratio cannot): the engine
thread's CPU time inside kvscope's hooks (`HookTimer`: the KV-event tee, the access
stream's observers, the stat logger) plus the CPU of kvscope's own threads
(`kvscope-publisher`), as a share of the engine process's CPU over the timed window.

Modes alternate (the first mode of each round alternates too); per run: tokens (prompt +
output) per second of wall time, and CPU seconds of every process of the run (the engine
and any process kvscope started) over the timed window. Reported: medians per mode and
their ratio. In kvscope mode the run also checks that every record reached the broker.

Placement: by default the engine process runs on core 0 with one OpenMP thread and the
local broker (a stand-in for a remote Kafka cluster) on the other cores, so the ratio is
what kvscope costs inside the engine process (its sender thread competes with the engine
for that core, as it would on a GPU host). With `--unpinned` the engine's OpenMP threads
take every core and share them with the broker: on a CPU engine that uses every core,
any other runnable thread (the broker's included) stalls OpenMP's spinning barriers, so
that shape measures the machine's spare capacity more than kvscope.

With `--relay`, the kvscope runs go through a per-host relay: the bench starts
`kvscope relay` (on the broker's cores) and gives the engine `relay=ipc://...`, so no
Kafka client runs in the engine process; each kvscope run then also reports the relay
process's CPU seconds over the timed window (`relay_cpu_s`) beside the engine's.

With `--sample`, py-spy also samples each run's timed window from outside (200 Hz, every
thread, waits left out; `engine_overhead_sampling.py`): kvscope's share of the engine
process's active samples beside vLLM's own ZMQ publisher's, in the same run, next to the
attribution above (which is measured from inside).

    python bench/engine_overhead.py [--runs 7] [--prompts 400] [--unpinned] [--sample]
        [--relay] [--setting linger_ms=500 ...]
"""

from __future__ import annotations

import argparse
import functools
import json
import multiprocessing
import os
import platform
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from engine_overhead_sampling import Sampler, shares

REPO = Path(__file__).resolve().parents[1]
PREFIXES = 12
PREFIX_BLOCKS = 12
BLOCK_SIZE = 32
OUTPUT_TOKENS = 8
ENGINE_CORE = 0
PROFILES = Path(tempfile.gettempdir()) / "kvscope-engine-profiles"
"""Where `--sample` keeps each run's raw py-spy profile (named in its result)."""


def prompts(count: int, seed: int = 11) -> list[list[int]]:
    """`count` token-id prompts: one of 12 shared 384-token prefixes plus 16-96 unique tokens."""
    rng = random.Random(seed)
    prefixes = [
        [rng.randrange(3, 500) for _ in range(PREFIX_BLOCKS * BLOCK_SIZE)] for _ in range(PREFIXES)
    ]
    return [
        rng.choice(prefixes) + [rng.randrange(3, 500) for _ in range(rng.randint(16, 96))]
        for _ in range(count)
    ]


def _cpu_s() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def thread_cpu_s() -> dict[str, float]:
    """CPU seconds so far per thread of this process, by Python thread name where there
    is one, else the OS name (Linux /proc, 10 ms ticks)."""

    names = {t.native_id: t.name for t in threading.enumerate()}
    ticks = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = {}
    for task in Path("/proc/self/task").iterdir():
        try:
            comm = (task / "comm").read_text().strip()
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        name = names.get(int(task.name), f"{comm} (native)")
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / ticks
    return out


class HookTimer:
    """CPU time the calling threads spend inside kvscope's hooks (outermost calls only).

    In kvscope mode the engine thread calls into kvscope at four places: the KV-event tee
    (`SourcePublisher.publish_raw`), the access stream's observers (`AccessRecorder.
    looked_up` / `released`) and the stat logger (`KvscopeStatLogger.record` / `log`,
    whose `publish` calls nest inside). Each is wrapped to add its thread CPU time
    (`time.thread_time_ns`); a call inside another timed call is not counted twice.
    """

    def __init__(self) -> None:
        self.ns: dict[str, int] = {}
        self.calls: dict[str, int] = {}
        self._local = threading.local()

    def wrap(self, cls: Any, name: str) -> None:
        """Time `cls.name` from now on."""
        original = getattr(cls, name)
        key = f"{cls.__name__}.{name}"

        @functools.wraps(original)
        def timed(*args: Any, **kwargs: Any) -> Any:
            depth = getattr(self._local, "depth", 0)
            self._local.depth = depth + 1
            start = time.thread_time_ns()
            try:
                return original(*args, **kwargs)
            finally:
                self._local.depth = depth
                if depth == 0:
                    self.ns[key] = self.ns.get(key, 0) + time.thread_time_ns() - start
                    self.calls[key] = self.calls.get(key, 0) + 1

        setattr(cls, name, timed)

    def reset(self) -> None:
        """Forget what was timed so far (the warm-up)."""
        self.ns.clear()
        self.calls.clear()


HOOKS = HookTimer()


def time_kvscope_hooks() -> None:
    """Wrap kvscope's engine-thread entry points in `HOOKS` (before the engine is built)."""
    from kvscope.publisher.kafka import SourcePublisher
    from kvscope.publisher.vllm.accesses import AccessRecorder
    from kvscope.publisher.vllm.stats import KvscopeStatLogger

    HOOKS.wrap(SourcePublisher, "publish_raw")
    HOOKS.wrap(SourcePublisher, "publish")
    HOOKS.wrap(AccessRecorder, "looked_up")
    HOOKS.wrap(AccessRecorder, "released")
    HOOKS.wrap(KvscopeStatLogger, "record")
    HOOKS.wrap(KvscopeStatLogger, "log")


def build_engine(mode: str, model_dir: str, workdir: str) -> Callable[[list[list[int]], str], int]:
    """A real vLLM engine in this process (kvscope's plugin and stat logger on in mode
    `kvscope`); returns `run(prompts, tag)`, which serves them and returns the tokens."""
    sys.path.insert(0, str(REPO / "tests"))
    from support.tinyllama import apply_env, tiny_engine_kwargs

    apply_env(Path(workdir))
    from vllm import EngineArgs, SamplingParams
    from vllm.config import KVEventsConfig
    from vllm.v1.engine.llm_engine import LLMEngine

    loggers: list[Any] | None = None
    if mode == "kvscope":
        from kvscope.publisher.vllm.stats import KvscopeStatLogger

        time_kvscope_hooks()
        loggers = [KvscopeStatLogger]
    kwargs = tiny_engine_kwargs(
        Path(model_dir),
        kv_events_config=KVEventsConfig(
            enable_kv_cache_events=True,
            publisher="zmq",
            endpoint=f"ipc://{workdir}/kv-events-{os.getpid()}",
        ),
        num_gpu_blocks_override=96,
        disable_log_stats=False,
    )
    engine = LLMEngine.from_engine_args(EngineArgs(**kwargs), stat_loggers=loggers)
    params = SamplingParams(max_tokens=OUTPUT_TOKENS, temperature=0.0, ignore_eos=True)

    def run(batch: list[list[int]], tag: str) -> int:
        for i, tokens in enumerate(batch):
            engine.add_request(f"{tag}{i}", {"prompt_token_ids": tokens}, params)
        done = 0
        while engine.has_unfinished_requests():
            for output in engine.step():
                if output.finished:
                    done += len(output.prompt_token_ids) + len(output.outputs[0].token_ids)
        return done

    return run


def child(mode: str, model_dir: str, workdir: str, count: int, cores: str, sample: bool) -> None:
    """One run in this process: build the engine, warm up, time the workload, print JSON.

    With `sample`, the timed window starts and ends on the parent's word (a line on
    stdin), so that its py-spy covers exactly that window."""
    if cores:
        os.sched_setaffinity(0, {int(c) for c in cores.split(",")})
    run = build_engine(mode, model_dir, workdir)
    work = prompts(count)

    run(prompts(16, seed=99), "warm")
    _handshake("sample-start", sample)
    HOOKS.reset()
    threads, cpu, wall = thread_cpu_s(), _cpu_s(), time.perf_counter()
    tokens = run(work, "r")
    wall, cpu = time.perf_counter() - wall, _cpu_s() - cpu
    _handshake("sample-stop", sample)
    after = thread_cpu_s()
    per_thread = {name: round(t - threads.get(name, 0.0), 2) for name, t in after.items()}
    result: dict[str, Any] = {"mode": mode, "tokens": tokens, "wall_s": wall, "cpu_s": cpu}
    result["thread_cpu_s"] = {name: t for name, t in per_thread.items() if t > 0}
    if mode == "kvscope":
        result.update(_delivery_check())
        result["attribution"] = attribution(result["thread_cpu_s"], cpu)
    print("result " + json.dumps(result), flush=True)


def _handshake(word: str, sample: bool) -> None:
    """Tell the parent `word` and wait for its answer (only when it samples or measures
    the relay)."""
    if sample:
        print(word, flush=True)
        sys.stdin.readline()


def attribution(per_thread: dict[str, float], process_cpu_s: float) -> dict[str, Any]:
    """kvscope's share of the engine process's CPU over the timed window: the engine
    thread's time inside kvscope's hooks plus the CPU of kvscope's own threads."""
    hooks_s = sum(HOOKS.ns.values()) / 1e9
    threads_s = sum(t for name, t in per_thread.items() if name.startswith("kvscope"))
    return {
        "hooks_cpu_s": {k: round(v / 1e9, 4) for k, v in HOOKS.ns.items()},
        "hook_calls": dict(HOOKS.calls),
        "hooks_s": round(hooks_s, 4),
        "kvscope_threads_s": round(threads_s, 4),
        "share_of_process_cpu": (hooks_s + threads_s) / process_cpu_s,
    }


def _delivery_check() -> dict[str, Any]:
    """Flush kvscope and read its counters: records published and dropped in this process."""
    from kvscope.publisher.config import PublisherConfig
    from kvscope.publisher.kafka import shared_kafka_publisher

    publisher = shared_kafka_publisher(PublisherConfig.from_env())
    flushed = publisher.flush(30.0)
    published = {
        stream: int(child._value.get())
        for (stream,), child in publisher.metrics.published._metrics.items()
    }
    dropped = sum(int(c._value.get()) for c in publisher.metrics.dropped._metrics.values())
    return {"flushed": flushed, "published": published, "dropped": dropped}


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of another process so far (from /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start_relay(broker: str, folder: Path) -> tuple[subprocess.Popen[bytes], str]:
    """`kvscope relay` on an ipc socket in `folder`, started and listening; (process, URL)."""
    listen = f"ipc://{folder}/relay.sock"
    log = folder / "relay.log"
    with log.open("wb") as out:
        relay = subprocess.Popen(
            [
                *(sys.executable, "-m", "kvscope.cli", "relay", "--log-level", "INFO"),
                *("--listen", listen, "--bootstrap-servers", broker),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    deadline = time.monotonic() + 60
    while "listening on" not in log.read_text():
        if relay.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"kvscope relay did not start:\n{log.read_text()[-3000:]}")
        time.sleep(0.1)
    return relay, listen


def run_once(
    mode: str,
    model_dir: Path,
    workdir: Path,
    broker: str,
    count: int,
    pinned: bool,
    sample: bool = False,
    settings: dict[str, str] | None = None,
    relay_pid: int | None = None,
) -> dict:
    """Start one child run (on `ENGINE_CORE` with one OpenMP thread when `pinned`) and
    return its result line; with `sample`, py-spy samples its timed window from outside
    (`result["sampled"]`: kvscope's and vLLM ZMQ's shares of the active samples). With
    `relay_pid`, a kvscope run's result has that relay's CPU seconds over the window."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVSCOPE_")}
    cores = ""
    if pinned:
        cores = str(ENGINE_CORE)
        env.update(OMP_NUM_THREADS="1")
    if mode == "kvscope":
        env.update(
            KVSCOPE_BOOTSTRAP_SERVERS=broker,
            KVSCOPE_TOPIC_PREFIX="bench-engine.",
            KVSCOPE_INSTANCE="bench:8000",
            KVSCOPE_STATS_INTERVAL_S="1",
        )
        env.update({f"KVSCOPE_{name.upper()}": value for name, value in (settings or {}).items()})
    args = [sys.executable, __file__, "--child", mode, str(model_dir), str(workdir), str(count)]
    relay = relay_pid if mode == "kvscope" else None
    args += [cores, "sample" if sample else "sync" if relay is not None else ""]
    with tempfile.TemporaryFile("w+") as log:
        proc = subprocess.Popen(
            args, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True
        )
        assert proc.stdin is not None and proc.stdout is not None
        result: dict[str, Any] | None = None
        sampler: Sampler | None = None
        sampled: dict[str, Any] | None = None
        relay_cpu = 0.0
        for line in proc.stdout:
            if line.startswith("sample-start"):
                if sample:
                    sampler = Sampler(proc.pid, PROFILES / f"{mode}-{proc.pid}.txt")
                    time.sleep(1.0)  # py-spy attached before the window opens
                if relay is not None:
                    relay_cpu = process_cpu_s(relay)
            elif line.startswith("sample-stop"):
                if relay is not None:
                    relay_cpu = process_cpu_s(relay) - relay_cpu
                if sampler is not None:
                    sampled = {**shares(sampler.stop()), "profile": str(sampler.out)}
            else:
                if line.startswith("result "):
                    result = json.loads(line.split(" ", 1)[1])
                continue
            proc.stdin.write("go\n")
            proc.stdin.flush()
        proc.wait(timeout=900)
        if result is None:
            log.seek(0)
            raise RuntimeError(f"{mode} run failed (exit {proc.returncode}):\n{log.read()[-3000:]}")
    if sampled is not None:
        result["sampled"] = sampled
    if relay is not None:
        result["relay_cpu_s"] = relay_cpu
    return result


def _load() -> float:
    return os.getloadavg()[0]


def main() -> None:
    """Alternate runs of both modes and print medians and ratios as JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7, help="runs per mode (default 7)")
    parser.add_argument("--prompts", type=int, default=400, help="prompts per run (default 400)")
    parser.add_argument(
        "--unpinned",
        action="store_true",
        help="let the engine's OpenMP threads use every core, beside the broker "
        "(default: engine on core 0 with one thread, broker on the others)",
    )
    parser.add_argument(
        "--sample",
        action="store_true",
        help="also sample every run's timed window from outside with py-spy (200 Hz, every "
        "thread, waits left out) and report kvscope's and vLLM ZMQ's shares",
    )
    parser.add_argument(
        "--setting",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a kvscope publisher setting for the kvscope runs, e.g. linger_ms=500 "
        "(KVSCOPE_NAME in the engine's environment; default: none, the publisher's defaults)",
    )
    parser.add_argument(
        "--relay",
        action="store_true",
        help="kvscope runs hand their records to a `kvscope relay` this bench starts (no "
        "Kafka client in the engine) and report its CPU beside the engine's",
    )
    args = parser.parse_args()
    settings = dict(setting.split("=", 1) for setting in args.setting)
    pinned = not args.unpinned
    if pinned:  # the broker started below, and so the stand-in for remote Kafka, inherits it
        os.sched_setaffinity(0, set(range(os.cpu_count() or 2)) - {ENGINE_CORE})
    sys.path.insert(0, str(REPO / "tests"))
    from kvscope.local.broker import LocalBroker
    from support.tinyllama import build_tiny_llama

    runs: dict[str, list[dict]] = {"zmq": [], "kvscope": []}
    loads = [_load()]
    with tempfile.TemporaryDirectory() as tmp, LocalBroker() as broker:
        model_dir = build_tiny_llama(Path(tmp) / "model")
        relay: subprocess.Popen[bytes] | None = None
        if args.relay:
            relay, settings["relay"] = start_relay(broker.bootstrap_servers, Path(tmp))
        for round_no in range(args.runs):
            order = ("zmq", "kvscope") if round_no % 2 == 0 else ("kvscope", "zmq")
            for mode in order:
                result = run_once(
                    mode,
                    model_dir,
                    Path(tmp),
                    broker.bootstrap_servers,
                    args.prompts,
                    pinned,
                    args.sample,
                    settings,
                    relay.pid if relay is not None else None,
                )
                result["tokens_per_s"] = result["tokens"] / result["wall_s"]
                result["load"] = _load()
                runs[mode].append(result)
                loads.append(result["load"])
                print(json.dumps(result), file=sys.stderr, flush=True)
        if relay is not None:
            relay.terminate()
            relay.wait(30)
    medians = {
        mode: {
            "tokens_per_s": statistics.median(r["tokens_per_s"] for r in rs),
            "cpu_s": statistics.median(r["cpu_s"] for r in rs),
        }
        for mode, rs in runs.items()
    }
    report = {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{platform.machine()}, {multiprocessing.cpu_count()} cores, "
        f"Python {platform.python_version()}",
        "load_average_1m": {"min": min(loads), "max": max(loads)},
        "placement": "engine on core 0, one OpenMP thread; broker elsewhere"
        if pinned
        else "unpinned: engine OpenMP threads on every core, beside the broker",
        "runs_per_mode": args.runs,
        "kvscope_settings": settings,
        "tokens_per_run": runs["zmq"][0]["tokens"],
        "runs": runs,
        "medians": medians,
        "throughput_ratio": medians["kvscope"]["tokens_per_s"] / medians["zmq"]["tokens_per_s"],
        "cpu_ratio": medians["kvscope"]["cpu_s"] / medians["zmq"]["cpu_s"],
        "kvscope_share_of_process_cpu": statistics.median(
            r["attribution"]["share_of_process_cpu"] for r in runs["kvscope"]
        ),
    }
    if args.relay:
        relay_cpu = statistics.median(r["relay_cpu_s"] for r in runs["kvscope"])
        report["relay_cpu_s_median"] = relay_cpu
        report["cpu_ratio_with_relay"] = (medians["kvscope"]["cpu_s"] + relay_cpu) / medians["zmq"][
            "cpu_s"
        ]
    if args.sample:
        report["sampled"] = {
            mode: {
                "kvscope_share": [r["sampled"]["kvscope_share"] for r in rs],
                "zmq_share": [r["sampled"]["zmq_share"] for r in rs],
                "median_kvscope_share": statistics.median(
                    r["sampled"]["kvscope_share"] for r in rs
                ),
                "median_zmq_share": statistics.median(r["sampled"]["zmq_share"] for r in rs),
            }
            for mode, rs in runs.items()
        }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        child(*sys.argv[2:5], int(sys.argv[5]), sys.argv[6], sys.argv[7] in ("sample", "sync"))
    else:
        main()
