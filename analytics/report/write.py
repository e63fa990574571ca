"""Write a `Report` to a directory: report.html, report.md + images/, report.json."""

from __future__ import annotations

import logging
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import msgspec
from kvscope.analytics.report.html import render_html
from kvscope.analytics.report.layout import layout
from kvscope.analytics.report.markdown import render_markdown
from kvscope.analytics.report.model import Report
from kvscope.analytics.report.plots import render_all
from kvscope.collector.errors import OutputError
from kvscope.schemas.errors import ConfigError

log = logging.getLogger(__name__)

IMAGE_DIR = "images"


@dataclass(frozen=True)
class ReportFiles:
    """Where the report was written."""

    html: Path
    markdown: Path
    json: Path
    images: list[Path]


def check_out_dir(out: Path) -> None:
    """`ConfigError` now, before any work, when nothing could be written to `out`: it is
    a file, or its nearest existing ancestor is a file or refuses a new directory (probed
    with one created and removed at once). Nothing is left behind, so a run that fails
    later leaves no empty directory."""
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} is a file, not a directory: choose another --out")
    existing = out.absolute()
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise ConfigError(
            f"--out {out}: {existing} is a file, not a directory: choose another --out"
        )
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(f"--out {out}: {existing} is not writable: choose another --out")
    try:  # root passes os.access everywhere, yet /proc or a read-only mount refuse a mkdir
        os.rmdir(tempfile.mkdtemp(prefix=".kvscope-probe-", dir=existing))
    except OSError as exc:
        raise ConfigError(
            f"--out {out}: cannot create a directory in {existing} "
            f"({exc.strerror or exc}): choose another --out"
        ) from None


def check_out_file(out: Path) -> None:
    """`ConfigError` now, before any query, when the file `out` could not be written: it is
    a directory, or its folder is missing, a file, or not writable."""
    if out.is_dir():
        raise ConfigError(f"--out {out} is a directory: name a file")
    folder = out.absolute().parent
    if not folder.is_dir():
        what = "a file" if folder.exists() or _below_a_file(folder) else "missing"
        raise ConfigError(f"--out {out}: folder {folder} is {what}: choose another --out")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ConfigError(f"--out {out}: {folder} is not writable: choose another --out")


def _below_a_file(path: Path) -> bool:
    """Whether the nearest existing ancestor of `path` is a file."""
    while not path.exists():
        path = path.parent
    return not path.is_dir()


def write_report(report: Report, out_dir: Path) -> ReportFiles:
    """Render the plots once and write all three formats into `out_dir` (created if needed);
    `OutputError` with the reason when a file cannot be written."""
    try:
        return _write(report, out_dir)
    except OSError as exc:
        where = exc.filename or out_dir
        raise OutputError(f"cannot write the report to {where}: {exc.strerror or exc}") from exc


def _write(report: Report, out_dir: Path) -> ReportFiles:
    out_dir.mkdir(parents=True, exist_ok=True)
    plots = render_all(report)
    sections = layout(report, set(plots))
    image_dir = out_dir / IMAGE_DIR
    image_dir.mkdir(exist_ok=True)
    images = []
    for stem, png in plots.items():
        path = image_dir / f"{stem}.png"
        path.write_bytes(png)
        images.append(path)
    files = ReportFiles(
        html=out_dir / "report.html",
        markdown=out_dir / "report.md",
        json=out_dir / "report.json",
        images=images,
    )
    files.html.write_text(render_html(report, sections, plots), encoding="utf-8")
    files.markdown.write_text(render_markdown(report, sections, IMAGE_DIR), encoding="utf-8")
    files.json.write_bytes(msgspec.json.format(msgspec.json.encode(report), indent=2))
    log.info("report written to %s (%d plots)", out_dir, len(plots))
    return files
