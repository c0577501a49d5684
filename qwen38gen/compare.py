"""The comparison primitives every lock uses: where a non-finite value is, and the worst of
several errors with NaN kept.

A NaN must fail every comparison and say where it came from. Two habits of plain Python let one
pass: ``max(worst, nan)`` keeps ``worst`` (a comparison with NaN is false), and a NaN that is never
compared (a top-k list that skipped it, a state nobody measured) is never seen. The golden files,
``check``, ``check --reference``, ``check --mtp``, ``check --serve`` and the engine's guard all go
through these functions, and measure states with ``rel_error``.
"""

from __future__ import annotations

import math

import numpy as np


def nonfinite_where(values, what: str) -> str | None:
    """None when every value is finite, else where the first non-finite one is (``what`` names
    the array; the index is its flat position, or the (row, column) of a 2-D array)."""
    a = np.asarray(values, dtype=np.float64)
    bad = np.flatnonzero(~np.isfinite(a))
    if bad.size == 0:
        return None
    at = np.unravel_index(bad[0], a.shape) if a.ndim > 1 else (int(bad[0]),)
    return (f"{what}[{', '.join(str(int(i)) for i in at)}] = {a.flat[bad[0]]} "
            f"({bad.size} non-finite value{'s' if bad.size > 1 else ''})")


def worst(errors) -> float:
    """The largest of ``errors``; NaN if any is NaN (``max`` would drop a NaN that comes
    after a number, so a NaN would pass a ``<=`` tolerance test by its position in a list)."""
    vals = [float(e) for e in errors]
    if any(math.isnan(v) for v in vals):
        return float("nan")
    return max(vals, default=0.0)


def rel_error(a: np.ndarray, b: np.ndarray) -> float:
    """|a - b| / |b| (Frobenius norms, fp64), inf when the shapes differ, NaN when either holds
    a non-finite value (so that no tolerance passes it)."""
    if a.shape != b.shape:
        return float("inf")
    a = (a if a.dtype == np.float64 else a.astype(np.float32)).astype(np.float64)  # bf16 via fp32
    b = b.astype(np.float64)
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        return float("nan")
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))
