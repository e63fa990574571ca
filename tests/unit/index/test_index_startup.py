"""What `kvscope index` loads to start: without stored state (no `--clickhouse`) it reads
the topic from its beginning and needs neither pyarrow nor a ClickHouse client, whose
imports would only lengthen a restart (docs/benchmarks.md, "Restart"); nor SciPy and cffi,
which numba would import on its own (0.9-1.2 s and ~35 ms, `kvscope.index.jit`), while
both still import afterwards for whoever wants them; and numpy's OpenBLAS starts no
thread per core. In a fresh interpreter, so modules other tests imported cannot hide a
result.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

STORED_ONLY = ("pyarrow", "clickhouse_connect", "chdb", "kvscope.index.stored")

SCRIPT = f"""
import json, sys
import numpy as np
from kvscope.common.kafka import KafkaSettings
from kvscope.index.config import IndexConfig
from kvscope.index.service import IndexService

service = IndexService(IndexConfig(kafka=KafkaSettings(bootstrap_servers="127.0.0.1:9")))
assert service.cold_start() == {{}}
ops = (np.array([7], np.uint64), np.array([0], np.int32), np.array([1], np.int8))
service.index.table.apply(ops)  # a kernel loaded
loaded = sorted(m for m in {STORED_ONLY!r} if m in sys.modules)
hidden = sorted(m for m in ("scipy", "cffi") if m in sys.modules)
import importlib, importlib.util
for name in ("scipy.linalg", "cffi"):  # not dependencies: checked where installed
    if importlib.util.find_spec(name.partition(".")[0]) is not None:
        importlib.import_module(name)  # still importable after the index hid it from numba
print(json.dumps({{"stored": loaded, "hidden": hidden}}))
"""


def test_an_index_without_stored_state_loads_no_stored_state_reader_nor_scipy_nor_cffi() -> None:
    result = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.splitlines()[-1]) == {"stored": [], "hidden": []}


COMMAND = """
import json, os, sys
from kvscope.cli.main import main
code = main(["index", "--bootstrap-servers", "127.0.0.1:1", "--port", "0"])
threads = len(os.listdir("/proc/self/task"))
print(json.dumps({"code": code, "numpy": "numpy" in sys.modules, "threads": threads}))
"""


def test_the_index_command_loads_numpy_with_one_blas_thread() -> None:
    """Its process has one thread when the broker check fails, numpy loaded (OpenBLAS
    would have started one per core)."""
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    result = subprocess.run(
        [sys.executable, "-c", COMMAND], capture_output=True, text=True, env=env
    )
    found = json.loads(result.stdout.splitlines()[-1])
    assert found == {"code": 1, "numpy": True, "threads": 1}, result.stderr  # no broker at :1
