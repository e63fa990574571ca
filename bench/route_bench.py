"""What the router benches read from the processes they start: a router as a child process
with its log, its CPU time from /proc, the engines' prefix-cache counters and the
`basis` counts of `kvscope route`'s decisions from the /metrics pages, and the engines'
prefix caches emptied between runs (vLLM's `POST /reset_prefix_cache`, served with
`VLLM_SERVER_DEV_MODE=1`)."""

from __future__ import annotations

import os
import re
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

from kvscope.local.processes import log_tail, stop_process

TICK = os.sysconf("SC_CLK_TCK")
SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? ([0-9.eE+-]+)$", re.M)


@contextmanager
def child(
    argv: Sequence[str], log: Path, health: str, env: Mapping[str, str] | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    """`argv` as a child process logging to `log`, yielded once GET `health` (a URL) answers
    any HTTP status; stopped (SIGTERM, then SIGKILL) on exit."""
    with log.open("wb") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=out, env={**os.environ, **(env or {})})
    try:
        deadline = time.monotonic() + 120
        while True:
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{argv[0]} did not start:\n{log_tail(log)}")
            try:
                urllib.request.urlopen(health, timeout=2).close()
                break
            except urllib.error.HTTPError:
                break
            except OSError:
                time.sleep(0.2)
        yield process
    finally:
        stop_process(process, grace_s=10)


def tree(pid: int) -> list[int]:
    """`pid` and its live descendants."""
    found = [pid]
    for parent in found:
        for task in Path(f"/proc/{parent}/task").glob("*"):
            try:
                found += [int(c) for c in (task / "children").read_text().split()]
            except OSError:
                continue
    return found


def cpu_seconds(pids: Sequence[int]) -> float:
    """User + system CPU seconds the processes have used so far (exited ones count 0)."""
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total / TICK


def metric_sums(url: str, name: str, label: str | None = None) -> dict[str, float]:
    """Sum of the samples of `name` on the Prometheus page `url`, by the value of `label`
    (all under "" without one)."""
    with urllib.request.urlopen(url, timeout=10) as answer:
        text = answer.read().decode()
    sums: dict[str, float] = {}
    for metric, labels, value in SAMPLE.findall(text):
        if metric != name:
            continue
        found = re.search(rf'{label}="([^"]*)"', labels or "") if label else None
        key = found.group(1) if found else ""
        sums[key] = sums.get(key, 0.0) + float(value)
    return sums


def prefix_cache_counts(engines: Sequence[str]) -> tuple[float, float]:
    """(hit, queried) prompt tokens summed over the engines' vLLM counters."""
    hits = queries = 0.0
    for engine in engines:
        hits += sum(metric_sums(f"{engine}/metrics", "vllm:prefix_cache_hits_total").values())
        queries += sum(metric_sums(f"{engine}/metrics", "vllm:prefix_cache_queries_total").values())
    return hits, queries


def served(engines: Sequence[str]) -> list[int]:
    """Requests each engine has finished so far (vLLM's `vllm:request_success_total`)."""
    return [
        int(sum(metric_sums(f"{engine}/metrics", "vllm:request_success_total").values()))
        for engine in engines
    ]


def decisions(router: str) -> dict[str, float]:
    """`kvscope route`'s decisions so far by basis (index, load, index_timeout, ...)."""
    return metric_sums(f"{router}/metrics", "kvscope_route_decisions_total", "basis")


def reset_prefix_caches(engines: Sequence[str]) -> None:
    """Empty every engine's prefix cache (retried while requests still hold blocks)."""
    for engine in engines:
        for _ in range(50):
            request = urllib.request.Request(f"{engine}/reset_prefix_cache", method="POST")
            with urllib.request.urlopen(request, timeout=30) as answer:
                if b"true" in answer.read():
                    break
            time.sleep(0.1)
        else:
            raise RuntimeError(f"{engine} did not reset its prefix cache")
