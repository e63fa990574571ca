"""A process other than the test that holds a chDB directory, as `kvscope collect` or a
notebook would: for the errors that name the holder of a directory."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def held_directory(directory: Path) -> Iterator[int]:
    """Open `directory` with chDB in a child process until the block ends; yields its pid."""
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, clickhouse_connect; c = clickhouse_connect.get_client("
            f"dsn='chdb://{directory}'); c.command('SELECT 1'); print('ready', flush=True); "
            "sys.stdin.read()",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
        yield holder.pid
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(timeout=30)
