"""The demo's and the report's progress lines say what finished, and only that.

A step that failed or was interrupted showed "✓" (a taken broker port printed
"✓ starting Kafka broker"); a bar stopped early showed its total ("✓ publishing …
360/360" after Ctrl-C at 110).
"""

from __future__ import annotations

import pytest
from kvscope.analytics.report.progress import terminal_progress


def _lines(text: str) -> list[str]:
    return [" ".join(line.split()) for line in text.splitlines() if line.strip()]


@pytest.mark.parametrize(
    ("error", "word"),
    [(RuntimeError("port taken"), "failed"), (KeyboardInterrupt(), "interrupted")],
)
def test_a_step_that_did_not_finish_has_no_check_mark(
    capsys: pytest.CaptureFixture[str], error: BaseException, word: str
) -> None:
    with pytest.raises(type(error)), terminal_progress() as progress:
        progress.step("creating tables")
        progress.step("starting Kafka broker")
        raise error
    lines = _lines(capsys.readouterr().err)
    assert any(line.startswith("✓ creating tables") for line in lines), lines
    broker = [line for line in lines if "starting Kafka broker" in line]
    assert broker and not broker[-1].startswith("✓"), lines
    assert f"starting Kafka broker ({word})" in broker[-1]


@pytest.mark.parametrize(("done", "total"), [(110, 360), (1, 2), (359, 360)])
def test_a_bar_stopped_early_keeps_its_count(
    capsys: pytest.CaptureFixture[str], done: int, total: int
) -> None:
    with terminal_progress() as progress:
        progress.step("publishing live", total=total)
        progress.update(done)
        progress.step("storing", total=3)
        progress.advance(3)
    lines = _lines(capsys.readouterr().err)
    publishing = [line for line in lines if "publishing live" in line][-1]
    assert f"{done}/{total}" in publishing and not publishing.startswith("✓"), lines
    assert any(line.startswith("✓ storing") and "3/3" in line for line in lines), lines
