"""kvscope's SQL as files: migrations/, queries/ and residency/.

A file may include a fragment of its own folder (`_NAME.sql`) with a line `-- include:
NAME`; a fragment may include fragments in turn.
"""

from __future__ import annotations

import re
from collections.abc import Callable

INCLUDE = re.compile(r"^--\s*include:\s*([a-z0-9_]+)\s*$", re.MULTILINE)
"""A line `-- include: NAME`."""


def with_includes(text: str, fragment: Callable[[str], str]) -> str:
    """`text` with each `-- include: NAME` line replaced by `fragment(NAME)`, which reads
    `_NAME.sql` (and expands its own includes)."""
    return INCLUDE.sub(lambda m: fragment(m.group(1)), text)
