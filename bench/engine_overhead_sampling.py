"""kvscope's share of a vLLM engine process, sampled from outside with py-spy.

`Sampler` runs `py-spy record --rate 200 --threads --format raw` on a process (every
thread; py-spy leaves out samples of threads blocked in a wait unless `--idle` is given)
for as long as the caller wants; `shares()` reads its raw output and attributes each sample
by its innermost frame that belongs to kvscope or to vLLM's ZMQ publisher: kvscope's when
that frame is kvscope's code, vLLM ZMQ's when it is `vllm/distributed/kv_events.py`,
the engine's otherwise. So aiokafka running on kvscope's sender thread is kvscope's and
vLLM's ZMQ send under kvscope's tee is ZMQ's; vLLM's own work that kvscope's observers
wrap (`_free_blocks`) is the engine's (also reported without that exception); the bench's
own hook timers (`HookTimer`, the attribution from inside) are nobody's and left out,
as are samples whose innermost frame is a wait py-spy missed (`WAITS`).

    python bench/engine_overhead_sampling.py RAW_FILE   # attribute a saved profile
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
KVSCOPE_DIRS = tuple(f"{REPO / name}/" for name in ("publisher", "schemas", "common"))
ZMQ_FILE = "vllm/distributed/kv_events.py"
BENCH_DIR = f"{REPO / 'bench'}/"
RATE_HZ = 200
_FRAME = re.compile(r"^(?P<func>.*) \((?P<file>[^()]*\.py):\d+\)$")
WAITS = frozenset(
    {
        ("Condition.wait", "threading.py"),
        ("Event.wait", "threading.py"),
        ("BaseSelector.select", "selectors.py"),
        ("EpollSelector.select", "selectors.py"),
        ("select", "selectors.py"),
        ("Poller.poll", "poll.py"),
        ("Socket.poll", "socket.py"),
    }
)
"""Innermost frames of a thread blocked in a wait that py-spy still counts as active
(seen: vLLM's ZMQ thread in `Queue.get(timeout=...)` -> `Condition.wait`); left out."""


class Sampler:
    """`py-spy record` on one process until `stop()`; the raw profile goes to `out`."""

    def __init__(self, pid: int, out: Path) -> None:
        self.out = out
        out.parent.mkdir(parents=True, exist_ok=True)
        command = ["py-spy", "record", "--pid", str(pid), "--rate", str(RATE_HZ)]
        command += ["--threads", "--full-filenames", "--format", "raw", "-o", str(out)]
        self._proc = subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )

    def stop(self) -> str:
        """Stop sampling (py-spy writes its file on SIGINT); the raw profile's text."""
        self._proc.send_signal(signal.SIGINT)
        _, err = self._proc.communicate(timeout=60)
        if not self.out.exists():
            raise RuntimeError(f"py-spy wrote no profile: {err[-2000:]}")
        return self.out.read_text()


def owner(stack: list[str], wrapped_vllm_is_engine: bool = True) -> str:
    """Who a sample (frames outermost first) belongs to: "kvscope", "zmq", "engine", or
    "bench" (this bench's own hook timers, left out of the shares).

    By the innermost frame of kvscope or of vLLM's ZMQ publisher (libraries, aiokafka on
    kvscope's thread included, belong to their caller). With `wrapped_vllm_is_engine`, an
    inner frame of other vLLM code (or of this bench's timers) ends the search as the
    engine's: vLLM's own `_free_blocks` run by kvscope's observer is vLLM's work.
    """
    for frame in reversed(stack):
        match = _FRAME.match(frame)
        if match is None:
            continue
        path = match["file"]
        if path.startswith(KVSCOPE_DIRS) or "/site-packages/kvscope/" in path:
            return "kvscope"
        if path.endswith(ZMQ_FILE):
            return "zmq"
        if path.startswith(BENCH_DIR):
            return "bench"
        if wrapped_vllm_is_engine and "/vllm/" in path:
            return "engine"
    return "engine"


def shares(raw: str, top: int = 8) -> dict[str, Any]:
    """Active samples and kvscope's and vLLM ZMQ's shares of them, with kvscope's top
    innermost frames (where its time goes). `kvscope_share_with_wrapped_vllm` counts vLLM's
    own work under kvscope's wrappers as kvscope's too (the issue's first reading)."""
    owners: Counter[str] = Counter()
    where: Counter[str] = Counter()
    literal = 0
    for line in raw.splitlines():
        stack_text, _, count_text = line.rpartition(" ")
        if not stack_text or not count_text.isdigit():
            continue
        count = int(count_text)
        stack = stack_text.split(";")
        if _waiting(stack[-1]):
            owners["waiting"] += count
            continue
        who = owner(stack)
        owners[who] += count
        if who != "bench" and owner(stack, wrapped_vllm_is_engine=False) == "kvscope":
            literal += count
        if who == "kvscope":
            where[_short(stack[-1])] += count
    waiting = owners.pop("waiting", 0)
    timers = owners.pop("bench", 0)
    total = sum(owners.values())
    return {
        "active_samples": total,
        "waiting_samples_left_out": waiting,
        "bench_timer_samples_left_out": timers,
        "kvscope_share": owners["kvscope"] / total if total else 0.0,
        "zmq_share": owners["zmq"] / total if total else 0.0,
        "kvscope_share_with_wrapped_vllm": literal / total if total else 0.0,
        "kvscope_top": dict(where.most_common(top)),
    }


def _waiting(frame: str) -> bool:
    """Whether the innermost frame is one of `WAITS`."""
    match = _FRAME.match(frame)
    return match is not None and (match["func"], Path(match["file"]).name) in WAITS


def _short(frame: str) -> str:
    """`func (…/package/module.py)` for a frame: the last two path parts, no line."""
    match = _FRAME.match(frame)
    if match is None:
        return frame
    return f"{match['func']} ({'/'.join(Path(match['file']).parts[-2:])})"


if __name__ == "__main__":
    print(json.dumps(shares(Path(sys.argv[1]).read_text()), indent=2))
