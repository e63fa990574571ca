"""Render the report as one self-contained HTML page: inline CSS, plots as base64 PNG.

No scripts, no external CSS, fonts or images: the page opens from disk with no network.
"""

from __future__ import annotations

import base64
from html import escape

from kvscope.analytics.queries import terminal_safe
from kvscope.analytics.report.layout import (
    Block,
    Bullets,
    Image,
    Paragraph,
    Section,
    Table,
)
from kvscope.analytics.report.model import Report

_CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0 auto;
       max-width: 1200px; padding: 1rem 2rem 3rem; color: #222; line-height: 1.4; }
h1 { margin-bottom: 0.2rem; }
.meta { color: #666; margin-top: 0; }
nav a { margin-right: 1rem; }
section { border-top: 1px solid #ddd; margin-top: 1.5rem; }
h2 { display: flex; align-items: baseline; gap: 1rem; }
.completeness { font-size: 0.8rem; font-weight: normal; color: #555; background: #eef3f8;
                border-radius: 0.6rem; padding: 0.1rem 0.6rem; }
table { border-collapse: collapse; margin: 0.6rem 0; font-size: 0.9rem; }
th, td { border: 1px solid #ddd; padding: 0.25rem 0.6rem; text-align: left; }
th { background: #f4f4f4; }
td:not(:first-child) { font-variant-numeric: tabular-nums; }
img { max-width: 100%; display: block; margin: 0.6rem 0; }
ul.findings li { margin: 0.3rem 0; font-size: 1.05rem; }
"""


def _text(text: str) -> str:
    """Text from the data (names from engines) as HTML, control characters shown escaped."""
    return escape(terminal_safe(text))


def _block(block: Block, plots: dict[str, bytes]) -> str:
    if isinstance(block, Paragraph):
        return f"<p>{_text(block.text)}</p>"
    if isinstance(block, Bullets):
        items = "".join(f"<li>{_text(item)}</li>" for item in block.items)
        return f'<ul class="findings">{items}</ul>'
    if isinstance(block, Table):
        head = ""
        if any(block.headers):
            head = "<thead><tr>" + "".join(f"<th>{_text(h)}</th>" for h in block.headers)
            head += "</tr></thead>"
        body = "".join(
            "<tr>" + "".join(f"<td>{_text(cell)}</td>" for cell in row) + "</tr>"
            for row in block.rows
        )
        return f"<table>{head}<tbody>{body}</tbody></table>"
    assert isinstance(block, Image)
    data = base64.b64encode(plots[block.stem]).decode("ascii")
    return f'<img src="data:image/png;base64,{data}" alt="{_text(block.alt)}">'


def _section(section: Section, plots: dict[str, bytes]) -> str:
    badge = ""
    if section.completeness:
        badge = f'<span class="completeness">{_text(section.completeness)}</span>'
    body = "\n".join(_block(block, plots) for block in section.blocks)
    title = _text(section.title)
    return f'<section id="{section.anchor}">\n<h2>{title}{badge}</h2>\n{body}\n</section>'


def render_html(report: Report, sections: list[Section], plots: dict[str, bytes]) -> str:
    """The whole page as a string."""
    nav = " ".join(f'<a href="#{s.anchor}">{_text(s.title)}</a>' for s in sections)
    generated = report.generated_at.strftime("%Y-%m-%d %H:%M:%S UTC")
    body = "\n".join(_section(section, plots) for section in sections)
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>kvscope capacity-planning report</title>
<link rel="icon" href="data:,">
<style>{_CSS}</style>
</head>
<body>
<h1>kvscope capacity-planning report</h1>
<p class="meta">Generated {generated}. Figures as JSON: report.json.</p>
<nav>{nav}</nav>
{body}
</body>
</html>
"""
