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

from kvscope.schemas.errors import ConfigError

log = logging.getLogger(__name__)


class BridgeState:
    """Next engine seq of every endpoint of one bridge, kept in `<state_dir>/bridge-state.json`."""

    FILE_NAME = "bridge-state.json"

    def __init__(self, state_dir: str | Path | None) -> None:
        """`state_dir` None keeps positions in memory only (a restart starts from seq 0).

        A directory that cannot be written or a file that is not a state file is a
        `ConfigError` now, not a failure at the first checkpoint or a traceback.
        """
        self._path = Path(state_dir) / self.FILE_NAME if state_dir is not None else None
        self._positions: dict[str, int] = {}
        self._saved: dict[str, int] = {}
        if self._path is None:
            return
        self._positions = check(self._path.parent)
        self._saved = dict(self._positions)
        if self._positions:
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

    def save(self, positions: dict[str, int]) -> bool:
        """Write `positions` to the file if they differ from what it holds; False when the
        write failed (a full disk, say: logged, and the next checkpoint tries again)."""
        if self._path is None or positions == self._saved:
            return True
        tmp = self._path.with_suffix(".tmp")
        try:
            self._path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps(positions))
            os.replace(tmp, self._path)
        except OSError as exc:
            log.warning("bridge state not saved to %s: %s", self._path, exc.strerror or exc)
            return False
        self._saved = dict(positions)
        return True


def check(state_dir: str | Path) -> dict[str, int]:
    """The positions kept in `state_dir` (none yet: empty), after checking that the
    directory can be written; `ConfigError` otherwise, or when its file is not a state file."""
    directory = Path(state_dir)
    _writable(directory)
    path = directory / BridgeState.FILE_NAME
    return _read(path) if path.exists() else {}


def _writable(directory: Path) -> None:
    """Create `directory` if needed; `ConfigError` unless files can be written in it."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        reason = exc.strerror or str(exc)
    else:
        if os.access(directory, os.W_OK | os.X_OK):
            return
        reason = "not writable"
    raise ConfigError(
        f"cannot keep the bridge state in {directory} ({reason}): give --state-dir a "
        "writable directory"
    )


def _read(path: Path) -> dict[str, int]:
    """The positions in the state file `path` (`ConfigError` when it is not one)."""
    try:
        raw = json.loads(path.read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read {path} ({exc.strerror or exc})") from None
    except ValueError as exc:
        raise _not_state(path, f"not JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise _not_state(path, "not a JSON object")
    for endpoint, seq in raw.items():
        if type(seq) is not int or seq < 0:
            raise _not_state(path, f"{endpoint!r} has {seq!r}, not a seq (an int >= 0)")
    return raw


def _not_state(path: Path, reason: str) -> ConfigError:
    return ConfigError(
        f"{path} is not a bridge state file ({reason}): repair or remove it (without it "
        "each endpoint starts anew)"
    )
