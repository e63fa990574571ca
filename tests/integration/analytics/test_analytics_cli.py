"""`kvscope simulate` and `kvscope query` end to end through the CLI entry point."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest
from kvscope.analytics.queries import bind_params, format_rows, list_queries, load_query
from kvscope.cli.main import main
from kvscope.schemas import ConfigError

MINE = {
    "capacity_what_if",
    "completeness",
    "duplication",
    "eviction_churn",
    "eviction_churn_timeline",
    "hit_rate",
    "refaults",
    "request_hit_rate",
    "residency",
    "routing_opportunity",
    "transfer_latency",
}


def test_dry_run_truth_file_is_deterministic(tmp_path: Path) -> None:
    args = ["simulate", "--dry-run", "--instances", "1p,1d", "--requests", "60", "--seed", "4"]
    args += ["--start-time", "1767225600"]  # the default start is now: fix it to compare
    assert main([*args, "--truth", str(tmp_path / "a.json")]) == 0
    assert main([*args, "--truth", str(tmp_path / "b.json")]) == 0
    a = (tmp_path / "a.json").read_text()
    assert a == (tmp_path / "b.json").read_text()
    truth = json.loads(a)
    assert 0 < truth["fleet"]["hit_rate"] < 1
    assert set(truth["sources"]) == {"prefill-0/0", "decode-0/0"}
    assert truth["transfers"]["prefill-0->decode-0"]["count"] == 60
    src = truth["sources"]["prefill-0/0"]
    assert {"stored_blocks", "removed_blocks", "cleared", "refaults", "hit_rate"} <= set(src)


def test_simulate_into_clickhouse_then_query(
    tmp_path: Path, clickhouse_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    truth_file = tmp_path / "truth.json"
    code = main(
        ["simulate", "--clickhouse", clickhouse_url, "--requests", "80", "--truth", str(truth_file)]
    )
    assert code == 0
    truth = json.loads(truth_file.read_text())
    capsys.readouterr()
    # No --start-time and the query's default until (now): the run ended before now, so
    # the query sees all of it (started now, its last ~4 simulated seconds were ahead).
    query = ["query", "hit_rate", "--clickhouse", clickhouse_url]
    assert main([*query, "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    fleet = next(r for r in rows if r["instance"] == "*")
    assert fleet["requests"] == truth["fleet"]["requests_finished"] == 80
    assert abs(fleet["hit_rate"] - truth["fleet"]["hit_rate"]) < 1e-9
    assert main([*query, "--format", "csv"]) == 0
    text = capsys.readouterr().out
    assert text.endswith("\n") and not text.endswith("\n\n"), "a blank last line"
    table = list(csv.DictReader(io.StringIO(text)))
    assert len(table) == len(rows) and "hit_rate" in table[0]
    assert main([*query, "--param", "nope=1"]) == 2
    assert "no parameter nope" in capsys.readouterr().err


def test_simulate_twice_with_one_seed_into_one_database_is_refused(
    clickhouse_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The same seed gives the same sources and seqs: a second run would garble the first."""
    run = ["simulate", "--clickhouse", clickhouse_url, "--requests", "10", "--seed", "7"]
    assert main(run) == 0
    assert main([*run, "--model", "other"]) == 2
    assert "already holds a simulated run with --seed 7 (engine-0, engine-1)" in (
        capsys.readouterr().err
    )
    assert main([*run[:-1], "8"]) == 0


def test_query_list_describes_every_query(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["query", "--list"]) == 0
    listed = {line.split()[0] for line in capsys.readouterr().out.splitlines()}
    assert listed >= MINE
    assert "_block_intervals" not in listed
    for q in list_queries():
        assert q.description and "include:" not in q.sql


@pytest.mark.parametrize("fmt", ["json", "csv"])
def test_query_list_in_json_and_csv(fmt: str, capsys: pytest.CaptureFixture[str]) -> None:
    """`--list --format json` printed the table."""
    assert main(["query", "--list", "--format", fmt]) == 0
    text = capsys.readouterr().out
    rows = json.loads(text) if fmt == "json" else list(csv.DictReader(io.StringIO(text)))
    assert {r["name"] for r in rows} == {q.name for q in list_queries()}
    assert all(r["description"] for r in rows)


def test_bind_params_defaults_and_types() -> None:
    q = load_query("capacity_what_if")
    bound = bind_params(q, {"fractions": "0.5,1", "since": "1767225600"})
    assert bound["fractions"] == [0.5, 1.0]
    for written in ("[0.5, 1]", " 0.5 , 1 ", [0.5, 1]):
        assert bind_params(q, {"fractions": written})["fractions"] == [0.5, 1.0]
    for bad in ("", "[]", "0.5,abc", "-0.5", "nan", "inf", "1e30", "[0.5,,1]"):
        with pytest.raises(ConfigError, match=r"separated by commas \(e\.g\. 0\.25,0\.5,1\)"):
            bind_params(q, {"fractions": bad})
    assert bound["since"].year == 2026 and bound["until"].year >= 2026
    assert bound["instance"] == "" and bound["model"] == ""
    with pytest.raises(ConfigError, match="not a"):
        bind_params(q, {"since": "yesterday"})
    timeline = load_query("eviction_churn_timeline")
    assert bind_params(timeline, {"bucket_s": " 4294967295 "})["bucket_s"] == 2**32 - 1
    for bad in ("abc", "1.5", "0", "-1", "4294967296", "99999999999"):
        with pytest.raises(ConfigError, match="give a whole number from 1 to 4294967295"):
            bind_params(timeline, {"bucket_s": bad})
    breaches = load_query("report_transfer_breaches")
    assert bind_params(breaches, {"slo_ms": "0"})["slo_ms"] == 0.0
    for bad in ("abc", "-5", "nan", "inf"):
        with pytest.raises(ConfigError, match="give a number of milliseconds of at least 0"):
            bind_params(breaches, {"slo_ms": bad})
    with pytest.raises(ConfigError, match="fragment"):
        load_query("_block_intervals")
    with pytest.raises(ConfigError, match="unknown query"):
        load_query("../migrations/001_raw_tables")


def test_format_rows_table() -> None:
    text = format_rows([{"a": 1, "b": float("nan")}, {"a": 22, "b": 0.5}], "table")
    assert text.splitlines()[0].split() == ["a", "b"]
    assert json.loads(format_rows([{"b": float("nan")}], "json")) == [{"b": None}]
    assert format_rows([], "table") == "(no rows)"


def test_csv_of_no_rows_has_the_header(
    clickhouse_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """chDB gives no columns with no rows: the CSV was one empty line."""
    assert main(["migrate", "--clickhouse", clickhouse_url]) == 0
    capsys.readouterr()
    for name in ("residency", "capacity_what_if"):
        assert main(["query", name, "--clickhouse", clickhouse_url, "--format", "csv"]) == 0
        header = capsys.readouterr().out.splitlines()[0]
        assert header.split(",")[:2] == ["instance", "dp_rank"], (name, header)


def test_a_simulated_run_is_all_visible_to_queries_at_once(
    tmp_path: Path, clickhouse_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without --start-time the run ends about now: starting at now stamped it up to its
    span (here 10 s) in the future, past the queries' default `until`."""
    truth_file = tmp_path / "truth.json"
    args = ["simulate", "--clickhouse", clickhouse_url, "--requests", "200"]
    assert main([*args, "--truth", str(truth_file)]) == 0
    truth = json.loads(truth_file.read_text())
    capsys.readouterr()
    assert main(["query", "hit_rate", "--clickhouse", clickhouse_url, "--format", "json"]) == 0
    fleet = next(r for r in json.loads(capsys.readouterr().out) if r["instance"] == "*")
    assert fleet["requests"] == truth["fleet"]["requests_finished"] == 200
