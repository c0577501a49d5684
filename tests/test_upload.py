"""The staged weight upload (qwen38gen/upload.py, Runtime._alloc) against a stand-in driver
whose stream runs copies only when an event or the stream is synchronized: a staging buffer
refilled before its copy ran would put the wrong bytes on the "device"."""

import numpy as np
import pytest

from qwen38gen import quantize as qz
from qwen38gen import checkpoint as ck
from qwen38gen import weights as wt
from qwen38gen.emit import emit_program
from qwen38gen.inputs import fused_arrays, pack_weights
from qwen38gen.lanes import Lanes
from qwen38gen.config import PRESETS
from qwen38gen.runtime import weight_parts
from qwen38gen.upload import Upload

TINY = PRESETS["tiny"]


class FakeDriver:
    """Device memory as one bytearray; a stream whose queued copies run when synchronized."""

    def __init__(self, size: int):
        self.mem = np.full(size, 0xA5, np.uint8)     # poisoned
        self.top = 0
        self.queue = []
        self.pinned = 0

    def pagelocked_empty(self, n, dtype):
        self.pinned += n
        return np.zeros(n, dtype)

    def mem_alloc(self, n):
        p, self.top = self.top, self.top + (n + 255) // 256 * 256
        assert self.top <= self.mem.size
        return p

    def memcpy_htod_async(self, dst, buf, stream):
        self.queue.append((dst, buf))              # reads buf when it runs, not now

    def run(self, upto=None):
        while self.queue and self.queue[0] is not upto:
            item = self.queue.pop(0)
            if isinstance(item, tuple):
                dst, buf = item
                self.mem[dst:dst + buf.size] = buf
        if self.queue and self.queue[0] is upto:
            self.queue.pop(0)

    def Event(self):
        drv = self

        class Ev:
            def record(self, stream):
                drv.queue.append(self)

            def synchronize(self):
                drv.run(self)
        return Ev()

    def synchronize(self):                          # the stream's
        self.run()


def test_upload_puts_every_byte_where_it_goes_through_a_small_ring():
    rng = np.random.default_rng(0)
    arrays = [rng.integers(0, 2**32, n, dtype=np.uint32) for n in (1, 1000, 7, 4096, 333)]
    arrays.append(rng.standard_normal((17, 9)).astype(wt.BF16))
    arrays.append(np.asfortranarray(rng.standard_normal((5, 6)).astype(np.float32)))
    total = sum(a.nbytes for a in arrays)
    drv = FakeDriver(total + 4096)
    up = Upload(drv, drv, total, chunk=1000, slots=2)
    dst = [drv.mem_alloc(a.nbytes) for a in arrays]
    for d, a in zip(dst, arrays):
        assert up.copy(d, a) == a.nbytes
    st = up.finish()
    assert not drv.queue and st["bytes"] == total and st["copies"] > 2 * len(arrays)
    for d, a in zip(dst, arrays):
        want = np.ascontiguousarray(a).reshape(-1).view(np.uint8)
        assert np.array_equal(drv.mem[d:d + a.nbytes], want)
    assert drv.pinned == 2 * 1000


@pytest.mark.parametrize("mapped", [False, True])
def test_runtime_weight_parts_are_the_fused_arrays(tmp_path, mapped):
    """What Runtime._alloc uploads, buffer by buffer, is the concatenation the emulator uses
    (fused_arrays), from a quantized folder read whole or mapped."""
    src = tmp_path / "ck"
    ck.save_checkpoint(TINY, wt.synthetic_weights(TINY, seed=3), src, max_shard_bytes=2 << 20)
    q = qz.quantize_checkpoint(src, tmp_path / "q", max_shard_bytes=1 << 20)
    man = emit_program(TINY, Lanes.make(2, pt=4)).manifest
    packed = pack_weights(TINY, qz.load_quantized(q, TINY, mapped=mapped))
    parts = weight_parts(man, packed)
    total = sum(a.nbytes for _, arrs in parts for a in arrs)
    drv = FakeDriver(total + 256 * len(parts))
    up = Upload(drv, drv, total, chunk=64 << 10, slots=3)
    where = {}
    for key, arrs in parts:
        g = drv.mem_alloc(sum(a.nbytes for a in arrs))
        where[key], off = g, 0
        for a in arrs:
            off += up.copy(g + off, a)
    up.finish()
    for name, spec in man["weights"].items():
        qf, sf = fused_arrays(spec, packed)
        for part, arr in (("qweight", qf), ("scales", sf)):
            g = where[("w", name, part)]
            assert np.array_equal(drv.mem[g:g + arr.nbytes], arr.reshape(-1).view(np.uint8)), name
    for name in man["tensors"]:
        g, (_, [a]) = where[("t", name)], next(p for p in parts if p[0] == ("t", name))
        assert np.array_equal(drv.mem[g:g + a.nbytes], np.ascontiguousarray(a).reshape(-1).view(np.uint8))


def test_synthetic_quantized_folder_loads_as_the_model(tmp_path):
    """scripts/synthetic_quantized.py (the device's cold start from a folder) writes what
    load_quantized accepts for the model it names, with the preset's config hash (so the
    precompiled program is the one `run` loads)."""
    import subprocess
    import sys

    from qwen38gen.config import load_config

    out = tmp_path / "q"
    r = subprocess.run([sys.executable, "scripts/synthetic_quantized.py", "write", str(out),
                        "--model", "tiny"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    cfg = load_config(out)
    assert cfg.hash == TINY.hash
    t = qz.load_quantized(out, cfg, mapped=True)
    packed = pack_weights(cfg, t)
    assert set(packed) == set(TINY.tensor_shapes(mtp=False))
