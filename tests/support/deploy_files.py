"""Helpers for the tests of docker/: rule files, the dashboard generator, metrics in code.

`required_tool` fails the test (never skips) when a real tool the test needs is missing;
.ci/run installs them. `exposed_metrics` imports every module that registers kvscope
metrics and lists the sample names Prometheus sees with their label names.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DOCKER = REPO / "docker"
RULES = DOCKER / "prometheus" / "kvscope.rules.yml"
SCRAPE_LABELS = frozenset({"job", "instance"})
"""Labels Prometheus adds to every scraped series."""
_METRIC = re.compile(r"\b(kvscope_[a-z0-9_]+|kvscope:[a-z0-9_:]+)")
_BY = re.compile(r"\bby\s*\(([^)]*)\)")
_MATCHERS = re.compile(r"\b(kvscope_[a-z0-9_]+)\{([^}]*)\}")


def required_tool(name: str, install: str) -> str:
    """Path of executable `name`; fails the test with the install hint when it is missing."""
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} not found on PATH: {install} (.ci/run does this)")
    return path


def load_yaml_documents(path: Path) -> list[Any]:
    """Every YAML document in `path`."""
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def rules() -> list[dict[str, Any]]:
    """Every rule (recording and alerting) in docker/prometheus/kvscope.rules.yml."""
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def recorded_names() -> set[str]:
    """Names of the series the recording rules produce."""
    return {rule["record"] for rule in rules() if "record" in rule}


def metric_names(expr: str) -> set[str]:
    """kvscope metric and recording-rule names used in a PromQL expression."""
    return set(_METRIC.findall(expr))


def grouping_labels(expr: str) -> set[str]:
    """Labels named in `by (...)` clauses of a PromQL expression."""
    return {label.strip() for group in _BY.findall(expr) for label in group.split(",")} - {""}


def matcher_labels(expr: str) -> dict[str, set[str]]:
    """Metric name -> label names in its `{...}` matchers."""
    found: dict[str, set[str]] = {}
    for name, body in _MATCHERS.findall(expr):
        labels = {part.split("=")[0].strip(" !~") for part in body.split(",") if part.strip()}
        found.setdefault(name, set()).update(labels)
    return found


def exposed_metrics() -> dict[str, set[str]]:
    """Sample name -> label names of every kvscope metric the code registers.

    Counters show as `<name>_total`, histograms as `_bucket` (with `le`), `_sum`, `_count`.
    """
    from kvscope.collector.pipeline import metrics as _collector  # noqa: F401
    from kvscope.publisher.bridge import metrics as _bridge  # noqa: F401
    from kvscope.publisher.metrics import publisher_metrics
    from kvscope.publisher.transfer_timer import transfer_latency_histogram
    from prometheus_client import REGISTRY

    publisher_metrics()
    transfer_latency_histogram()
    exposed: dict[str, set[str]] = {}
    for collector in list(REGISTRY._collector_to_names):
        labels = set(getattr(collector, "_labelnames", ()))
        for family in getattr(collector, "describe", list)():
            if not family.name.startswith("kvscope_"):
                continue
            if family.type == "counter":
                exposed[f"{family.name}_total"] = labels
            elif family.type == "histogram":
                exposed[f"{family.name}_bucket"] = labels | {"le"}
                exposed[f"{family.name}_sum"] = labels
                exposed[f"{family.name}_count"] = labels
            else:
                exposed[family.name] = labels
    return exposed


def load_dashboard_generator() -> ModuleType:
    """docker/grafana/generate.py as a module (docker/ is not a Python package)."""
    path = DOCKER / "grafana" / "generate.py"
    spec = importlib.util.spec_from_file_location("kvscope_grafana_generate", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while it executes
    spec.loader.exec_module(module)
    return module
