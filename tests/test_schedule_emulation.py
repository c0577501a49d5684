"""The emitted schedule, executed in numpy (qwen38gen/emu/schedule.py), equals the numpy reference.

This checks the wiring of the program on the CPU: argument order, buffer offsets, row strides,
grids, the prefill chunk loop with sequences of different lengths (some idle in a chunk), and
the hand-off to decode. (It found the o-buffer stride bug that only shows with more than one row.)
"""

import numpy as np
import pytest

from qwen38gen.config import PRESETS
from qwen38gen.emit import emit_program
from qwen38gen.emu.schedule import Emu
from qwen38gen.inputs import put_chunk
from qwen38gen.lanes import Lanes
from qwen38gen.plan.arch import arch_facts
from qwen38gen.quantize import int4_weights
from qwen38gen.reference import Reference
from qwen38gen.tuning import ROLES, Tuning
from qwen38gen.weights import default_tensors

from tests._helpers import assert_final_state

TOL = 1e-9  # both sides are fp64 on the same dequantized weights; only summation order differs


@pytest.fixture(scope="module")
def setup():
    cfg = PRESETS["tiny"]
    t = default_tensors(cfg)
    return cfg, t, Reference(cfg, int4_weights(cfg, t), dtype=np.float64)


@pytest.mark.parametrize("B,pt,btg", [(3, 4, None), (2, 16, None),
                                      pytest.param(40, 4, 64, marks=pytest.mark.slow),
                                      (1, 4, None),
                                      pytest.param(16, 4, None, marks=pytest.mark.slow)])
def test_schedule_matches_reference(setup, B, pt, btg):
    """(40, 4, 64): batch tiles of 64 rows with 40 real, where the down projection's wgmma_q4
    reads the SwiGLU output in tile order (XT = 1). B = 1 and 16: gate_up with SwiGLU in its
    epilogue (plan.gemv.swiglu_fuses) in the decode steps."""
    cfg, t, ref = setup
    man = emit_program(cfg, Lanes.make(B, btg=btg, pt=pt)).manifest
    _check_against_reference(cfg, t, ref, man, B, pt, btg)


@pytest.mark.slow
def test_schedule_with_wgmma_sk_matches_reference(setup):
    """Tuning wgmma_sk=all (how `check` locks wgmma_sk_q4 on the tiny model): every tile-order
    GEMV is a wgmma_sk_q4 launch, with its scratch arguments and one block per SM; the
    schedule's wiring still gives the reference's logits."""
    cfg, t, ref = setup
    tuning = Tuning.parse(["wgmma_sk=all"])
    man = emit_program(cfg, Lanes.make(40, btg=64, pt=4, tuning=tuning)).manifest
    sk = [L for L in man["schedule"]["decode"] if _family(man, L) == "wgmma_sk_q4"]
    assert len(sk) == 4 * cfg.num_hidden_layers + 1   # in, out, gate_up, down, and the lm_head
    assert all(L["grid"][0] <= arch_facts("sm_90a").sms and L["args"][-1][1] == "gemm_arrivals" for L in sk)
    _check_against_reference(cfg, t, ref, man, 40, 4, 64)


def _family(man, L):
    return man["kernels"][L["k"]]["family"]


SCRATCH = ("x", "h", "proj", "o", "qbuf", "gu", "act", "hlast", "logits", "attn_part",
           "gemm_part", "topk_val", "nextval")


class PoisonedEmu(Emu):
    """Every float scratch buffer NaN before each phase: a launch that reads an element no
    earlier launch of the same phase wrote (rows past a packed chunk's, a stale partial) turns
    what it computes into NaN, which the comparison with the reference then shows."""

    instances: list = []

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.unwritten = []        # per phase run: scratch elements still NaN after it
        PoisonedEmu.instances.append(self)

    def run(self, phase, start=0, stop=None):
        for n in SCRATCH:
            if n in self.buf:
                self.buf[n][:] = np.nan
        super().run(phase, start, stop)
        self.unwritten.append(sum(int(np.isnan(self.buf[n]).sum()) for n in SCRATCH
                                  if n in self.buf))


@pytest.mark.parametrize("B,pt,btg,tune", [
    (3, 4, None, ()), (5, 8, None, ()),
    pytest.param(16, 4, None, (), marks=pytest.mark.slow),
    pytest.param(40, 4, 64, (), marks=pytest.mark.slow),
    pytest.param(40, 4, 64, ("wgmma_sk=all",), marks=pytest.mark.slow)])
def test_no_launch_reads_scratch_before_it_is_written(setup, B, pt, btg, tune):
    """Nothing read before it is written, for today's program on the CPU: the packed prefill
    chunks (prompts of 9, 1 and 5 tokens: slots idle and ending in different chunks, buckets
    wider than the rows) and the decode steps give the reference's logits and final state with
    every scratch buffer poisoned before each phase; slow: 64-row tiles in tile order (XT), and
    every tile-order GEMV on wgmma_sk_q4 with its partials."""
    cfg, t, ref = setup
    man = emit_program(cfg, Lanes.make(B, btg=btg, pt=pt,
                                       tuning=Tuning.parse(list(tune)))).manifest
    _check_against_reference(cfg, t, ref, man, B, pt, btg, emu_cls=PoisonedEmu)
    emu = PoisonedEmu.instances[-1]
    # the poison was there to be read: every phase left unwritten scratch (rows past the
    # chunk's, the unused splits), none of which reached a logit or the state
    assert len(emu.unwritten) >= 4 and min(emu.unwritten) > 0


def _check_against_reference(cfg, t, ref, man, B, pt, btg, emu_cls=Emu):
    dec = man["schedule"]["decode"]
    if B in (1, 16):
        assert any(L.get("epi") == 2 for L in dec)
    if btg == 64:   # the down projection reads SwiGLU's output in tile order
        assert any(L.get("tiles") == 8 and L["role"] == "down" for L in dec)
        assert any((_family(man, L) == "swiglu" and man["kernels"][L["k"]]["tiles"] == 8)
                   or (_family(man, L) == "wgmma_sk_q4" and L["epi"] == 2) for L in dec)
    emu = emu_cls(man, cfg, t, tmax=64)
    rng = np.random.default_rng(B * 100 + pt)
    prompts = [list(map(int, rng.integers(0, cfg.vocab_size, (9, 1, 5)[b % 3])))
               for b in range(B)]
    st = ref.new_state(B)
    ref_lg, _ = ref.prefill(st, prompts)
    lg_emu = [None] * B
    for c in range(max(-(-len(p) // pt) for p in prompts)):
        emu.run(put_chunk(emu.put, man["schedule"], [p[c * pt:(c + 1) * pt] for p in prompts]))
        logits = emu.view(["buf", "logits", 0, 0], (B, cfg.vocab_size))
        for b, p in enumerate(prompts):
            if -(-len(p) // pt) == c + 1:
                lg_emu[b] = logits[b].copy()
    for b in range(B):
        assert np.abs(lg_emu[b] - ref_lg[b][-1]).max() < TOL, f"prefill, sequence {b}"
    assert list(emu.buf["pos"][:B]) == [len(p) for p in prompts]
    nxt = [int(np.argmax(l)) for l in lg_emu]
    for step in range(3):
        emu.buf["tokens"][:B], emu.buf["ntok"][:] = nxt, 1
        emu.run("decode")
        got = emu.view(["buf", "logits", 0, 0], (B, cfg.vocab_size))
        want, _ = ref.decode(st, nxt)
        assert np.abs(got - want).max() < TOL, f"decode step {step}"
        nxt = [int(i) for i in np.argmax(want, axis=-1)]
    # The final state, as `check` compares it on the GPU: recurrent state, conv ring, K, V.
    assert_final_state(cfg, emu, st, B, TOL)


@pytest.mark.parametrize("B", [pytest.param(16, marks=pytest.mark.slow),
                               pytest.param(9, marks=pytest.mark.slow), 1, 3])
def test_schedule_with_sk16_matches_reference(setup, B):
    """Tuning ROLE.sk16 / ROLE.sk8 (version 22) over every role: at 16- and 8-row tiles each
    GEMV is a wgmma_sk_q4 launch (store, residual add, and SwiGLU into the down projection's
    tile order) reading its input in the tile order the norm writes; partial tiles at B = 9, 3
    and one row."""
    cfg, t, ref = setup
    every = Tuning.parse([f"{r}.{f}=3:6:1" for r in ROLES for f in ("sk16", "sk8")])
    man = emit_program(cfg, Lanes.make(B, pt=4, tuning=every)).manifest
    nt = 2 if B > 8 else 1
    gemvs = [L for L in man["schedule"]["decode"] if "role" in L]
    assert gemvs and all(_family(man, L) == "wgmma_sk_q4" and L["tiles"] == nt for L in gemvs)
    assert {tuple(man["kernels"][L["k"]]["config"][x] for x in ("nt", "cw", "xs", "pp"))
            for L in gemvs} == {(nt, 3, 6, 1)}
    assert {L["epi"] for L in gemvs} == {0, 1, 2}
    _check_against_reference(cfg, t, ref, man, B, 4, None)
