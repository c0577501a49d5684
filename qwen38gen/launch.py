"""Kernel launches with programmatic dependent launch (PDL), through libcuda's cuLaunchKernelEx.

PyCUDA launches cannot carry launch attributes, so with PDL on the step's kernels are loaded here
instead, straight from the cubin, and launched with
CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION (or without it: `launch(..., pdl=False)`,
for the per-kernel timing pass).
Captured into a graph, consecutive kernels then get programmatic edges: a kernel's blocks may
start while the previous kernel drains, run up to their `griddepcontrol.wait` (the GEMV streams
its first weights there) and continue once the previous grid has completed and its writes are
visible. The kernels' side of the contract is in kernels/common.cuh (pdl_wait).

QWEN38_PDL=0 turns it off (plain PyCUDA launches), for A/B timing.
"""

from __future__ import annotations

import ctypes
import os

import numpy as np

from .errors import UserError

CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 6
CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8


class _Attr(ctypes.Structure):
    # CUlaunchAttribute: id (enum), padding to 8 bytes, then the 64-byte value union.
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_int),
                ("rest", ctypes.c_char * 60)]


class _Config(ctypes.Structure):
    # CUlaunchConfig
    _fields_ = [("gx", ctypes.c_uint), ("gy", ctypes.c_uint), ("gz", ctypes.c_uint),
                ("bx", ctypes.c_uint), ("by", ctypes.c_uint), ("bz", ctypes.c_uint),
                ("smem", ctypes.c_uint), ("stream", ctypes.c_void_p),
                ("attrs", ctypes.POINTER(_Attr)), ("nattrs", ctypes.c_uint)]


def enabled() -> bool:
    """QWEN38_PDL: 1 or unset (programmatic dependent launch on), 0 (off); else a UserError."""
    v = os.environ.get("QWEN38_PDL", "1")
    if v not in ("", "0", "1"):
        raise UserError(f"QWEN38_PDL={v!r}: use 0 (off) or 1 (on, the default), or leave it unset")
    return v != "0"


def _c(v):
    if isinstance(v, (np.uintp, np.uint64)):
        return ctypes.c_uint64(int(v))
    if isinstance(v, np.int32):
        return ctypes.c_int32(int(v))
    if isinstance(v, np.float32):
        return ctypes.c_float(float(v))
    raise TypeError(f"kernel argument of unsupported type {type(v).__name__}")


class Prepared:
    """One launch with its argument storage kept alive, and two launch configs over the same
    arguments: with the PDL attribute and without it (the per-kernel timing pass)."""

    def __init__(self, fn, grid, block, smem, args):
        self.fn = fn
        self.vals = [_c(a) for a in args]
        self.params = (ctypes.c_void_p * max(len(self.vals), 1))(
            *[ctypes.cast(ctypes.pointer(v), ctypes.c_void_p) for v in self.vals])
        self.attr = _Attr(id=CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION, value=1)
        self.cfg = {True: _Config(*grid, *block, smem, None, ctypes.pointer(self.attr), 1),
                    False: _Config(*grid, *block, smem, None, None, 0)}


class PdlModule:
    """The cubin loaded through libcuda (in the current context), its functions by name."""

    def __init__(self, cubin: bytes, kernels: dict):
        self.lib = lib = ctypes.CDLL("libcuda.so.1")
        for f in ("cuModuleLoadData", "cuModuleGetFunction", "cuFuncSetAttribute",
                  "cuLaunchKernelEx", "cuModuleUnload"):
            getattr(lib, f).restype = ctypes.c_int
        self._image = ctypes.create_string_buffer(cubin, len(cubin))
        self.mod = ctypes.c_void_p()
        self._ok(lib.cuModuleLoadData(ctypes.byref(self.mod), self._image), "cuModuleLoadData")
        self.fns = {}
        for name, k in kernels.items():
            fn = ctypes.c_void_p()
            self._ok(lib.cuModuleGetFunction(ctypes.byref(fn), self.mod, name.encode()),
                     f"cuModuleGetFunction({name})")
            if k["smem"] > 0:  # static + dynamic may pass 48 KiB even below it
                self._ok(lib.cuFuncSetAttribute(fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                                ctypes.c_int(k["smem"])), "cuFuncSetAttribute")
            self.fns[name] = fn

    @staticmethod
    def _ok(rc: int, what: str):
        if rc != 0:
            raise RuntimeError(f"{what} failed with CUresult {rc}")

    def symbol(self, name: str) -> tuple[int, int]:
        """Device address and size of a __device__ variable of the module."""
        ptr, size = ctypes.c_uint64(), ctypes.c_size_t()
        self.lib.cuModuleGetGlobal_v2.restype = ctypes.c_int
        self._ok(self.lib.cuModuleGetGlobal_v2(ctypes.byref(ptr), ctypes.byref(size), self.mod,
                                               name.encode()), f"cuModuleGetGlobal({name})")
        return ptr.value, size.value

    def prepare(self, name: str, grid, block, smem: int, args) -> Prepared:
        return Prepared(self.fns[name], tuple(grid), tuple(block), smem, args)

    def launch(self, p: Prepared, stream_handle: int, pdl: bool = True):
        """Enqueue p on the stream, with the PDL attribute or (pdl=False) without it."""
        cfg = p.cfg[pdl]
        cfg.stream = ctypes.c_void_p(stream_handle)
        self._ok(self.lib.cuLaunchKernelEx(ctypes.byref(cfg), p.fn, p.params, None),
                 "cuLaunchKernelEx")

    def close(self):
        if self.mod:
            self.lib.cuModuleUnload(self.mod)
            self.mod = ctypes.c_void_p()
