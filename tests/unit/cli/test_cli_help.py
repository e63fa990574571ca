"""`kvscope --help` and `kvscope COMMAND --help` work for every registered command.

Runs the installed console script (what users type), so a broken entry point or a
command module that fails at import shows up here. Commands are discovered from the
parser, so new subcommands are covered without editing this file.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest
from kvscope.cli.main import build_parser
from kvscope.simulator.workloads import KNOBS

KVSCOPE = Path(sys.executable).with_name("kvscope")


def _commands() -> list[str]:
    actions = build_parser()._actions
    return sorted(next(a for a in actions if isinstance(a, argparse._SubParsersAction)).choices)


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    assert KVSCOPE.exists(), f"console script missing at {KVSCOPE}: pip install -e ."
    return subprocess.run(
        [str(KVSCOPE), *args], capture_output=True, text=True, timeout=60, env=env
    )


def test_top_level_help_lists_every_command() -> None:
    result = _run("--help")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: kvscope")
    for command in _commands():
        assert f"    {command} " in result.stdout or f"    {command}\n" in result.stdout


def test_discovery_finds_the_broker_command() -> None:
    assert "broker" in _commands()


def test_readme_lists_every_command() -> None:
    readme = (Path(__file__).resolve().parents[3] / "README.md").read_text(encoding="utf-8")
    commands = readme.split("\n## Commands\n", 1)[1].split("\n## ", 1)[0]
    missing = [c for c in _commands() if f"`kvscope {c}" not in commands]
    assert missing == [], f"README's command list lacks {missing}"


def test_version_and_global_flags_after_the_command() -> None:
    version = _run("--version")
    assert version.returncode == 0 and version.stdout.startswith("kvscope "), version
    late = _run("query", "no_such_query", "--debug")
    assert late.returncode == 2, late.stderr
    assert "Traceback" in late.stderr and "unknown query" in late.stderr
    quiet = _run("query", "no_such_query")
    assert quiet.returncode == 2 and quiet.stderr.count("\n") == 1, quiet.stderr


@pytest.mark.parametrize("url", ["clickhouse-1:8123", "http://", "chdb:///"])
def test_a_malformed_clickhouse_url_in_the_environment_is_named(url: str) -> None:
    """It crashed every command, `--help` included, with a traceback not naming it."""
    env = {**os.environ, "KVSCOPE_CLICKHOUSE_URL": url}
    for command in ([], ["collect"], ["report"]):
        assert _run(*command, "--help", env=env).returncode == 0
    result = _run("query", "hit_rate", env=env)
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1, result.stderr
    assert f"$KVSCOPE_CLICKHOUSE_URL={url!r}" in result.stderr


def test_demo_help_names_every_install_step_of_vllm_pd() -> None:
    text = " ".join(_run("demo", "--help").stdout.split())
    assert "pip install 'kvscope[pd]' && pip install --no-deps nixl==1.5.1" in text


@pytest.mark.parametrize("command", _commands())
def test_command_help(command: str) -> None:
    result = _run(command, "--help")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"usage: kvscope {command}")
    assert result.stderr == ""


def test_no_command_is_a_usage_error() -> None:
    result = _run()
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1, result.stderr
    assert "kvscope --help" in result.stderr


def _options() -> list[tuple[str, argparse.Action]]:
    """Every optional, non-flag option of every command (a flag's default is off)."""
    subparsers = next(
        a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)
    )
    return [
        (command, action)
        for command, parser in sorted(subparsers.choices.items())
        for action in parser._actions
        if action.option_strings
        and action.help != argparse.SUPPRESS
        and not action.required
        and not isinstance(action, argparse._HelpAction | argparse._StoreTrueAction)
    ]


@pytest.mark.parametrize(
    "command,action", _options(), ids=[f"{c}{a.option_strings[-1]}" for c, a in _options()]
)
def test_every_option_says_its_default(command: str, action: argparse.Action) -> None:
    assert "default" in (action.help or ""), (
        f"kvscope {command} {action.option_strings}: {action.help}"
    )


def test_simulate_help_names_every_workload_knob_and_its_default() -> None:
    subparsers = next(
        a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)
    )
    text = " ".join(subparsers.choices["simulate"].format_help().split())
    for name, knobs in KNOBS.items():
        assert f"{name}: " in text
        for key, knob in knobs.items():
            assert f"{key}={knob.default:g}" in text


def test_demo_help_says_the_prefill_rate_is_measured_when_not_given() -> None:
    """It said "default: none" while the report used the 8,000 tokens/s it measured."""
    subparsers = next(
        a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)
    )
    for command in ("demo", "report"):
        text = " ".join(subparsers.choices[command].format_help().split())
        assert "(default: measured from the stored requests' prefill times" in text
