"""Run the reference tests with one BLAS thread and one torch thread (restored afterwards).

Their matrices are tiny, and on a 2-core machine OpenBLAS's spinning worker threads (and torch's
OpenMP ones) starve each other and anything else running: measured on 2 cores, the reference tests
took 4-6× longer with the default 2 threads than with 1. Import ``single_threaded`` into a test
module to use it (an autouse fixture, module scope). Without an OpenBLAS numpy or outside Linux it
only sets torch's threads.
"""

from __future__ import annotations

import ctypes
import sys

import numpy  # noqa: F401  (loads numpy's BLAS, so /proc/self/maps lists it)
import pytest

# (setter, getter) pairs: plain OpenBLAS, then the symbol names of numpy's scipy-openblas64 wheels.
_SYMBOLS = (
    ("openblas_set_num_threads", "openblas_get_num_threads"),
    ("scipy_openblas_set_num_threads64_", "scipy_openblas_get_num_threads64_"),
    ("scipy_openblas_set_num_threads", "scipy_openblas_get_num_threads"),
)


def _openblas():
    """(set_num_threads, get_num_threads) of the loaded OpenBLAS, or None."""
    try:
        with open("/proc/self/maps") as f:
            paths = {ln.split()[-1] for ln in f if "openblas" in ln.lower() and ".so" in ln}
    except OSError:
        return None
    for path in sorted(paths):
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for s, g in _SYMBOLS:
            if hasattr(lib, s) and hasattr(lib, g):
                return getattr(lib, s), getattr(lib, g)
    return None


@pytest.fixture(scope="module", autouse=True)
def single_threaded():
    blas = _openblas()
    old_blas = blas[1]() if blas else None
    torch = sys.modules.get("torch")
    old_torch = torch.get_num_threads() if torch else None
    if blas:
        blas[0](1)
    if torch:
        torch.set_num_threads(1)
    yield
    if blas:
        blas[0](old_blas)
    if torch:
        torch.set_num_threads(old_torch)


__all__ = ["single_threaded"]
