"""Render the report as Markdown, with the plots as PNG files next to it (`images/`)."""

from __future__ import annotations

from kvscope.collector.analytics.report.layout import (
    Block,
    Bullets,
    Image,
    Paragraph,
    Section,
    Table,
)
from kvscope.collector.analytics.report.model import Report


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _block(block: Block, image_dir: str) -> str:
    if isinstance(block, Paragraph):
        return block.text
    if isinstance(block, Bullets):
        return "\n".join(f"- {item}" for item in block.items)
    if isinstance(block, Table):
        headers = [h or " " for h in block.headers]
        lines = [
            "| " + " | ".join(_cell(h) for h in headers) + " |",
            "|" + "---|" * len(headers),
        ]
        lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in block.rows]
        return "\n".join(lines)
    assert isinstance(block, Image)
    return f"![{block.alt}]({image_dir}/{block.stem}.png)"


def render_markdown(report: Report, sections: list[Section], image_dir: str) -> str:
    """The whole document; images are referenced as `image_dir/<stem>.png`."""
    generated = report.generated_at.strftime("%Y-%m-%d %H:%M:%S UTC")
    parts = [
        "# kvscope capacity-planning report",
        f"Generated {generated}. Figures as JSON: report.json.",
    ]
    for section in sections:
        title = f"## {section.title}"
        if section.completeness:
            title += f" — {section.completeness}"
        parts.append(title)
        parts += [_block(block, image_dir) for block in section.blocks]
    return "\n\n".join(parts) + "\n"
