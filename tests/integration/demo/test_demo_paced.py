"""`kvscope demo --pace`: the simulated fleet publishes at a real pace while the serve stores it.

Real processes throughout: the demo runs as a user runs it (its broker, collector, chDB
and dashboard), the checks read its dashboard API while it runs and its chDB directory
after it. Timing enters only as bounds the test's own clock proves (a record stamped `ts`
was published no earlier than `ts`; a run spanning S simulated seconds at pace P took at
least S/P wall seconds), never as an expected duration.
"""

from __future__ import annotations

import datetime as dt
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from kvscope.local.demo_scales import SCALES
from support.serve_kit import kvscope

DEMO = [sys.executable, "-m", "kvscope.cli", "demo", "--scale", "small"]
FAR_FUTURE = "2100-01-01T00:00:00"
"""`until` for the span queries: also rows stamped later than now would show."""
STAMP_SLACK_S = 0.001
"""Timestamps are whole microseconds (rounded): the only tolerance on the wall-clock bound."""


def epoch(text: str) -> float:
    """Epoch seconds of an ISO 8601 time from the API or `kvscope query` (UTC when naive)."""
    value = dt.datetime.fromisoformat(text)
    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.UTC)
    return value.timestamp()


def span_rows(rows: list[dict[str, Any]]) -> tuple[int, float, float]:
    """(rows, first ts, last ts) over the raw tables of a `report_span` answer."""
    filled = [r for r in rows if r["rows"]]
    if not filled:
        return 0, 0.0, 0.0
    return (
        sum(r["rows"] for r in filled),
        min(epoch(r["first_ts"]) for r in filled),
        max(epoch(r["last_ts"]) for r in filled),
    )


def api_span(url: str) -> tuple[int, float, float]:
    """`report_span` through the running demo's dashboard API."""
    with urllib.request.urlopen(f"{url}/api/query/report_span?until={FAR_FUTURE}", timeout=60) as r:
        return span_rows(json.loads(r.read())["rows"])


def stored_span(out: Path) -> tuple[int, float, float]:
    """`report_span` read from the demo's chDB directory after it ended."""
    result = kvscope(
        "query", "report_span", "--clickhouse", f"chdb://{out / 'chdb'}?database=kvscope",
        "--param", f"until={FAR_FUTURE}", "--format", "json",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return span_rows(json.loads(result.stdout))


def start_demo(out: Path, pace: float, stderr: Any) -> tuple[subprocess.Popen[str], str]:
    """Start a paced demo in its own session (so a group signal is a terminal's Ctrl-C);
    return it and its dashboard URL once it printed it."""
    demo = subprocess.Popen(
        [*DEMO, "--out", str(out), "--serve-port", "0", "--pace", str(pace)],
        stdout=subprocess.PIPE,
        stderr=stderr,
        text=True,
        start_new_session=True,
    )
    assert demo.stdout is not None
    line = demo.stdout.readline()
    assert "live dashboard at" in line, f"no dashboard line, got {line!r}"
    return demo, line.split(" at ", 1)[1].strip().rstrip("/")


def published_and_stored(stdout: str) -> tuple[int, int]:
    """(published, stored) from the demo's summary line."""
    found = re.search(r"([\d,]+) of ([\d,]+) published records stored", stdout)
    assert found, stdout
    return int(found[2].replace(",", "")), int(found[1].replace(",", ""))


def test_live_at_real_time_and_ctrl_c_keeps_what_was_published(tmp_path: Path) -> None:
    """Pace 1: rows reach the dashboard while the demo runs, stamped with the wall-clock
    time of their publication; a terminal's Ctrl-C (SIGINT to the whole process group, the
    broker included) ends the publishing, and everything published is stored and
    reported (exit 0)."""
    out = tmp_path / "demo"
    launched = time.time()
    with (tmp_path / "stderr.txt").open("w+") as stderr:
        demo, url = start_demo(out, 1.0, stderr)
        try:
            polls: list[tuple[float, int, float, float]] = []
            deadline = time.monotonic() + 120
            # Two polls that both see rows, the second more: data arrives while we watch.
            while not (len(polls) >= 2 and polls[0][1] < polls[-1][1]):
                assert time.monotonic() < deadline, f"no growing rows on the dashboard: {polls}"
                rows, first, last = api_span(url)
                asked_at = time.time()
                assert demo.poll() is None, "the demo ended before the checks"
                if rows:
                    polls.append((asked_at, rows, first, last))
                time.sleep(0.5)
            for asked_at, _, first, last in polls:
                assert first >= launched, "a record stamped before the demo started"
                assert last <= asked_at + STAMP_SLACK_S, "a record stamped in the future"
            stopped_at = time.time()
            os.killpg(demo.pid, signal.SIGINT)
            stdout, _ = demo.communicate(timeout=180)
        finally:
            if demo.poll() is None:
                os.killpg(demo.pid, signal.SIGKILL)
                demo.wait()
        stderr.seek(0)
        errors = stderr.read()
    assert demo.returncode == 0, f"{stdout}\n{errors}"
    assert "stopped publishing" in errors
    assert "Traceback" not in errors
    published, stored = published_and_stored(stdout)
    assert published > 0 and stored == published, "what was published was all stored"
    assert (out / "report.html").is_file() and (out / "report.json").is_file()
    rows, first, last = stored_span(out)
    assert rows >= polls[-1][1]
    assert launched <= first <= last <= stopped_at + STAMP_SLACK_S
    # At pace 1 the stamps cover no more simulated time than wall time passed.
    assert last - first <= stopped_at - launched


def test_faster_pace_runs_to_the_end_with_progress_lines(tmp_path: Path) -> None:
    """Pace 60 on the small fleet (about 12 simulated minutes): the stamps span the
    simulated run, none lies ahead of the wall clock, the demo took at least span/60 wall
    seconds (a lower bound only), everything published is stored, and stderr shows
    progress lines whose simulated time and record counts grow."""
    pace = 60.0
    scale = SCALES["small"]
    out = tmp_path / "demo"
    launched = time.time()
    with (tmp_path / "stderr.txt").open("w+") as stderr:
        demo, _ = start_demo(out, pace, stderr)
        try:
            stdout, _ = demo.communicate(timeout=300)
        finally:
            if demo.poll() is None:
                os.killpg(demo.pid, signal.SIGKILL)
                demo.wait()
        ended = time.time()
        stderr.seek(0)
        errors = stderr.read()
    assert demo.returncode == 0, f"{stdout}\n{errors}"
    published, stored = published_and_stored(stdout)
    assert stored == published > 0
    _, first, last = stored_span(out)
    simulated = scale.requests / scale.rate
    assert last - first >= 0.9 * simulated, "the stamps span the simulated run"
    assert ended - launched >= (last - first) / pace
    assert last <= ended + STAMP_SLACK_S, "no record stamped ahead of the wall clock"
    progress = [
        (int(m[1]) * 3600 + int(m[2]) * 60 + int(m[3]), int(m[4].replace(",", "")))
        for m in re.finditer(
            r"publishing: simulated (\d+):(\d\d):(\d\d) of about [\d:]+, ([\d,]+) records", errors
        )
    ]
    assert len(progress) >= 2, errors
    assert all(a[0] < b[0] and a[1] < b[1] for a, b in itertools.pairwise(progress))
    assert progress[-1][1] <= published
