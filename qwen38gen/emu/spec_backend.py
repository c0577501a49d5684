"""The speculative engine's backend on the emulated schedule (``run --backend emu --mtp K``): the
mtp program emitted for the lanes, its prefill and verify schedules executed in numpy
(emu/schedule.py), driven by spec_engine.SpecProgramSlots exactly as the GPU backend drives the
runtime. It runs the program's schedule, not its CUDA kernels.

A slot's reset zeroes its GDN recurrent state, conv ring, GDN state slot and position, and fills
its target and MTP K/V caches with NaN: a NaN in the logits the host reads (or in a kept token's
choice) means the schedule read K/V that the new request had not written.
"""

from __future__ import annotations

from ..config import ModelConfig
from ..errors import UserError
from ..serve.spec_engine import SpecProgramSlots, spec_headroom
from .backend import reset_state
from .schedule import Emu


class EmuSpecBackend(SpecProgramSlots):
    """B slots of an mtp program, emulated (spec_engine's backend)."""

    def __init__(self, cfg: ModelConfig, lanes, tensors: dict, ctx: int):
        from ..emit import emit_program

        if not lanes.mtp:
            raise UserError("EmuSpecBackend runs an mtp program; emit the lanes with --mtp K")
        if ctx < 1:
            raise UserError(f"ctx {ctx} must be ≥ 1")
        man = emit_program(cfg, lanes).manifest
        self.emu = Emu(man, cfg, tensors, tmax=ctx + spec_headroom(lanes.mtp))
        self._setup(man, ctx)
        self.vocab = cfg.vocab_size
        self.emu.reset()

    def _put(self, name, a):
        self.emu.put(name, a)

    def _get(self, name):
        return self.emu.get(name)

    check_logits = True

    def _run(self, phase, start, stop):
        self.emu.run(phase, start, stop)

    def _reset_state(self, slot):
        reset_state(self.emu, self.manifest, slot)
