"""The vLLM tests read Kafka back with the publisher tests' helper (`publisher_readback`)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration" / "publisher"))
