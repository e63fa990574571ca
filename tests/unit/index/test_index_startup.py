"""What `kvscope index` loads to start: without stored state (no `--clickhouse`) it reads
the topic from its beginning and needs neither pyarrow nor a ClickHouse client, whose
imports would only lengthen a restart (docs/benchmarks.md, "Restart"); nor SciPy, which
numba would import on its own (0.9-1.2 s, `kvscope.index.jit`), while SciPy still imports
afterwards for whoever wants it. In a fresh interpreter, so modules other tests imported
cannot hide a result.
"""

from __future__ import annotations

import json
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
had_scipy = "scipy" in sys.modules
import importlib.util
if importlib.util.find_spec("scipy") is not None:  # not a dependency: only where installed
    import scipy.linalg  # still importable after the index hid it from numba
print(json.dumps({{"stored": loaded, "scipy": had_scipy}}))
"""


def test_an_index_without_stored_state_loads_no_stored_state_reader_nor_scipy() -> None:
    result = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.splitlines()[-1]) == {"stored": [], "scipy": False}
