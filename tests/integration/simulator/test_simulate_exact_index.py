"""`kvscope simulate --routing exact-index` through the real broker routes as in process.

With `--bootstrap-servers`, the index that routes is kvscope's own, reading the kv-events
topic back with the index's Kafka reader while the fleet runs; with `--dry-run` it is fed
in process. Both must see the same records before every decision, so the runs must agree
in every figure of the truth. The second run on the same topic finds the first run's
records there, with the same epochs and seqs (same seed): they must not leak into it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

SIMULATE = [sys.executable, "-m", "kvscope.cli", "simulate", "--routing", "exact-index"]


def simulate(tmp_path: Path, name: str, *args: str) -> dict[str, Any]:
    """Run `kvscope simulate` as a user does and return its truth file."""
    truth = tmp_path / f"{name}.json"
    result = subprocess.run(
        [*SIMULATE, *args, "--truth", str(truth)],
        capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    loaded: dict[str, Any] = json.loads(truth.read_text())
    return loaded


@pytest.mark.parametrize(("instances", "lag"), [("3", "0"), ("1p,2d", "1")])
def test_exact_index_through_the_broker_routes_as_in_process(
    bootstrap_servers: str, topic_prefix: str, tmp_path: Path, instances: str, lag: str
) -> None:
    run = ["--instances", instances, "--requests", "80", "--index-lag", lag, "--seed", "4"]
    run += ["--workload", "multi-turn", "--capacity-blocks", "120", "--start-time", "1767225600"]
    in_process = simulate(tmp_path, "dry", *run, "--dry-run")
    kafka = ["--bootstrap-servers", bootstrap_servers, "--topic-prefix", topic_prefix]
    for attempt in range(2):
        brokered = simulate(tmp_path, f"kafka-{attempt}", *run, *kafka)
        assert brokered["routing"] == in_process["routing"]
        assert brokered["fleet"] == in_process["fleet"]
        assert brokered["sources"] == in_process["sources"]
    stats = in_process["routing"]
    assert stats["decisions"] >= 80 and stats["predicted_blocks"] > 0
    assert (stats["predicted_blocks"] == stats["resident_blocks"]) == (lag == "0")
