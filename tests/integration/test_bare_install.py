"""`pip install kvscope` with no extras is what engine images get: prove it in a fresh venv.

The venv has only the base dependencies (msgspec, pyzmq, aiokafka, prometheus-client):
no numpy, pyarrow, chDB or vLLM. What an engine or its sidecar runs must work there: the
console command's help, `kvscope bridge --help` (also as the plugin's sidecar starts it,
`python -m kvscope.cli bridge`), `kvscope schema`, and the engine-side imports.
"""

from __future__ import annotations

import json
import subprocess
import venv
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bare(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with kvscope installed from this checkout, no extras."""
    root = tmp_path_factory.mktemp("bare") / "venv"
    venv.EnvBuilder(with_pip=True).create(root)
    python = root / "bin" / "python"
    install = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", str(REPO)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert install.returncode == 0, install.stderr[-3000:]
    return root


def _run(bare: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(bare / "bin" / args[0]), *args[1:]], capture_output=True, text=True, timeout=120
    )


def test_the_bare_venv_has_no_service_side_dependency(bare: Path) -> None:
    script = (
        "import importlib.util, json\n"
        "names = ('numpy', 'pyarrow', 'chdb', 'clickhouse_connect', 'matplotlib', 'vllm')\n"
        "print(json.dumps([n for n in names if importlib.util.find_spec(n)]))"
    )
    result = _run(bare, "python", "-c", script)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == []


@pytest.mark.parametrize(
    "args",
    [
        ("kvscope", "--help"),
        ("kvscope", "bridge", "--help"),
        ("python", "-m", "kvscope.cli", "bridge", "--help"),
    ],
    ids=["help", "bridge-help", "sidecar-bridge-help"],
)
def test_engine_side_commands_run_without_extras(bare: Path, args: tuple[str, ...]) -> None:
    result = _run(bare, *args)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: kvscope")
    assert "Traceback" not in result.stderr


def test_schema_prints_the_json_schema_without_extras(bare: Path) -> None:
    result = _run(bare, "kvscope", "schema")
    assert result.returncode == 0, result.stderr
    assert "KVEvents" in json.dumps(json.loads(result.stdout))


@pytest.mark.parametrize(
    "args",
    [
        ("demo", "--scale", "small"),
        ("simulate", "--dry-run", "--requests", "5"),
        ("collect", "--bootstrap-servers", "127.0.0.1:9"),
    ],
    ids=["demo", "simulate", "collect"],
)
def test_service_commands_without_extras_name_the_extra(
    bare: Path, args: tuple[str, ...], tmp_path: Path
) -> None:
    """They ended in a bare `ModuleNotFoundError: No module named 'numpy'`."""
    result = subprocess.run(
        [str(bare / "bin" / "kvscope"), *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1, result.stderr
    assert "extra installs: pip install 'kvscope[" in result.stderr, result.stderr


def test_engine_side_modules_import_without_extras(bare: Path) -> None:
    modules = (
        "kvscope.schemas",
        "kvscope.common.kafka",
        "kvscope.publisher",
        "kvscope.publisher.vllm.plugin",
        "kvscope.publisher.bridge.loop",
        "kvscope.consumer",
    )
    result = _run(bare, "python", "-c", f"import {', '.join(modules)}")
    assert result.returncode == 0, result.stderr


@pytest.mark.vllm
def test_entry_points_name_importable_objects() -> None:
    """The console script and both vLLM entry points resolve (here, with vLLM installed)."""
    from importlib.metadata import entry_points

    wanted = {
        ("console_scripts", "kvscope"),
        ("vllm.general_plugins", "kvscope"),
        ("vllm.stat_logger_plugins", "kvscope"),
    }
    found = {
        (group, ep.name): ep
        for group in {g for g, _ in wanted}
        for ep in entry_points(group=group)
        if ep.name == "kvscope"
    }
    assert set(found) == wanted
    for (group, _), ep in found.items():
        assert callable(ep.load()), group
