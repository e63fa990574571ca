"""numba for the index's kernels, loaded without the SciPy and cffi imports numba makes on
the way.

`import numba` imports SciPy to check its version, and numba's first kernel load imports
`scipy.linalg` to probe for a BLAS: together 0.9-1.2 s of every start of `kvscope index`
(docs/index.md, "Restart"), for nothing the index uses (its kernels do no linear algebra).
numba also builds a cffi parser (cffi imports pycparser), ~35 ms, to type cffi functions
passed to kernels, which the index's never are. While numba loads here, both are hidden
(importing them fails, so numba takes them as absent: its few dot-product helpers use
plain loops, and it types no cffi function); afterwards they import as usual. Numba's
one-time set-up (its implementation registries) runs here too, at import, instead of in
the first kernel call. A process that imported them already gains nothing and loses
nothing.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator

HIDDEN = ("scipy", "cffi")
"""What numba would import for nothing the index uses."""


@contextlib.contextmanager
def _hidden(names: tuple[str, ...]) -> Iterator[None]:
    """None of `names` can be imported inside the block (unless imported before)."""
    hidden = [name for name in names if name not in sys.modules]
    for name in hidden:
        sys.modules[name] = None  # type: ignore[assignment]  # the import system's "absent"
    try:
        yield
    finally:
        for name in hidden:
            if name in sys.modules and sys.modules[name] is None:
                del sys.modules[name]


with _hidden(HIDDEN):
    from numba import njit
    from numba.core.registry import cpu_target
    from numba.cpython.unsafe.numbers import trailing_zeros

    cpu_target.target_context.refresh()

__all__ = ["njit", "trailing_zeros"]
