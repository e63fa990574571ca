"""Progress display for long steps of `kvscope report` and `kvscope demo` (rich, on stderr)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol


class StepProgress(Protocol):
    """Told when a step starts; `advance` moves a bar of `total` units."""

    def step(self, description: str, total: float | None = None) -> None:
        """Start a new step (finishing the previous one)."""

    def advance(self, amount: float = 1.0) -> None:
        """Move the current step's bar."""

    def update(self, completed: float, description: str | None = None) -> None:
        """Set the current step's position (and optionally its text)."""


class QuietProgress:
    """Shows nothing (library use, tests)."""

    def step(self, description: str, total: float | None = None) -> None:
        """Ignore."""

    def advance(self, amount: float = 1.0) -> None:
        """Ignore."""

    def update(self, completed: float, description: str | None = None) -> None:
        """Ignore."""


class RichProgress:
    """One line per step: spinner, description, bar (when the total is known), elapsed time."""

    def __init__(self, progress: object) -> None:
        self._progress = progress
        self._task: object | None = None

    def _finish(self) -> None:
        """Mark the running step done. A bar that moved keeps its count: a step ended early
        (publishing stopped by Ctrl-C at 110 of 360) must not read 360/360 and ✓."""
        if self._task is None:
            return
        task = self._progress.tasks[-1]  # type: ignore[attr-defined]
        if task.total is not None and 0 < task.completed < task.total:
            self._progress.stop_task(self._task)  # type: ignore[attr-defined]
            return
        total = task.total if task.total is not None else 1
        self._progress.update(self._task, total=total, completed=total)  # type: ignore[attr-defined]

    def fail(self, why: str) -> None:
        """Mark the running step as not done (`why`: failed, interrupted) and stop its clock."""
        if self._task is not None:
            task = self._progress.tasks[-1]  # type: ignore[attr-defined]
            self._progress.update(self._task, description=f"{task.description} ({why})")  # type: ignore[attr-defined]
            self._progress.stop_task(self._task)  # type: ignore[attr-defined]
            self._task = None

    def step(self, description: str, total: float | None = None) -> None:
        """Finish the running step and start the next."""
        self._finish()
        self._task = self._progress.add_task(description, total=total)  # type: ignore[attr-defined]

    def advance(self, amount: float = 1.0) -> None:
        """Move the current bar."""
        if self._task is not None:
            self._progress.advance(self._task, amount)  # type: ignore[attr-defined]

    def update(self, completed: float, description: str | None = None) -> None:
        """Set the current bar's position."""
        if self._task is not None:
            fields = {"description": description} if description else {}
            self._progress.update(self._task, completed=completed, **fields)  # type: ignore[attr-defined]

    def close(self) -> None:
        """Mark the last step done."""
        self._finish()


@contextmanager
def terminal_progress() -> Iterator[StepProgress]:
    """A `RichProgress` on stderr for the duration of the block."""
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
    )

    progress = Progress(
        SpinnerColumn(finished_text="[green]✓"),
        TextColumn("{task.description}"),
        BarColumn(bar_width=24),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=Console(stderr=True),
    )
    steps = RichProgress(progress)
    with progress:
        try:
            yield steps
        except BaseException as exc:  # the step that was running did not finish: no ✓
            steps.fail("interrupted" if isinstance(exc, KeyboardInterrupt) else "failed")
            raise
        steps.close()
