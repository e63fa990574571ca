"""A Ctrl-C that Python swallowed in a finalizer still stops the command.

The finalizer raising `KeyboardInterrupt` itself stands in for a SIGINT that lands while
one runs (as it did inside asyncio's `_SelectorTransport.__del__` during `kvscope demo`):
the moment cannot be hit on demand with a real signal."""

from __future__ import annotations

import subprocess
import sys

import pytest

SCRIPT = """
import sys, time
from kvscope.cli.interrupts import deliver_swallowed_interrupts

deliver_swallowed_interrupts()


class Finalized:
    def __del__(self):
        raise {exception}


Finalized()
try:
    time.sleep(float(sys.argv[1]))
except KeyboardInterrupt:
    print("interrupted")
    sys.exit(130)
print("ran on")
"""


def _run(exception: str, sleep_s: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", SCRIPT.format(exception=exception), str(sleep_s)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_swallowed_ctrl_c_interrupts_the_command() -> None:
    result = _run("KeyboardInterrupt", sleep_s=60)
    assert (result.returncode, result.stdout.strip()) == (130, "interrupted"), result.stderr
    assert "Exception ignored" not in result.stderr


@pytest.mark.parametrize("exception", ["ValueError('in a finalizer')", "SystemExit(3)"])
def test_other_exceptions_in_finalizers_are_reported_as_before(exception: str) -> None:
    result = _run(exception, sleep_s=0)
    assert (result.returncode, result.stdout.strip()) == (0, "ran on"), result.stderr
    assert "Exception ignored" in result.stderr, result.stderr
    assert exception.split("(")[0] in result.stderr
