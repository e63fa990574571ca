"""docker/grafana: the committed dashboards are the generator's output, and every panel
points at a provisioned data source and reads only what exists (query files, rules)."""

from __future__ import annotations

import json
import re

import pytest
from kvscope.analytics.queries import list_queries
from support.deploy_files import DOCKER, load_dashboard_generator, recorded_names

GRAFANA = DOCKER / "grafana"
DASHBOARD_DIR = GRAFANA / "dashboards"


@pytest.fixture(scope="module")
def generator():
    """docker/grafana/generate.py, loaded as a module."""
    return load_dashboard_generator()


def _datasource_uids() -> set[str]:
    text = (GRAFANA / "provisioning" / "datasources" / "kvscope.yml").read_text()
    return set(re.findall(r"^\s+uid: (\S+)$", text, flags=re.MULTILINE))


def test_committed_json_is_the_generator_output(generator) -> None:
    generated = generator.render_all()
    committed = {p.name: p.read_text() for p in DASHBOARD_DIR.glob("*.json")}
    assert sorted(committed) == sorted(generated)
    for name, text in generated.items():
        assert committed[name] == text, f"{name} is stale: run python docker/grafana/generate.py"
    assert generator.main(["--check"]) == 0


def test_every_panel_uses_a_provisioned_datasource_and_known_sources(generator) -> None:
    uids = _datasource_uids()
    queries = {q.name for q in list_queries()}
    recorded = recorded_names()
    panel_count = 0
    for path in sorted(DASHBOARD_DIR.glob("*.json")):
        dashboard = json.loads(path.read_text())
        variables = {v["name"] for v in dashboard["templating"]["list"]}
        ids = [p["id"] for p in dashboard["panels"]]
        assert len(ids) == len(set(ids)), path.name
        for panel in dashboard["panels"]:
            panel_count += 1
            assert panel["datasource"]["uid"] in uids, panel["title"]
            for target in panel["targets"]:
                assert target["datasource"]["uid"] in uids
                if "rawSql" in target:
                    assert target["meta"]["kvscope"]["query"] in queries
                    used = set(re.findall(r"\$\{(\w+):sqlstring\}", target["rawSql"]))
                    assert used <= variables, f"{panel['title']} uses {used - variables}"
                else:
                    names = set(re.findall(r"kvscope[:_][a-z0-9_:]+", target["expr"]))
                    assert names, target["expr"]
                    recorded_or_raw = {n for n in names if ":" not in n or n in recorded}
                    assert recorded_or_raw == names, f"{target['expr']}: no such rule"
    assert panel_count == sum(len(d.panels) for d in generator.DASHBOARDS)


def test_check_mode_reports_a_stale_file(generator, tmp_path, monkeypatch, capsys) -> None:
    for name, text in generator.render_all().items():
        (tmp_path / name).write_text(text)
    monkeypatch.setattr(generator, "OUT_DIR", tmp_path)
    assert generator.main(["--check"]) == 0
    (tmp_path / "fleet.json").write_text("{}\n")
    (tmp_path / "old.json").write_text("{}\n")
    assert generator.main(["--check"]) == 1
    out = capsys.readouterr().out
    assert "fleet.json is out of date" in out and "old.json" in out
    assert generator.main([]) == 0
    assert not (tmp_path / "old.json").exists()
    assert (tmp_path / "fleet.json").read_text() == generator.render_all()["fleet.json"]
