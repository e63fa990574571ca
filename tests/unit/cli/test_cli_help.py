"""`kvscope --help` and `kvscope COMMAND --help` work for every registered command.

Runs the installed console script (what users type), so a broken entry point or a
command module that fails at import shows up here. Commands are discovered from the
parser, so new subcommands are covered without editing this file. The command line
imports the given command's module only (`kvscope.cli.commands.COMMANDS` names the rest):
its help, its parsing and its errors must be what the parser of every command gives.
"""

from __future__ import annotations

import argparse
import json
import os
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest
from kvscope.cli import commands
from kvscope.cli.commands import COMMANDS
from kvscope.cli.main import build_parser, parse_args
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


def _subparsers(parser: argparse.ArgumentParser) -> argparse._SubParsersAction:
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))


@pytest.mark.parametrize("command", _commands())
def test_command_help(command: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Printed by the command's module alone, as the parser of every command prints it
    (its defaults included: `test_every_option_says_its_default`)."""
    monkeypatch.setenv("COLUMNS", "100")
    result = _run(command, "--help", env=dict(os.environ))
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"usage: kvscope {command}")
    assert result.stderr == ""
    assert result.stdout == _subparsers(build_parser()).choices[command].format_help()


def test_top_level_help_is_the_full_parsers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "100")
    result = _run("--help", env=dict(os.environ))
    assert result.returncode == 0 and result.stderr == "", result.stderr
    assert result.stdout == build_parser().format_help()


def test_the_command_list_is_the_command_modules() -> None:
    modules = {m.name for m in pkgutil.iter_modules(commands.__path__)}
    assert set(COMMANDS) == modules
    helps = {a.dest: a.help for a in _subparsers(build_parser())._choices_actions}
    assert helps == COMMANDS  # each module's parser shows its line


LOADED = """
import json, sys
from kvscope.cli.main import main
try:
    main({argv!r})
except SystemExit:
    pass
print(json.dumps(sorted(m.rsplit(".", 1)[1] for m in sys.modules
                        if m.startswith("kvscope.cli.commands."))))
"""


@pytest.mark.parametrize(
    ("argv", "loaded"),
    [
        (["--help"], []),
        (["nosuch"], []),
        (["index", "--help"], ["index"]),
        (["--log-level", "ERROR", "route", "--help"], ["index", "route"]),
    ],
)
def test_a_command_imports_no_other_commands_module(argv: list[str], loaded: list[str]) -> None:
    """`kvscope index` and `kvscope route` restart without the other commands' modules and
    what they import (~0.2 s of a restart before); route shares the feed flags of index."""
    script = LOADED.format(argv=argv)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.splitlines()[-1]) == loaded


ARGVS = [
    ["index"],
    ["--log-level", "DEBUG", "index", "--port", "5", "--debug"],
    ["--log", "ERROR", "--deb", "query", "hit_rate", "--log-level", "WARNING"],
    ["route", "--engines", "a=http://h:1", "--index", "http://i:2", "--affinity", "0.5"],
    ["trace", "export", "--out", "t.jsonl"],
    ["schema"],
    ["simulate", "--instances", "3", "--dry-run"],
]
BAD_ARGVS = [
    [],
    ["nosuch"],
    ["--log-level", "BAD", "index"],
    ["--nosuch", "index"],
    ["index", "--nosuch"],
    ["index", "--port", "x", "--log-level", "BAD"],
    ["route"],
    ["--debug"],
    ["trace"],
]


@pytest.mark.parametrize("argv", ARGVS + BAD_ARGVS)
def test_parsing_is_the_full_parsers(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """The same namespace, or the same usage error and exit code, as the parser of every
    command gives."""
    outcomes = []
    for parse in (parse_args, build_parser().parse_args):
        try:
            outcomes.append(("parsed", vars(parse(argv))))
        except SystemExit as exc:
            outcomes.append(("exit", exc.code, capsys.readouterr()))
    assert outcomes[0] == outcomes[1]
    assert outcomes[0][0] == ("parsed" if argv in ARGVS else "exit")


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
