"""GPU test harness: compile a small translation unit over kernels/ with PyCUDA, move arrays.

Tests import this only after ``conftest.py`` has confirmed that PyCUDA imports and a CUDA device
answers; elsewhere the whole folder is skipped.
"""

from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np

KERNELS = Path(__file__).resolve().parents[2] / "kernels"
BF16 = np.dtype(ml_dtypes.bfloat16)


def build(src: str, arch: str = "sm_90"):
    """Compile ``src`` (which #includes kernels/*.cuh) and return the PyCUDA module."""
    from pycuda.compiler import SourceModule

    return SourceModule(src, no_extern_c=True, arch=arch, include_dirs=[str(KERNELS)],
                        options=["-std=c++17", "-O3"])


def to_gpu(a: np.ndarray):
    import pycuda.gpuarray as ga

    return ga.to_gpu(np.ascontiguousarray(a))


def poisoned(shape, dtype):
    """A device array filled with NaN (floats) or 0x7f bytes (ints): unwritten outputs show."""
    import pycuda.gpuarray as ga

    dt = np.dtype(dtype)
    if dt.kind == "f" or dt == BF16:
        host = np.full(shape, np.nan, dtype=np.float32).astype(dt)
    else:
        host = np.full(shape, 0x7F7F7F7F, dtype=np.int64).astype(dt)
    return ga.to_gpu(host)


def rel_err(got: np.ndarray, ref: np.ndarray) -> float:
    """‖got − ref‖ / ‖ref‖ in fp64; NaN anywhere gives inf."""
    g = np.asarray(got, dtype=np.float64)
    r = np.asarray(ref, dtype=np.float64)
    if not np.all(np.isfinite(g)):
        return float("inf")
    return float(np.linalg.norm(g - r) / max(np.linalg.norm(r), 1e-30))
