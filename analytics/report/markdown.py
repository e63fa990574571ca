"""Render the report as Markdown, with the plots as PNG files next to it (`images/`)."""

from __future__ import annotations

from kvscope.analytics.queries import terminal_safe
from kvscope.analytics.report import layout
from kvscope.analytics.report.model import Report


def _cell(text: str) -> str:
    return terminal_safe(text).replace("|", "\\|")


def _block(block: layout.Block, image_dir: str) -> str:
    if isinstance(block, layout.Paragraph):
        return terminal_safe(block.text)
    if isinstance(block, layout.Bullets):
        return "\n".join(f"- {terminal_safe(item)}" for item in block.items)
    if isinstance(block, layout.Table):
        headers = [h or " " for h in block.headers]
        lines = [
            "| " + " | ".join(_cell(h) for h in headers) + " |",
            "|" + "---|" * len(headers),
        ]
        lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in block.rows]
        return "\n".join(lines)
    assert isinstance(block, layout.Image)
    return f"![{terminal_safe(block.alt)}]({image_dir}/{block.stem}.png)"


def render_markdown(report: Report, sections: list[layout.Section], image_dir: str) -> str:
    """The whole document; images are referenced as `image_dir/<stem>.png`."""
    generated = report.generated_at.strftime("%Y-%m-%d %H:%M:%S UTC")
    parts = [
        "# kvscope capacity-planning report",
        f"Generated {generated}. Figures as JSON: report.json.",
    ]
    for section in sections:
        title = f"## {terminal_safe(section.title)}"
        if section.completeness:
            title += f" — {section.completeness}"
        parts.append(title)
        parts += [_block(block, image_dir) for block in section.blocks]
    return "\n\n".join(parts) + "\n"
