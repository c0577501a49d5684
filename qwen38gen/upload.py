"""Host arrays to the GPU at disk and PCIe speed: the staged upload of a program's weights.

A weight's bytes go through a ring of pinned staging buffers on one stream: the host fills a
buffer (a memcpy from RAM, or from a mapped checkpoint file whose pages the kernel reads from
disk as the copy touches them: ``CheckpointReader.mapped``), an asynchronous copy takes it to
the device, and the next buffer is filled while that copy runs. A buffer is refilled only after
its copy's event has completed. Nothing holds the model in host memory whole, and the fused
weights' parts are copied to their offsets in place (no concatenation on the host).

``Upload.stats()`` says where the time went: ``fill_s`` (the host filling buffers: reading the
files, or RAM), ``wait_s`` (waiting for a buffer's copy to finish: the PCIe side), and the bytes.
With the copies overlapped, the upload takes about max(fill, bytes / host-to-device bandwidth).
The driver is passed in (PyCUDA's ``pycuda.driver``, or a stand-in in the CPU tests).
"""

from __future__ import annotations

import time

import numpy as np

CHUNK = 64 << 20      # bytes per staging buffer
SLOTS = 3             # staging buffers in the ring


def as_bytes(arr: np.ndarray) -> np.ndarray:
    """The array's bytes, flat, without a copy when it is C-contiguous (a mapped view stays
    mapped: nothing is read until the staging copy touches it)."""
    a = arr if arr.flags.c_contiguous else np.ascontiguousarray(arr)
    return a.reshape(-1).view(np.uint8)


class Upload:
    """Copies host arrays to device addresses through ``slots`` pinned buffers of ``chunk``
    bytes (smaller when the whole upload is smaller), asynchronously on ``stream``;
    ``finish()`` waits for the last copy and frees the buffers."""

    def __init__(self, drv, stream, total: int, chunk: int = CHUNK, slots: int = SLOTS):
        self.drv, self.stream = drv, stream
        self.chunk = max(1, min(chunk, total))
        self.bufs = [drv.pagelocked_empty(self.chunk, np.uint8) for _ in range(slots)]
        self.done = [None] * slots        # the event of each buffer's last copy
        self.k = 0                        # copies issued
        self.bytes = 0
        self.fill_s = self.wait_s = 0.0
        self.t0 = time.perf_counter()
        self.seconds = 0.0

    def copy(self, dst: int, arr: np.ndarray) -> int:
        """``arr``'s bytes to device address ``dst``; the number of bytes."""
        src = as_bytes(arr)
        n = src.size
        for o in range(0, n, self.chunk):
            i = self.k % len(self.bufs)
            if self.done[i] is not None:
                t = time.perf_counter()
                self.done[i].synchronize()
                self.wait_s += time.perf_counter() - t
            m = min(self.chunk, n - o)
            buf = self.bufs[i][:m]
            t = time.perf_counter()
            np.copyto(buf, src[o:o + m])
            self.fill_s += time.perf_counter() - t
            self.drv.memcpy_htod_async(dst + o, buf, self.stream)
            ev = self.drv.Event()
            ev.record(self.stream)
            self.done[i] = ev
            self.k += 1
        self.bytes += n
        return n

    def finish(self) -> dict:
        t = time.perf_counter()
        self.stream.synchronize()
        self.wait_s += time.perf_counter() - t
        self.seconds = time.perf_counter() - self.t0
        self.bufs, self.done = [], []
        return self.stats()

    def stats(self) -> dict:
        return {"bytes": self.bytes, "seconds": round(self.seconds, 4),
                "fill_s": round(self.fill_s, 4), "wait_s": round(self.wait_s, 4),
                "copies": self.k}


def h2d_bandwidth(drv, stream, nbytes: int = 256 << 20, reps: int = 3) -> float:
    """Bytes per second of one pinned host-to-device copy of ``nbytes`` (best of ``reps``):
    the PCIe side's bound, printed beside the upload."""
    host = drv.pagelocked_empty(nbytes, np.uint8)
    dev = drv.mem_alloc(nbytes)
    try:
        best = float("inf")
        for _ in range(reps):
            e0, e1 = drv.Event(), drv.Event()
            e0.record(stream)
            drv.memcpy_htod_async(dev, host, stream)
            e1.record(stream)
            e1.synchronize()
            best = min(best, e1.time_since(e0) / 1e3)
        return nbytes / best
    finally:
        dev.free()
