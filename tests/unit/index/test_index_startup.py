"""What `kvscope index` loads to start: without stored state (no `--clickhouse`) it reads
the topic from its beginning and needs neither pyarrow nor a ClickHouse client, whose
imports would only lengthen a restart (docs/benchmarks.md, "Restart"). In a fresh
interpreter, so modules other tests imported cannot hide a result.
"""

from __future__ import annotations

import json
import subprocess
import sys

STORED_ONLY = ("pyarrow", "clickhouse_connect", "chdb", "kvscope.index.stored")

SCRIPT = f"""
import json, sys
from kvscope.common.kafka import KafkaSettings
from kvscope.index.config import IndexConfig
from kvscope.index.service import IndexService

service = IndexService(IndexConfig(kafka=KafkaSettings(bootstrap_servers="127.0.0.1:9")))
assert service.cold_start() == {{}}
print(json.dumps(sorted(m for m in {STORED_ONLY!r} if m in sys.modules)))
"""


def test_an_index_without_stored_state_loads_no_stored_state_reader() -> None:
    result = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.splitlines()[-1]) == []
