"""numba for the index's kernels, loaded without the SciPy imports numba makes on the way.

`import numba` imports SciPy to check its version, and numba's first kernel load imports
`scipy.linalg` to probe for a BLAS: together 0.9-1.2 s of every start of `kvscope index`
(docs/index.md, "Restart"), for nothing the index uses (its kernels do no linear algebra).
While numba loads here, SciPy is hidden (importing it fails, so numba takes it as absent
and its few dot-product helpers use plain loops); afterwards it imports as usual. Numba's
one-time set-up (its implementation registries) runs here too, at import, instead of in
the first kernel call. A process that imported SciPy already gains nothing and loses
nothing.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator


@contextlib.contextmanager
def _scipy_hidden() -> Iterator[None]:
    """SciPy cannot be imported inside the block (unless it was imported before)."""
    if "scipy" in sys.modules:
        yield
        return
    sys.modules["scipy"] = None  # type: ignore[assignment]  # the import system's "absent"
    try:
        yield
    finally:
        if "scipy" in sys.modules and sys.modules["scipy"] is None:
            del sys.modules["scipy"]


with _scipy_hidden():
    from numba import njit
    from numba.core.registry import cpu_target
    from numba.cpython.unsafe.numbers import trailing_zeros

    cpu_target.target_context.refresh()

__all__ = ["njit", "trailing_zeros"]
