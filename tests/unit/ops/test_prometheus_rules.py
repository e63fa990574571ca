"""docker/prometheus: promtool accepts the rules and config and passes the rule unit tests;
every series the rules read is a metric the code registers, with the labels they use."""

from __future__ import annotations

import subprocess

import pytest
from support.deploy_files import (
    DOCKER,
    SCRAPE_LABELS,
    exposed_metrics,
    grouping_labels,
    matcher_labels,
    metric_names,
    recorded_names,
    required_tool,
    rules,
)

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


def test_rules_read_only_metrics_the_code_registers() -> None:
    exposed = exposed_metrics()
    known = set(exposed) | recorded_names()
    for rule in rules():
        used = metric_names(rule["expr"])
        name = rule.get("record") or rule["alert"]
        assert used <= known, f"{name} reads {sorted(used - known)}, which nothing exports"


@pytest.mark.parametrize("rule", rules(), ids=lambda r: r.get("record") or r["alert"])
def test_rule_labels_exist_on_the_metrics(rule: dict) -> None:
    exposed = exposed_metrics()
    raw = {m for m in metric_names(rule["expr"]) if m in exposed}
    available = set().union(*(exposed[m] for m in raw)) if raw else set()
    for metric, labels in matcher_labels(rule["expr"]).items():
        assert labels <= exposed[metric], f"{metric} has no label {labels - exposed[metric]}"
    if raw and not metric_names(rule["expr"]) & recorded_names():
        missing = grouping_labels(rule["expr"]) - available - SCRAPE_LABELS
        assert not missing, f"grouped by {sorted(missing)}, which no metric it reads has"
