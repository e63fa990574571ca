"""docker/prometheus: promtool accepts the rules and config and passes the rule unit tests."""

from __future__ import annotations

import subprocess

import pytest
from support.deploy_files import DOCKER, required_tool, rules

PROMETHEUS_DIR = DOCKER / "prometheus"


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    tool = required_tool("promtool", "apt-get install prometheus")
    return subprocess.run(
        [tool, *args], cwd=PROMETHEUS_DIR, capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize(
    "args",
    [
        ("check", "rules", "kvscope.rules.yml"),
        ("check", "config", "prometheus.yml"),
        ("test", "rules", "kvscope.rules.test.yml"),
    ],
    ids=lambda a: " ".join(a),
)
def test_promtool(args: tuple[str, ...]) -> None:
    done = _promtool(*args)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_every_alert_has_a_promtool_test() -> None:
    tests = (PROMETHEUS_DIR / "kvscope.rules.test.yml").read_text()
    alerts = [rule["alert"] for rule in rules() if "alert" in rule]
    assert alerts
    assert [a for a in alerts if f"alertname: {a}\n" not in tests] == []
