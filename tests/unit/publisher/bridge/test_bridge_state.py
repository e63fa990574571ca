"""The bridge's state file: a restart continues from it; a bad one is one line at start."""

from __future__ import annotations

import json
import logging
import math
import shutil
from pathlib import Path

import pytest
from kvscope.publisher.bridge.loop import BridgeConfig, Endpoint
from kvscope.publisher.bridge.state import BridgeState, check
from kvscope.schemas import ConfigError

STATE = BridgeState.FILE_NAME


@pytest.mark.parametrize(
    "positions", [{}, {"tcp://a:1": 0}, {"tcp://a:1": 7, "ipc:///x": 2**63, "tcp://[::1]:5": 1}]
)
def test_saved_positions_are_what_a_restart_reads(positions: dict, tmp_path: Path) -> None:
    state = BridgeState(tmp_path / "nested" / "dir")
    for endpoint, seq in positions.items():
        state.set(endpoint, seq)
    assert state.save(state.snapshot())
    again = BridgeState(tmp_path / "nested" / "dir")
    assert {e: again.get(e) for e in positions} == positions
    assert check(tmp_path / "nested" / "dir") == positions


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("{garbage", "not JSON: "),
        ("", "not JSON: "),
        ("[1, 2]", "not a JSON object"),
        ("null", "not a JSON object"),
        ('{"tcp://a:1": "7"}', "'tcp://a:1' has '7', not a seq"),
        ('{"tcp://a:1": -1}', "'tcp://a:1' has -1, not a seq"),
        ('{"tcp://a:1": 1.5}', "'tcp://a:1' has 1.5, not a seq"),
        ('{"tcp://a:1": true}', "'tcp://a:1' has True, not a seq"),
        ('{"tcp://a:1": null}', "'tcp://a:1' has None, not a seq"),
    ],
)
@pytest.mark.parametrize("at", ["validate", "start"])
def test_a_file_that_is_not_a_state_file_is_one_config_error(
    text: str, reason: str, at: str, tmp_path: Path
) -> None:
    """It was a JSONDecodeError, ValueError or AttributeError with a traceback hint."""
    (tmp_path / STATE).write_text(text)
    config = BridgeConfig(endpoints=[Endpoint("tcp://a:1")], state_dir=str(tmp_path))
    with pytest.raises(ConfigError) as caught:
        config.validate() if at == "validate" else BridgeState(config.state_dir)
    message = str(caught.value)
    assert message.startswith(f"{tmp_path / STATE} is not a bridge state file ({reason}")
    assert message.endswith("repair or remove it (without it each endpoint starts anew)")


def test_a_state_dir_that_cannot_be_a_directory_is_one_config_error(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("")
    for state_dir in (tmp_path / "a-file", tmp_path / "a-file" / "below"):
        with pytest.raises(ConfigError, match=r"cannot keep the bridge state in .*a-file"):
            BridgeConfig(endpoints=[Endpoint("tcp://a:1")], state_dir=str(state_dir)).validate()


def test_a_failed_save_is_logged_and_tried_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The directory is replaced by a file after the start (a fault no disk makes on demand)."""
    directory = tmp_path / "state"
    state = BridgeState(directory)
    state.set("tcp://a:1", 5)
    shutil.rmtree(directory)
    directory.write_text("in the way")
    with caplog.at_level(logging.WARNING):
        assert state.save(state.snapshot()) is False
    assert "bridge state not saved" in caplog.text
    directory.unlink()
    assert state.save(state.snapshot()) is True
    assert json.loads((directory / STATE).read_text()) == {"tcp://a:1": 5}


@pytest.mark.parametrize("value", [0, -1, math.nan, math.inf])
@pytest.mark.parametrize("name", ["replay_timeout_s", "checkpoint_interval_s", "flush_timeout_s"])
def test_bridge_intervals_must_be_finite_and_positive(name: str, value: float) -> None:
    config = BridgeConfig(endpoints=[Endpoint("tcp://a:1")], **{name: value})
    with pytest.raises(ConfigError, match=f"{name} must be a finite number > 0"):
        config.validate()
