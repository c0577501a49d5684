"""Backends of the engine (engine.Backend): the numpy reference on CPU, and the emitted program
through the PyCUDA runtime.

``ReferenceBackend`` is exact per slot (the reference computes each sequence alone), so it is the
CPU lock of the engine's scheduling. ``RuntimeBackend`` drives a ``runtime.Runtime``
(tests/gpu/test_engine.py runs it on the GPU): prefill chunks and decode steps are the program's
own phases with per-slot ``ntok`` (0 = the slot idles: no state is written and its position does
not move), and a slot's reset zeroes
its recurrent state, conv ring and position (``Runtime.reset_slot``). It chooses tokens on the
device (``samples``): ``next`` [B] as the step's argmax wrote it, or as the program's sample phase
(kernels/sampling.cuh) rewrites it where some choosing slot samples, over per-slot parameters
packed when a slot takes a request and uploaded before the next sample phase that needs them;
no B x V logits come to the host (tests/gpu/test_engine.py covers it on the GPU).
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from ..errors import UserError
from ..inputs import put_chunk
from ..reference import Reference
from ..sampling import SamplingParams, pack_params


class ReferenceBackend:
    """B slots on ``reference.Reference`` (its State holds every slot)."""

    def __init__(self, ref: Reference, slots: int, chunk: int, ctx: int):
        if slots < 1 or chunk < 1 or ctx < 1:
            raise UserError(f"slots {slots}, chunk {chunk} and ctx {ctx} must all be ≥ 1")
        self.ref, self.slots, self.chunk, self.ctx = ref, slots, chunk, ctx
        self.vocab = ref.cfg.vocab_size
        self.state = ref.new_state(slots)

    def reset_slot(self, slot: int) -> None:
        st, fresh = self.state, self.ref.new_state(1)
        st.pos[slot] = 0
        for i in st.conv:
            st.conv[i][slot] = fresh.conv[i][0]
            st.rec[i][slot] = fresh.rec[i][0]
        for i in st.k:
            st.k[i][slot], st.v[i][slot] = fresh.k[i][0], fresh.v[i][0]
        st.mtp_k[slot], st.mtp_v[slot] = fresh.mtp_k[0], fresh.mtp_v[0]

    def _check(self, rows: list[list[int]]) -> None:
        for b, r in enumerate(rows):
            if self.state.pos[b] + len(r) > self.ctx:
                raise ValueError(f"slot {b}: position {self.state.pos[b]} + {len(r)} tokens "
                                 f"passes the context {self.ctx}")

    def prefill(self, chunks: list[list[int]]) -> list[np.ndarray | None]:
        if any(len(c) > self.chunk for c in chunks):
            raise ValueError(f"a prefill chunk holds at most {self.chunk} tokens per slot")
        self._check(chunks)
        logits, _ = self.ref.forward(self.state, [list(c) for c in chunks])
        return [lg[-1] if len(c) else None for lg, c in zip(logits, chunks)]

    def decode(self, tokens: list[int | None]) -> np.ndarray:
        rows = [[] if t is None else [int(t)] for t in tokens]
        self._check(rows)
        logits, _ = self.ref.forward(self.state, rows)
        out = np.zeros((self.slots, self.vocab), self.ref.dtype)
        for b, lg in enumerate(logits):
            if len(lg):
                out[b] = lg[-1]
        return out


class ProgramSlots:
    """What the backends over an emitted program share: per-slot sampling parameters in the
    program's buffers, and the token choice (``next`` as the step's argmax wrote it, or as the
    sample phase rewrites it where some choosing slot samples). A subclass says how to put a
    buffer, run a phase and read ``next``."""

    slots: int
    params: list[SamplingParams]
    _fpar = None      # the host's copy of the program's parameter rows (set_sampling packs them)
    _upar = None
    _stale = False    # rows changed since they last went up

    def _put(self, name: str, a: np.ndarray) -> None:
        raise NotImplementedError

    def _run(self, phase: str) -> None:
        raise NotImplementedError

    def _next(self) -> np.ndarray:
        raise NotImplementedError

    def _check_positions(self, positions: dict[int, int]) -> None:
        """Where the program's positions can be read: each must be the chosen token's."""

    def set_sampling(self, slot: int, params: SamplingParams) -> None:
        """The sampling parameters of the request slot took: packed into the slot's row of the
        host's copy of the program's parameter buffers, uploaded (all rows at once) before the
        next sample phase that needs them."""
        if self._fpar is None:
            self._fpar, self._upar, _ = pack_params(self.params, [0] * self.slots)
        self.params[slot] = params
        f, u, _ = pack_params([params], [0])
        self._fpar[slot], self._upar[slot] = f[0], u[0]
        self._stale = True

    def choose(self, positions: dict[int, int]) -> dict[int, int]:
        """The chosen tokens of these slots; the sample phase's counter is the slot's position
        after the step (the position of the token being chosen)."""
        if not positions:
            return {}
        self._check_positions(positions)
        if any(not self.params[b].greedy for b in positions):
            if self._stale:
                self._put("samp_fpar", self._fpar)
                self._put("samp_upar", self._upar.view(np.int32))
                self._stale = False
            self._run("sample")
        nxt = self._next().tolist()
        return {b: nxt[b] for b in positions}


class RuntimeBackend(ProgramSlots):
    """B slots of an emitted program on the GPU (``runtime.Runtime``); tests/gpu/test_engine.py."""

    def __init__(self, rt):
        if rt.mtp:
            raise UserError("this backend drives the plain decode program; an mtp program "
                            "(run --mtp K) runs on spec_engine's backends")
        if "sample" not in rt.manifest["schedule"]:
            raise UserError("the program has no sample phase; emit it again with this version")
        self.rt = rt
        self.slots, self.chunk, self.ctx = rt.B, rt.pt, rt.tmax
        self.vocab = rt.cfg.vocab_size
        self.samples = True
        self.params = [SamplingParams()] * self.slots
        self.phase_runs: Counter[str] = Counter()   # graph replays by phase (bench --serve)
        rt.reset()

    def reset_slot(self, slot: int) -> None:
        self.rt.reset_slot(slot)

    def _put(self, name: str, a: np.ndarray) -> None:
        self.rt.put(name, a)

    def _run(self, phase: str) -> None:
        self.phase_runs[phase] += 1
        self.rt.run_phase(phase)

    def _next(self) -> np.ndarray:
        return self.rt.get("next")

    def logits(self) -> np.ndarray:
        """The last step's logits rows [B, V] (read back only for the engine's NaN guard)."""
        return self.rt.get("logits")[:self.slots]

    def prefill(self, chunks: list[list[int]]) -> list[np.ndarray | None]:
        self._run(put_chunk(self.rt.put, self.rt.manifest["schedule"], chunks))
        return [None] * self.slots

    def decode(self, tokens: list[int | None]) -> None:
        self.rt.put("tokens", np.array([0 if t is None else t for t in tokens], np.int32))
        self.rt.put("ntok", np.array([0 if t is None else 1 for t in tokens], np.int32))
        self._run("decode")
        return None
