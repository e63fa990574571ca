"""What kvscope costs a real vLLM engine, measured inside one engine: kvscope on vs off.

`bench/engine_overhead.py` compares separate processes, and on this machine two processes
of the same mode differ by up to 20% in tokens/s (memory layout, where the scheduler puts
them), which hides a 1% effect behind noise. This benchmark keeps one engine (built as in
`engine_overhead.py`, kvscope's plugin and stat logger installed) and switches kvscope's
work on and off between segments of the workload:

- on: the tee hands every KV event batch to kvscope after vLLM's ZMQ publisher, and
  `KvscopeStatLogger.record` folds every step (engine stats, finished requests);
- off: the tee calls only vLLM's ZMQ publisher and `record` returns at once (the switch
  is a monkeypatch in this script; the product has no such switch). The sender thread
  stays, idle: an idle sender never wakes (issue 14's wake rule).

Segments run in ABBA order (on, off, off, on, ...) so a slow drift of the machine cancels
out; each segment serves fresh prompts of the same shape (12 shared prefixes, unique
suffixes). Reported: median tokens/s per mode, the ratio of medians, the mean of the
per-block ratios (each ABBA block gives one), and kvscope's own CPU (the sender thread)
against the engine thread's. The engine runs on core 0 with one OpenMP thread and the
local broker (the stand-in for a remote Kafka) elsewhere, as in `engine_overhead.py`.

With `--kv-events sidecar` the plugin runs in sidecar mode (`KVSCOPE_KV_EVENTS_SIDECAR=1`):
the engine keeps vLLM's ZMQ publisher alone and a `kvscope bridge` child process forwards
the events. "on" segments run with that child subscribed (pinned to the broker's cores, off
the engine's) and the stat logger recording; "off" segments with no child (stopped before
the segment, started again and given `SIDECAR_SETTLE_S` to subscribe before the next "on"
one, both outside the timed part) and `record` returning at once. The engine has no replay
endpoint here, so each new child records the batches of the "off" segments as one Gap
instead of replaying them. The child's CPU during "on" segments is reported as
`bridge_cpu_s`.

With `--router` a plain ZMQ subscriber (a stand-in for a KV-aware router, pinned off the
engine's core) reads vLLM's KV events during every segment, on and off alike. Without it
nobody subscribes in "off" segments and vLLM's PUB socket drops every batch at once, so a
sidecar's "on" segments also pay for vLLM's own ZMQ transmission; with it both modes
transmit and the difference is kvscope's alone.

    python bench/engine_overhead_interleaved.py [--blocks 10] [--prompts 100] [--linger-ms MS]
        [--kv-events tee|sidecar] [--router]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from engine_overhead import ENGINE_CORE, build_engine, prompts, thread_cpu_s

SIDECAR_SETTLE_S = 3.0
"""Time a new bridge child gets to start and subscribe before a timed segment (it starts in
about half a second on this machine)."""


class Switch:
    """Turns kvscope's per-step work on and off between segments (a monkeypatch in this
    script; the product has no such switch).

    tee: the tee calls only vLLM's ZMQ publisher while off. sidecar: the bridge child runs
    only while on. Both: `KvscopeStatLogger.record` returns at once while off.
    """

    def __init__(self, kv_events: str) -> None:
        from kvscope.publisher.vllm.kv_events import KvscopeSidecarPublisher, KvscopeTeePublisher
        from kvscope.publisher.vllm.stats import KvscopeStatLogger

        self.on = True
        self.kv_events = kv_events
        self.sidecars: list[KvscopeSidecarPublisher] = []
        switch = self
        record = KvscopeStatLogger.record

        def maybe_record(logger: KvscopeStatLogger, *args: Any, **kwargs: Any) -> None:
            if switch.on:
                record(logger, *args, **kwargs)

        KvscopeStatLogger.record = maybe_record  # type: ignore[method-assign]
        if kv_events == "tee":
            tee_publish = KvscopeTeePublisher.publish

            def publish(tee: KvscopeTeePublisher, events: Any) -> None:
                if switch.on:
                    tee_publish(tee, events)
                else:
                    tee._inner.publish(events)

            KvscopeTeePublisher.publish = publish  # type: ignore[method-assign]
        else:
            sidecar_init = KvscopeSidecarPublisher.__init__

            def init(sidecar: KvscopeSidecarPublisher, *args: Any) -> None:
                sidecar_init(sidecar, *args)
                sidecar.supervisor.stop()  # started on the engine's core: start it again
                sidecar.supervisor.cpus = set(range(os.cpu_count() or 2)) - {ENGINE_CORE}
                switch.sidecars.append(sidecar)

            KvscopeSidecarPublisher.__init__ = init  # type: ignore[method-assign]

    def set(self, on: bool) -> None:
        """Switch for the next segment (a sidecar child starts or stops here, untimed)."""
        if self.kv_events == "sidecar" and not self.sidecars:
            raise SystemExit("the plugin made no sidecar publisher (KVSCOPE_KV_EVENTS_SIDECAR?)")
        self.on = on
        started = False
        for sidecar in self.sidecars:
            if on and sidecar.supervisor.pid is None:
                sidecar.supervisor.start()
                started = True
            elif not on:
                sidecar.supervisor.stop()
        if started:
            time.sleep(SIDECAR_SETTLE_S)

    def bridge_cpu_s(self) -> float:
        """CPU seconds the running bridge children have used so far."""
        ticks = os.sysconf("SC_CLK_TCK")
        total = 0.0
        for sidecar in self.sidecars:
            pid = sidecar.supervisor.pid
            if pid is not None:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                total += (int(fields[11]) + int(fields[12])) / ticks
        return total


def router(endpoint: str) -> None:
    """The `--router` subscriber: read and discard every KV-event message until killed."""
    import zmq

    socket = zmq.Context.instance().socket(zmq.SUB)
    socket.setsockopt(zmq.SUBSCRIBE, b"")
    socket.connect(endpoint)
    while True:
        socket.recv_multipart()


def start_router(endpoint: str) -> subprocess.Popen[bytes]:
    """Start the router stand-in off the engine's core and give it time to subscribe."""
    proc = subprocess.Popen([sys.executable, __file__, "--router", endpoint])
    os.sched_setaffinity(proc.pid, set(range(os.cpu_count() or 2)) - {ENGINE_CORE})
    time.sleep(SIDECAR_SETTLE_S)
    return proc


def child(
    model_dir: str, workdir: str, blocks: int, count: int, kv_events: str, with_router: bool
) -> None:
    """Build one engine, then time `blocks` ABBA blocks of segments; print JSON."""
    os.sched_setaffinity(0, {ENGINE_CORE})
    switch = Switch(kv_events)
    run = build_engine("kvscope", model_dir, workdir)
    endpoint = f"ipc://{workdir}/kv-events-{os.getpid()}"  # as build_engine names it
    subscriber = start_router(endpoint) if with_router else None
    switch.set(True)
    run(prompts(16, seed=99), "warm")
    segments: list[dict[str, Any]] = []
    for block in range(blocks):
        order = (True, False, False, True) if block % 2 == 0 else (False, True, True, False)
        for position, on in enumerate(order):
            switch.set(on)
            seed = 1000 + 4 * block + position
            bridge_before = switch.bridge_cpu_s()
            before, wall = thread_cpu_s(), time.perf_counter()
            tokens = run(prompts(count, seed=seed), f"b{block}p{position}-")
            wall = time.perf_counter() - wall
            after = thread_cpu_s()
            bridge_cpu = switch.bridge_cpu_s() - bridge_before
            cpu = {name: after[name] - before.get(name, 0.0) for name in after}
            segments.append(
                {
                    "block": block,
                    "on": on,
                    "tokens_per_s": tokens / wall,
                    "engine_cpu_s": cpu.get("MainThread", 0.0),
                    "sender_cpu_s": cpu.get("kvscope-publisher", 0.0),
                    "bridge_cpu_s": bridge_cpu,
                }
            )
    switch.set(False)
    if subscriber is not None:
        subscriber.kill()
    print("result " + json.dumps(segments), flush=True)


def _summary(segments: list[dict[str, Any]]) -> dict[str, Any]:
    on = [s["tokens_per_s"] for s in segments if s["on"]]
    off = [s["tokens_per_s"] for s in segments if not s["on"]]
    block_ratios = []
    for block in sorted({s["block"] for s in segments}):
        mine = [s for s in segments if s["block"] == block]
        mean_on = statistics.fmean(s["tokens_per_s"] for s in mine if s["on"])
        mean_off = statistics.fmean(s["tokens_per_s"] for s in mine if not s["on"])
        block_ratios.append(mean_on / mean_off)
    engine_on = sum(s["engine_cpu_s"] for s in segments if s["on"])
    sender_on = sum(s["sender_cpu_s"] for s in segments if s["on"])
    sender_off = sum(s["sender_cpu_s"] for s in segments if not s["on"])
    return {
        "median_tokens_per_s": {"on": statistics.median(on), "off": statistics.median(off)},
        "throughput_ratio": statistics.median(on) / statistics.median(off),
        "block_ratio_mean": statistics.fmean(block_ratios),
        "block_ratio_stdev": statistics.stdev(block_ratios) if len(block_ratios) > 1 else 0.0,
        "sender_cpu_share_on": sender_on / engine_on if engine_on else 0.0,
        "sender_cpu_s": {"on": sender_on, "off": sender_off},
        "bridge_cpu_s": {"on": sum(s["bridge_cpu_s"] for s in segments if s["on"])},
    }


def main() -> None:
    """Run the interleaved child against a local broker and print the summary as JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=10, help="ABBA blocks (default: 10)")
    parser.add_argument(
        "--prompts", type=int, default=100, help="prompts per segment (default: 100)"
    )
    parser.add_argument(
        "--linger-ms",
        type=float,
        help="the publisher's linger_ms (KVSCOPE_LINGER_MS; default: the publisher's default)",
    )
    parser.add_argument(
        "--kv-events",
        choices=("tee", "sidecar"),
        default="tee",
        help="how KV events reach Kafka in 'on' segments: the in-engine tee, or a bridge "
        "child process (KVSCOPE_KV_EVENTS_SIDECAR; default: %(default)s)",
    )
    parser.add_argument(
        "--router",
        action="store_true",
        help="keep a plain ZMQ subscriber on vLLM's KV events in every segment, as a "
        "KV-aware router would (default: no subscriber)",
    )
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from kvscope.local.broker import LocalBroker
    from support.tinyllama import build_tiny_llama

    os.sched_setaffinity(0, set(range(os.cpu_count() or 2)) - {ENGINE_CORE})
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp, LocalBroker() as broker:
        model_dir = build_tiny_llama(Path(tmp) / "model")
        env = {k: v for k, v in os.environ.items() if not k.startswith("KVSCOPE_")}
        env.update(
            OMP_NUM_THREADS="1",
            KVSCOPE_BOOTSTRAP_SERVERS=broker.bootstrap_servers,
            KVSCOPE_TOPIC_PREFIX="bench-interleaved.",
            KVSCOPE_INSTANCE="bench:8000",
            KVSCOPE_STATS_INTERVAL_S="1",
        )
        if args.linger_ms is not None:
            env["KVSCOPE_LINGER_MS"] = str(args.linger_ms)
        if args.kv_events == "sidecar":
            env["KVSCOPE_KV_EVENTS_SIDECAR"] = "1"
        command = [sys.executable, __file__, "--child", str(model_dir), tmp]
        command += [str(args.blocks), str(args.prompts), args.kv_events, str(int(args.router))]
        proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=3600)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("result ")]
    if not lines:
        raise SystemExit(f"the engine run failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    segments = json.loads(lines[0].split(" ", 1)[1])
    report = {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}",
        "load_average_1m": {"before": load_before, "after": os.getloadavg()[0]},
        "blocks": args.blocks,
        "prompts_per_segment": args.prompts,
        "linger_ms": args.linger_ms,
        "kv_events": args.kv_events,
        "router": args.router,
        **_summary(segments),
        "segments": segments,
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        child(*sys.argv[2:4], int(sys.argv[4]), int(sys.argv[5]), sys.argv[6], sys.argv[7] == "1")
    elif sys.argv[1:2] == ["--router"]:
        router(sys.argv[2])
    else:
        main()
