"""The engine's backend on the emulated schedule (``run --backend emu``): the program emitted for
the lanes, its weights packed as the GPU runtime packs them (int4 g128 codes and scales, from a
checkpoint or synthetic), and its prefill and decode phases executed in numpy per engine step.

It runs the program's schedule, not its CUDA kernels (no GPU, no nvcc; fp64 buffers), so it
checks the engine against the program's own phases, buffers and per-slot ``ntok`` on any machine.

Tokens are chosen as the program chooses them (``samples``): the step's argmax where every
choosing slot is greedy, else the program's sample phase (kernels/sampling.cuh, executed by its
numpy twin) over per-slot parameters filled when a slot takes a request; ``device_sampling=False``
returns logits for the engine to sample on the host instead (the same rule).

A slot's reset zeroes its recurrent state, conv ring and position as ``Runtime.reset_slot`` does,
and fills its K/V cache with NaN: attention must read only the positions the new request wrote,
and a NaN in the logits of a slot that fed tokens is an error.
"""

from __future__ import annotations

import numpy as np

from ..compare import nonfinite_where
from ..config import ModelConfig
from ..serve.backends import ProgramSlots
from ..serve.engine import NonFiniteLogits
from ..errors import UserError
from ..inputs import put_chunk
from ..sampling import SamplingParams
from .schedule import Emu

NOTICE = ("emu backend: runs the emitted program's schedule in numpy on the CPU (slowly), "
          "not the CUDA kernels")


def reset_state(emu: Emu, manifest: dict, slot: int) -> None:
    """A fresh sequence in ``slot`` of an emulated program (plain or mtp): position, GDN state
    slot, recurrent state and conv ring to zero; the K/V caches (the MTP's too) to NaN, since
    attention must never read past what the new request writes."""
    for name, spec in manifest["buffers"].items():
        if not (spec.get("state") or name == "pos"):
            continue
        a = emu.buf[name].reshape(emu._shape(name))
        if name in ("pos", "slot"):                      # [B]
            a[slot] = 0
        elif name in ("conv", "rec"):                    # [layers, B, ...]
            a[:, slot] = 0
        elif name in ("kc", "vc"):                       # [layers, B, ...]: never read
            a[:, slot] = np.nan
        elif name in ("mkc", "mvc"):                     # [B, ...]: never read
            a[slot] = np.nan
        else:
            raise ValueError(f"reset_slot does not know the state buffer {name!r}")


class EmuBackend(ProgramSlots):
    """B slots of the emitted program, emulated (engine.Backend)."""

    def __init__(self, cfg: ModelConfig, lanes, tensors: dict, ctx: int,
                 device_sampling: bool = True):
        from ..emit import emit_program

        if lanes.mtp:
            raise UserError("this backend drives the plain decode program; an mtp program "
                            "(run --mtp K) runs on spec_engine's backends")
        if ctx < 1:
            raise UserError(f"ctx {ctx} must be ≥ 1")
        self.manifest = emit_program(cfg, lanes).manifest
        self.emu = Emu(self.manifest, cfg, tensors, tmax=ctx)
        self.slots, self.chunk, self.ctx = lanes.batch, self.manifest["schedule"]["prefill_pt"], ctx
        self.vocab = cfg.vocab_size
        self.emu.reset()
        self.samples = device_sampling
        self.params = [SamplingParams()] * self.slots

    def _put(self, name: str, a: np.ndarray) -> None:
        self.emu.put(name, a)

    def _run(self, phase: str) -> None:
        self.emu.run(phase)

    def _next(self) -> np.ndarray:
        return self.emu.buf["next"]

    def logits(self) -> np.ndarray:
        """The last step's logits rows [B, V] (the engine's NaN guard)."""
        return self.emu.get("logits")[:self.slots]

    def _check_positions(self, positions: dict[int, int]) -> None:
        pos = self.emu.buf["pos"]
        for b, p in positions.items():
            if pos[b] != p:
                raise RuntimeError(f"slot {b}: the program's position {pos[b]} is not the "
                                   f"position {p} of the token being chosen")

    def reset_slot(self, slot: int) -> None:
        if not 0 <= slot < self.slots:
            raise ValueError(f"slot {slot} is outside 0..{self.slots - 1}")
        reset_state(self.emu, self.manifest, slot)

    def _check(self, fed: list[int]) -> None:
        pos = self.emu.buf["pos"]
        for b, n in enumerate(fed):
            if pos[b] + n > self.ctx:
                raise ValueError(f"slot {b}: position {pos[b]} + {n} tokens passes the context "
                                 f"{self.ctx}")

    def _logits(self, fed: list[int]) -> np.ndarray | None:
        lg = self.emu.get("logits")[:self.slots]
        for b, n in enumerate(fed):
            where = nonfinite_where(lg[b], f"slot {b} logits") if n else None
            if where:   # e.g. the schedule read K/V past the slot's position (poisoned NaN)
                raise NonFiniteLogits(f"non-finite {where}")
        return None if self.samples else lg

    def prefill(self, chunks: list[list[int]]) -> list[np.ndarray | None]:
        B, pt = self.slots, self.chunk
        if len(chunks) != B or any(len(c) > pt for c in chunks):
            raise ValueError(f"a prefill chunk is {B} lists of at most {pt} tokens")
        fed = [len(c) for c in chunks]
        self._check(fed)
        self.emu.run(put_chunk(self.emu.put, self.manifest["schedule"], chunks))
        lg = self._logits(fed)
        return [lg[b] if len(c) and lg is not None else None for b, c in enumerate(chunks)]

    def decode(self, tokens: list[int | None]) -> np.ndarray | None:
        fed = [0 if t is None else 1 for t in tokens]
        self._check(fed)
        self.emu.put("tokens", np.array([0 if t is None else t for t in tokens], np.int64))
        self.emu.put("ntok", np.asarray(fed, np.int64))
        self.emu.run("decode")
        return self._logits(fed)
