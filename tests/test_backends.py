"""The GPU backend's host side without a GPU: ``Runtime.reset_slot`` zeroes exactly one slot of
the emitted program's state buffers (byte spans checked on host copies of the buffers), and
``RuntimeBackend`` lays out prefill chunks and decode steps as the program reads them (tokens
row b·pt + t, ntok 0 for an idle slot), uploads a slot's sampling parameters in
sampling.pack_params's layout when it takes a request, and after a step reads ``next`` [B],
running the sample phase first only where a choosing slot samples. The GPU runs it in
tests/gpu/test_engine.py."""

from __future__ import annotations

import numpy as np
import pytest

from qwen38gen.config import PRESETS
from qwen38gen.emit import emit_program
from qwen38gen.errors import UserError
from qwen38gen.lanes import Lanes
from qwen38gen.plan.program import resolve_shape
from qwen38gen.runtime import DT, Runtime
from qwen38gen.sampling import SamplingParams, pack_params
from qwen38gen.serve.backends import RuntimeBackend


class HostMem:
    """Device buffers as host byte arrays; pointers are (base id << 40) + byte offset."""

    def __init__(self):
        self.blocks = {}

    def alloc(self, nbytes):
        base = (len(self.blocks) + 1) << 40
        self.blocks[base] = np.full(nbytes, 0xAB, np.uint8)
        return base

    def memset_d8_async(self, ptr, value, n, stream):
        base, off = ptr >> 40 << 40, ptr & ((1 << 40) - 1)
        assert off + n <= self.blocks[base].size
        self.blocks[base][off:off + n] = value

    def memset_d2d8_async(self, ptr, pitch, value, width, height, stream):
        """cuMemsetD2D8: height rows of width bytes, pitch bytes apart."""
        assert width <= pitch or height == 1
        for r in range(height):
            self.memset_d8_async(ptr + r * pitch, value, width, stream)


def fake_runtime(B, pt=16, tmax=32, mtp=0):
    cfg = PRESETS["tiny"]
    prog = emit_program(cfg, Lanes.make(B, pt=pt, mtp=mtp))
    rt = Runtime.__new__(Runtime)
    rt.drv = HostMem()
    rt.stream, rt.B, rt.pt, rt.tmax, rt.cfg, rt.mtp = None, B, pt, tmax, cfg, mtp
    rt.manifest = prog.manifest
    rt.bufs = {}
    for name, spec in prog.manifest["buffers"].items():
        shape, dt = resolve_shape(spec["shape"], tmax), DT[spec["dtype"]]
        rt.bufs[name] = (rt.drv.alloc(int(np.prod(shape)) * dt.itemsize), shape, dt)
    return rt


def view(rt, name):
    """The buffer's bytes, shaped [*shape, itemsize]."""
    g, shape, dt = rt.bufs[name]
    return rt.drv.blocks[g].reshape(*shape, dt.itemsize)


@pytest.mark.parametrize("B,slot", [(1, 0), (3, 1), (3, 2)])
def test_reset_slot_zeroes_one_slot(B, slot):
    rt = fake_runtime(B)
    Runtime.reset_slot(rt, slot)
    for name in ("conv", "rec"):
        a = view(rt, name)
        assert np.all(a[:, slot] == 0), name
        others = [b for b in range(B) if b != slot]
        assert all(np.all(a[:, b] == 0xAB) for b in others), name
    pos = view(rt, "pos")
    assert np.all(pos[slot] == 0) and all(np.all(pos[b] == 0xAB) for b in range(B) if b != slot)
    for name in ("kc", "vc"):   # KV is left: positions past the new sequence are never read
        assert np.all(view(rt, name) == 0xAB)
    with pytest.raises(ValueError, match=rf"^slot {B} is outside 0\.\.{B - 1}$"):
        Runtime.reset_slot(rt, B)


class Recorder:
    def __init__(self, rt):
        self.B, self.pt, self.tmax, self.cfg, self.mtp = rt.B, rt.pt, rt.tmax, rt.cfg, rt.mtp
        self.manifest = rt.manifest
        self.log = []

    def reset(self):
        self.log.append(("reset",))

    def put(self, name, arr):
        self.log.append(("put", name, np.asarray(arr).tolist()))

    def run_phase(self, phase):
        self.log.append(("run", phase))

    def get(self, name):
        assert name == "next"
        self.log.append(("get", name))
        return np.arange(10, 10 + self.B, dtype=np.int32)


def test_runtime_backend_layout():
    rec = Recorder(fake_runtime(3, pt=4))
    be = RuntimeBackend(rec)
    assert (be.slots, be.chunk, be.ctx) == (3, 4, 32)
    assert be.samples   # tokens are chosen on the device: no logits come back
    assert be.prefill([[5, 6, 7], [], [9]]) == [None] * 3
    # packed (docs/KERNELS.md): 4 rows, in the schedule of 8 (B = 3, pt 4: 8 and 12 rows)
    assert rec.log[1:] == [("put", "tokens", [5, 6, 7, 9, 0, 0, 0, 0, 0, 0, 0, 0]),
                           ("put", "ntok", [3, 0, 1]), ("put", "row0", [0, 3, 3]),
                           ("put", "rowseq", [0, 0, 0, 2] + [-1] * 8), ("run", "prefill_r8")]
    rec.log.clear()
    be.prefill([[1, 2, 3, 4], [5, 6, 7, 8], [9]])            # 9 rows: the whole 12
    assert rec.log[-1] == ("run", "prefill")
    rec.log.clear()
    be.decode([None, 4, 2])
    assert rec.log == [("put", "tokens", [0, 4, 2]), ("put", "ntok", [0, 1, 1]), ("run", "decode")]


def test_runtime_backend_sampling():
    rec = Recorder(fake_runtime(3, pt=4))
    be = RuntimeBackend(rec)
    rec.log.clear()
    sp = SamplingParams(temperature=0.8, top_k=5, top_p=0.5, min_p=0.1, seed=(7 << 32) + 3)
    be.set_sampling(1, sp)
    fpar, upar, _ = pack_params([SamplingParams(), sp, SamplingParams()], [0, 0, 0])
    assert rec.log == []                    # packed on the host; uploaded when a sample needs it
    assert upar[1].tolist() == [5, 1 << 23, 3, 7]
    assert be.choose({0: 4, 2: 9}) == {0: 10, 2: 12}      # greedy slots: the step's argmax
    assert rec.log == [("get", "next")]
    rec.log.clear()
    assert be.choose({1: 6, 2: 9}) == {1: 11, 2: 12}      # a sampling slot: the sample phase
    assert rec.log == [("put", "samp_fpar", fpar.tolist()),
                       ("put", "samp_upar", upar.view(np.int32).tolist()),
                       ("run", "sample"), ("get", "next")]
    rec.log.clear()
    assert be.choose({1: 7}) == {1: 11}   # nothing changed since: no upload
    assert rec.log == [("run", "sample"), ("get", "next")]
    rec.log.clear()
    be.set_sampling(0, sp)                 # a refill: the rows go up again before the next sample
    be.set_sampling(2, SamplingParams())
    fpar, upar, _ = pack_params([sp, sp, SamplingParams()], [0, 0, 0])
    assert be.choose({0: 3}) == {0: 10}
    assert rec.log == [("put", "samp_fpar", fpar.tolist()),
                       ("put", "samp_upar", upar.view(np.int32).tolist()),
                       ("run", "sample"), ("get", "next")]
    rec.log.clear()
    assert be.choose({}) == {} and rec.log == []


def test_runtime_backend_refuses_mtp():
    with pytest.raises(UserError, match=r"^this backend drives the plain decode program; an mtp "
                                        r"program \(run --mtp K\) runs on spec_engine's backends$"):
        RuntimeBackend(Recorder(fake_runtime(2, mtp=1)))


def test_reset_slot_of_an_mtp_program():
    """The mtp program's GDN state slot is zeroed with the slot; its MTP K/V is left (read only
    below the position, as the target's)."""
    rt = fake_runtime(3, pt=4, mtp=2)
    Runtime.reset_slot(rt, 1)
    s = view(rt, "slot")
    assert np.all(s[1] == 0) and np.all(s[0] == 0xAB) and np.all(s[2] == 0xAB)
    assert np.all(view(rt, "rec")[:, 1] == 0) and np.all(view(rt, "rec")[:, 2] == 0xAB)
    for name in ("mkc", "mvc", "kc", "vc"):
        assert np.all(view(rt, name) == 0xAB), name
