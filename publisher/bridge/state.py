"""The bridge's small state file: per engine endpoint, the next engine seq to forward.

A restarted bridge reads it to continue where it stopped, asking the engine's replay
socket for what it missed instead of starting over or forwarding anything twice. The
bridge writes it only at checkpoints, after the Kafka publisher has delivered
everything published before them, so the file never claims more than Kafka holds.
Writes are atomic (a temporary file, then a rename).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)


class BridgeState:
    """Next engine seq of every endpoint of one bridge, kept in `<state_dir>/bridge-state.json`."""

    FILE_NAME = "bridge-state.json"

    def __init__(self, state_dir: str | Path | None) -> None:
        """`state_dir` None keeps positions in memory only (a restart starts from seq 0)."""
        self._path = Path(state_dir) / self.FILE_NAME if state_dir is not None else None
        self._positions: dict[str, int] = {}
        self._saved: dict[str, int] = {}
        if self._path is not None and self._path.exists():
            raw = json.loads(self._path.read_text())
            self._positions = {str(k): int(v) for k, v in raw.items()}
            self._saved = dict(self._positions)
            log.info("bridge state loaded from %s: %s", self._path, self._positions)

    def get(self, endpoint: str) -> int | None:
        """The first engine seq not yet forwarded nor reported lost; None: never seen."""
        return self._positions.get(endpoint)

    def set(self, endpoint: str, next_seq: int) -> None:
        """Record a new position in memory (`save` writes it)."""
        self._positions[endpoint] = next_seq

    def snapshot(self) -> dict[str, int]:
        """The positions now (take it before flushing Kafka, save it after)."""
        return dict(self._positions)

    def save(self, positions: dict[str, int]) -> None:
        """Write `positions` to the file if they differ from what it holds."""
        if self._path is None or positions == self._saved:
            return
        self._path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self._path.with_suffix(".tmp")
        tmp.write_text(json.dumps(positions))
        os.replace(tmp, self._path)
        self._saved = dict(positions)
