"""`nixl_progress_delay_us`: a real NIXL agent's progress thread stops spinning a core.

The agents run in a child process: the delay is set process-wide."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from kvscope.publisher.vllm.nixl_progress import (
    DELAY_KEY,
    progress_delay_us,
    set_progress_delay,
)

IDLE_CPU = """
import gc, os, time
import nixl._api
from kvscope.publisher.vllm.nixl_progress import set_progress_delay
from nixl._api import nixl_agent, nixl_agent_config

def idle_cpu_s():
    agent = nixl_agent("kvscope-test", nixl_agent_config(num_threads=1))
    time.sleep(0.3)
    before = os.times()
    time.sleep(1.5)
    after = os.times()
    del agent  # its destructor stops its progress thread
    gc.collect()
    return (after.user + after.system) - (before.user + before.system)

print("cpu_s", idle_cpu_s())
for delay_us in (100, 5000):
    assert set_progress_delay(delay_us)
    print("cpu_s", idle_cpu_s())
# Set twice: still one wrapper around NIXL's own constructor.
assert not hasattr(nixl._api.nixlBind.nixlAgent.__wrapped__, "__wrapped__")
"""


def test_nixls_own_default_spins_and_the_delay_stops_it() -> None:
    """CPU seconds a process holding one idle agent uses in 1.5 s: NIXL as it comes, then
    with two delays (one process: vLLM is not imported, and each agent's thread ends
    with it)."""
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(IDLE_CPU)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    lines = [line.split() for line in done.stdout.splitlines() if line.startswith("cpu_s ")]
    spinning, *delayed = (float(value) for _, value in lines)  # NIXL logs to stdout too
    assert spinning > 0.6, "NIXL's progress thread no longer spins: the option may be moot"
    assert len(delayed) == 2
    assert all(cpu < 0.2 * spinning for cpu in delayed), delayed


@pytest.mark.parametrize(
    ("extra", "expected"),
    [({}, None), (None, None), ({DELAY_KEY: 0}, 0), ({DELAY_KEY: 100}, 100), ({"x": 1}, None)],
)
def test_the_setting_is_read_from_the_wrappers_extra_config(
    extra: dict[str, object] | None, expected: int | None
) -> None:
    assert progress_delay_us(extra) == expected


@pytest.mark.parametrize("bad", [-1, "100", 1.5, True, [100]])
def test_anything_but_a_whole_number_of_microseconds_is_refused(bad: object) -> None:
    with pytest.raises(ValueError, match=DELAY_KEY):
        progress_delay_us({DELAY_KEY: bad})


def test_without_nixl_the_setting_is_ignored_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    assert not set_progress_delay(100, api_module="kvscope_no_such_nixl._api")
    assert DELAY_KEY in caplog.text
