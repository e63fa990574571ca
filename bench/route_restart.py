"""`kvscope route` and `kvscope index` SIGKILLed mid-trace on real engines: time to ready
and the hit rate after, against the same trace uninterrupted.

The fleet, the trace and the hit counting are bench/route_real.py's: three `vllm serve`
engines of the tiny Llama (12 blocks of 32 tokens each, kvscope's plugin publishing to a
local broker), `kvscope index` on that broker, `kvscope route --index URL` in front of the
engines, and multi-turn chats sharing system prompts in groups of 3 (120 chats x 5 turns =
600 requests, interleaved). The trace runs twice on the same engines and services, each
time on its own token alphabet so neither run reuses the other's blocks:

- `uninterrupted`: the 600 requests one after the other;
- `restarted`: after request 300 the router and the index are SIGKILLed and started again
  at once on the same ports (the index reads the topic from its beginning: no stored
  state); the trace goes on once the router routes by its index again.

Ready: the index's /healthz answers 200 (caught up) and the router's /healthz 200. Later
the router routes by its index again (its /healthz says the index's state is `ok`; until
then it routes by load). Reported: seconds from the restart to each, and per part
(requests 0-299, 300-399, 400-599) of both runs the hit rate (vLLM's `cached_tokens` over
prompt tokens) and the router's decisions by basis (`index`, or load because the index was
over its budget, not ready, ...).

    python bench/route_restart.py [--chats 120] [--turns 5] [--seed 1] [--index-timeout S]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import httpx

BENCH = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH), str(BENCH.parent / "tests")]

from route_real import HASH_SEED, run_mode, shifted, workload  # noqa: E402

KILL_AFTER = 300
NEXT = 100
POLL_S = 0.02
DECISION = re.compile(r'kvscope_route_decisions_total\{.*basis="([a-z_]+)".*\} ([0-9.e+]+)')


class Service:
    """`kvscope COMMAND ARGS --port PORT` as a child process that can be killed and restarted
    on the same port."""

    def __init__(self, command: str, args: list[str], port: int, work: Path) -> None:
        self.argv = [sys.executable, "-m", "kvscope.cli", command, *args, "--port", str(port)]
        self.url = f"http://127.0.0.1:{port}"
        self.log = work / f"{command}.log"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start it (its output appended to its log)."""
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(self.argv, stdout=out, stderr=out)

    def kill(self) -> None:
        """SIGKILL, and reap it."""
        assert self.process is not None
        self.process.kill()
        self.process.wait()

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it does not stop."""
        from kvscope.local.processes import stop_process

        if self.process is not None:
            stop_process(self.process, grace_s=10)


def wait_for(check: Callable[[], bool], what: str, timeout_s: float = 120) -> float:
    """Poll `check` until it holds; the monotonic time it first did."""
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise SystemExit(f"{what} not ready after {timeout_s:.0f} s")
        time.sleep(POLL_S)
    return time.monotonic()


@functools.cache
def http() -> httpx.Client:
    """One client for every poll, each on a new connection (a restarted service leaves
    no stale one): `httpx.get` builds a client and its TLS context per call, ~30 ms of
    CPU, which at three polls per `POLL_S` took most of a core from the services starting
    beside it."""
    import httpx

    return httpx.Client(limits=httpx.Limits(max_keepalive_connections=0))


def healthz(url: str) -> tuple[int, dict[str, Any]]:
    """(status, JSON body) of `url`/healthz; (0, {}) when it does not answer."""
    import httpx

    try:
        answer = http().get(f"{url}/healthz", timeout=1)
        return answer.status_code, answer.json()
    except (httpx.HTTPError, ValueError):
        return 0, {}


def index_ready(index: Service) -> bool:
    """The index answers its /healthz with 200 (caught up with the topic)."""
    return healthz(index.url)[0] == 200


def router_ready(router: Service) -> bool:
    """The router answers its /healthz with 200 and routes by its index (state ok)."""
    status, body = healthz(router.url)
    return status == 200 and body.get("index", {}).get("state") == "ok"


def restart(index: Service, router: Service) -> dict[str, float]:
    """SIGKILL both, start both at once; seconds until the index answers 200, the router
    answers 200, and the router routes by its index."""
    index.kill()
    router.kill()
    started = time.monotonic()
    index.start()
    router.start()
    checks = {
        "index_ready_s": lambda: index_ready(index),
        "router_up_s": lambda: healthz(router.url)[0] == 200,
        "by_index_s": lambda: router_ready(router),
    }
    seen: dict[str, float] = {}
    while len(seen) < len(checks):
        for name, check in checks.items():
            if name not in seen and check():
                seen[name] = time.monotonic() - started
        if time.monotonic() - started > 120:
            raise SystemExit(f"not ready after 120 s: {sorted(set(checks) - set(seen))}")
        time.sleep(POLL_S)
    seen["ready_s"] = max(seen["index_ready_s"], seen["router_up_s"])
    return seen


def bases(url: str) -> dict[str, float]:
    """The router's decisions so far by basis (index, index_timeout, ...: its /metrics)."""
    counts: dict[str, float] = {}
    for line in http().get(f"{url}/metrics", timeout=10).text.splitlines():
        found = DECISION.match(line)
        if found:
            counts[found[1]] = counts.get(found[1], 0.0) + float(found[2])
    return counts


def run_part(url: str, requests: list[list[int]]) -> dict[str, Any]:
    """The requests through the router: vLLM's hit counts, and the router's decisions by
    basis."""
    before = bases(url)
    result = run_mode([url], [(0, p) for p in requests], "tiny")
    after = bases(url)
    result["basis"] = {
        k: int(v - before.get(k, 0.0)) for k, v in after.items() if v > before.get(k, 0.0)
    }
    return result


def run_trace(
    url: str, requests: list[list[int]], between: Callable[[], dict[str, float]] | None
) -> dict[str, Any]:
    """The requests through the router in three parts (`between` runs after the first)."""
    result = {"first": run_part(url, requests[:KILL_AFTER])}
    if between is not None:
        result["restart"] = between()
    result["next"] = run_part(url, requests[KILL_AFTER : KILL_AFTER + NEXT])
    result["rest"] = run_part(url, requests[KILL_AFTER + NEXT :])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--chats", type=int, default=120)
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--index-timeout", default="", help="the router's; its default if unset")
    args = parser.parse_args()
    from kvscope.local.broker import LocalBroker, free_port
    from support.route_fleet import engines
    from support.tinyllama import build_tiny_llama

    trace = [prompt for _, prompt in workload(args.chats, args.turns, args.seed)]
    started, load_before = datetime.now(UTC), os.getloadavg()
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp, LocalBroker() as broker:
        work = Path(tmp)
        model = build_tiny_llama(work / "model")
        prefix = "bench."
        env = {"KVSCOPE_BOOTSTRAP_SERVERS": broker.bootstrap_servers,
               "KVSCOPE_TOPIC_PREFIX": prefix, "KVSCOPE_INSTANCE": "e{i}",
               "PYTHONHASHSEED": HASH_SEED}  # fmt: skip
        with engines(model, work, 3, env, "--enable-prompt-tokens-details") as urls:
            index = Service("index", ["--bootstrap-servers", broker.bootstrap_servers,
                                      "--topic-prefix", prefix, "--hash-seed", HASH_SEED],
                            free_port(), work)  # fmt: skip
            spec = ",".join(f"e{i}={url}" for i, url in enumerate(urls))
            budget = ["--index-timeout", args.index_timeout] if args.index_timeout else []
            router = Service("route", ["--engines", spec, "--index", index.url, *budget],
                             free_port(), work)  # fmt: skip
            try:
                index.start()
                router.start()
                wait_for(lambda: healthz(router.url)[0] == 200, "the router")
                run_mode([router.url], [(0, shifted(trace[0], 400))], "tiny")  # the topic
                wait_for(lambda: index_ready(index) and router_ready(router), "both")
                results["uninterrupted"] = run_trace(router.url, trace, None)
                again = [shifted(p, 196) for p in trace]
                results["restarted"] = run_trace(router.url, again, lambda: restart(index, router))
            finally:
                router.stop()
                index.stop()
    report(results, args, started, load_before)


def report(
    results: dict[str, Any], args: argparse.Namespace, started: datetime, load: tuple[float, ...]
) -> None:
    """Print the run's figures: JSON, then one line per measure."""
    now = os.getloadavg()
    machine = f"{platform.machine()}, {os.cpu_count()} cpus"
    print(f"# route_restart {started:%Y-%m-%d %H:%M} UTC on {machine}, "
          f"load {load[0]:.1f} before, {now[0]:.1f} after")  # fmt: skip
    print(f"# {args.chats} chats x {args.turns} turns, seed {args.seed}, 3 engines x 12 blocks")
    print(json.dumps(results, indent=1))
    took = results["restarted"]["restart"]
    print(f"ready after restart: {took['ready_s']:.2f} s (index {took['index_ready_s']:.2f} s, "
          f"router {took['router_up_s']:.2f} s); routing by the index after "
          f"{took['by_index_s']:.2f} s")  # fmt: skip
    for part in ("first", "next", "rest"):
        calm, hit = (results[run][part] for run in ("uninterrupted", "restarted"))
        print(f"requests {part}: hit rate {hit['hit_rate']:.3f} restarted, "
              f"{calm['hit_rate']:.3f} uninterrupted "
              f"({(hit['hit_rate'] - calm['hit_rate']) * 100:+.1f} points); "
              f"bases {hit['basis']} restarted, {calm['basis']} uninterrupted")  # fmt: skip


if __name__ == "__main__":
    main()
