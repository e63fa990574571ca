"""Import weight: engine-side packages must not drag in the service side.

`kvscope.publisher` runs inside engine processes and `kvscope.schemas` is pure data, so
neither may load ClickHouse, chDB, pandas or matplotlib; the CLI parser (what
`kvscope --help` builds) must not either. Each check runs in a fresh interpreter so
modules imported by other tests cannot hide or fake a result.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

SERVICE_SIDE = ("chdb", "clickhouse_connect", "pandas", "matplotlib", "numpy", "pyarrow")
"""Third-party modules only the service side may load (none is a base dependency)."""
SERVICE_PACKAGES = (
    "kvscope.collector",
    "kvscope.analytics",
    "kvscope.serve",
    "kvscope.local",
    "kvscope.simulator",
    "kvscope.cachemodel",
    "kvscope.index",
    "kvscope.route",
)


def _loaded_after(statements: str, watch: tuple[str, ...]) -> list[str]:
    """Top-level modules from `watch` present in sys.modules after running `statements`."""
    script = (
        f"import sys\n{statements}\n"
        "import json\n"
        f"watch = {watch!r}\n"
        "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules} & set(watch))))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.splitlines()[-1])


@pytest.mark.parametrize(
    "module",
    [
        "kvscope.publisher",
        "kvscope.schemas",
        "kvscope.common",
        "kvscope.publisher.vllm.plugin",
        "kvscope.publisher.bridge.loop",
    ],
)
def test_engine_side_imports_no_service_side_modules(module: str) -> None:
    assert _loaded_after(f"import {module}", SERVICE_SIDE) == []


@pytest.mark.parametrize(
    "module",
    ["kvscope.publisher", "kvscope.publisher.vllm.plugin", "kvscope.publisher.bridge.loop"],
)
def test_engine_side_imports_no_service_side_package(module: str) -> None:
    script = f"import sys, {module}\nprint(sorted(m for m in sys.modules if 'kvscope' in m))"
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    loaded = result.stdout
    assert [p for p in SERVICE_PACKAGES if f"'{p}" in loaded] == []


def test_importing_both_together_stays_light() -> None:
    assert _loaded_after("import kvscope.schemas, kvscope.publisher", SERVICE_SIDE) == []


def test_schemas_depends_on_msgspec_only() -> None:
    light = ("aiokafka", "zmq", "prometheus_client")
    assert _loaded_after("import kvscope.schemas", light) == []
    script = "import sys, kvscope.schemas\nprint(sorted(m for m in sys.modules if 'kvscope' in m))"
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "kvscope.schemas" in result.stdout
    assert "kvscope.publisher" not in result.stdout
    assert "kvscope.collector" not in result.stdout


def test_cli_parser_is_light() -> None:
    statements = "from kvscope.cli.main import build_parser\nbuild_parser()"
    assert _loaded_after(statements, (*SERVICE_SIDE, "torch", "vllm", "pyarrow")) == []
