"""The bridge's small state file: per engine endpoint, the next engine seq to forward.

A restarted bridge reads it to continue where it stopped, asking the engine's replay
socket for what it missed instead of starting over or forwarding anything twice. The file is
rewritten atomically (write a temporary file, then rename) at most every
`min_interval_s` and on every clean stop.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

log = logging.getLogger(__name__)


class BridgeState:
    """Next engine seq of every endpoint of one bridge, kept in `<state_dir>/bridge-state.json`."""

    FILE_NAME = "bridge-state.json"

    def __init__(self, state_dir: str | Path | None, min_interval_s: float = 0.2) -> None:
        """`state_dir` None keeps positions in memory only (a restart starts from seq 0)."""
        self._path = Path(state_dir) / self.FILE_NAME if state_dir is not None else None
        self._min_interval_s = min_interval_s
        self._positions: dict[str, int] = {}
        self._dirty = False
        self._saved_at = 0.0
        if self._path is not None and self._path.exists():
            raw = json.loads(self._path.read_text())
            self._positions = {str(k): int(v) for k, v in raw.items()}
            log.info("bridge state loaded from %s: %d endpoints", self._path, len(raw))

    def get(self, endpoint: str) -> int | None:
        """The first engine seq not yet forwarded nor reported lost; None: never seen."""
        return self._positions.get(endpoint)

    def set(self, endpoint: str, next_seq: int) -> None:
        """Record a new position; written to disk when the interval allows."""
        self._positions[endpoint] = next_seq
        self._dirty = True
        if time.monotonic() - self._saved_at >= self._min_interval_s:
            self.save()

    def save(self) -> None:
        """Write the file now if anything changed since the last write."""
        if self._path is None or not self._dirty:
            return
        self._path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self._path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self._positions))
        os.replace(tmp, self._path)
        self._dirty = False
        self._saved_at = time.monotonic()
