"""`kvscope index`'s exit codes and its one-line errors about the stored state's directory."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from typing import Any

import pytest
from kvscope.cli.commands.index import _run, snapshot_reader
from kvscope.index.errors import IndexServiceError
from kvscope.schemas.errors import ConfigError
from support.chdb_holder import held_directory


class _Service:
    """Stands in for `IndexService` to end its run in ways a real one cannot be made to on
    demand (a bug's error, returning by itself, waiting for a signal)."""

    def __init__(self, ending: str) -> None:
        self.ending = ending

    async def run(self, ready: Any) -> None:
        if self.ending == "error":
            raise RuntimeError("a bug")
        if self.ending == "signal":
            os.kill(os.getpid(), signal.SIGTERM)
            await asyncio.sleep(30)


@pytest.mark.parametrize(
    ("ending", "raised"),
    [("error", RuntimeError), ("returns", None), ("signal", None)],
)
def test_only_a_signal_ends_the_run_cleanly(ending: str, raised: type | None) -> None:
    signalled: list[int] = []
    if raised is not None:
        with pytest.raises(raised):
            asyncio.run(_run(_Service(ending), None, signalled))
    else:
        asyncio.run(_run(_Service(ending), None, signalled))
    assert signalled == ([signal.SIGTERM] if ending == "signal" else [])


def test_a_service_cancelled_without_a_signal_is_an_error() -> None:
    class Cancelled(_Service):
        """Ends its run with a cancellation nobody asked for (a library leaking one)."""

        async def run(self, ready: Any) -> None:
            raise asyncio.CancelledError

    with pytest.raises(IndexServiceError, match="without a signal"):
        asyncio.run(_run(Cancelled("cancelled"), None, []))


def test_a_missing_chdb_directory_says_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        snapshot_reader(f"chdb://{tmp_path}/missing")
    message = str(caught.value)
    assert "\n" not in message and f"no kvscope data at {tmp_path}/missing" in message
    assert "leave --clickhouse out" in message and "pass --clickhouse" not in message


def test_a_held_chdb_directory_names_its_holder_and_the_way_out(tmp_path: Path) -> None:
    from kvscope.serve.access import DirectoryBusy

    held = tmp_path / "held"
    with held_directory(held) as pid, pytest.raises(DirectoryBusy) as caught:
        snapshot_reader(f"chdb://{held}")
    message = str(caught.value)
    assert "\n" not in message and str(pid) in message
    assert "only for its cold start" in message and "kvscope collect" not in message
