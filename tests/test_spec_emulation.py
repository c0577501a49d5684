"""The mtp lane's schedules (prefill + MTP rows, verify + accept + MTP rows + drafts), executed in
numpy by qwen38gen/emu/schedule.py and driven by the same loop as on the GPU (qwen38gen.verify.spec_runtime),
give exactly the greedy token streams of the numpy reference (``Reference.generate``).

Checked at K = 1 and 2 drafts, B = 3 prompts of 1, 5 and 20 tokens with pt = 16 (the 20-token
prompt spans two chunks, the others idle in the second): with the device's own drafts (compared
draft for draft with speculative.py's numpy MTP drafter), with drafts forced right (acceptance
1 except on a sequence's last pass, so the multi-token accept path and the GDN state-slot
rollback run), and half forced (right and wrong alternating: partial acceptance). The MTP row
itself (fc over [RMS1p(e); RMS1p(h)], its attention layer and cache, mtp.norm, lm_head) is
compared logit for logit with Reference.mtp_forward.
"""

import numpy as np
import pytest

from qwen38gen.config import PRESETS
from qwen38gen.emit import emit_program
from qwen38gen.lanes import Lanes
from qwen38gen.quantize import int4_weights
from qwen38gen.reference import Reference
from qwen38gen.speculative import speculative_generate
from qwen38gen.verify.spec_runtime import speculative_run, tmax_needed
from qwen38gen.weights import default_tensors
from tests._blas_threads import single_threaded  # noqa: F401  (autouse: 1 BLAS thread)
from qwen38gen.emu.schedule import Emu

TOL = 1e-9  # fp64 on both sides on the same dequantized weights; only summation order differs
PT = 16
STEPS = 7
LENGTHS = (1, 5, 20)


@pytest.fixture(scope="module")
def setup():
    cfg = PRESETS["tiny"]
    t = default_tensors(cfg, mtp=True)
    ref = Reference(cfg, int4_weights(cfg, t), dtype=np.float64)
    rng = np.random.default_rng(77)
    prompts = [list(map(int, rng.integers(0, cfg.vocab_size, n))) for n in LENGTHS]
    return cfg, t, ref, prompts, ref.generate(prompts, STEPS)


def emu_for(cfg, t, k, prompts, B=None, steps=STEPS, tuning=None):
    man = emit_program(cfg, Lanes.make(B or len(prompts), pt=PT, mtp=k,
                                       **({"tuning": tuning} if tuning else {}))).manifest
    return man, Emu(man, cfg, t, tmax=tmax_needed(prompts, steps, k))


def test_mtp_program_wiring():
    """The mtp program has the verify schedule and the state-slot / ring-by-position buffers."""
    cfg = PRESETS["tiny"]
    man = emit_program(cfg, Lanes.make(2, pt=PT, mtp=2)).manifest
    b = man["buffers"]
    assert b["rec"]["shape"][2] == 3 and b["conv"]["shape"][2] == cfg.linear_conv_kernel_dim - 1 + 2
    assert man["schedule"]["verify_rows"] == 3 and "verify" in man["schedule"]
    assert any(k.startswith("q38_gdn_pt3_rs5_s3_e1") for k in man["kernels"])
    assert man["weights"]["M.fc"]["k"] == 2 * cfg.hidden_size


@pytest.mark.parametrize("k", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_spec_natural_drafts(setup, k):
    cfg, t, ref, prompts, want = setup
    man, emu = emu_for(cfg, t, k, prompts)
    got, stats, drafts = speculative_run(emu, man, prompts, STEPS, record=True)
    assert got == want
    # the numpy MTP drafter proposes the same drafts at the same positions
    ref_drafts = [[] for _ in prompts]

    def rec(b, position, d):
        ref_drafts[b].append((position, d))
        return d

    ref_tok, ref_stats = speculative_generate(ref, prompts, STEPS, k=k, draft_hook=rec)
    assert ref_tok == want
    assert drafts == ref_drafts
    assert stats.accepted == ref_stats.accepted and stats.verify_passes == ref_stats.verify_passes
    assert list(emu.get("pos")[:len(prompts)]) == [len(p) + sum(r) + len(r)
                                                   for p, r in zip(prompts, stats.runs)]


def forced_hook(prompts, want, right):
    def hook(b, position, d):
        i = position - len(prompts[b])           # index in the generated stream
        if not 0 <= i < len(want[b]):
            return d
        return want[b][i] if right(position) else (want[b][i] + 1) % 1024
    return hook


@pytest.mark.parametrize("k", [1, 2])
def test_spec_forced_right(setup, k):
    cfg, t, ref, prompts, want = setup
    man, emu = emu_for(cfg, t, k, prompts)
    got, stats, _ = speculative_run(emu, man, prompts, STEPS,
                                    draft_hook=forced_hook(prompts, want, lambda p: True))
    assert got == want
    for b, runs in enumerate(stats.runs):
        assert all(n == k for n in runs[:-1]), (b, runs)   # all accepted but maybe the last pass
        assert stats.verify_passes[b] <= -(-(STEPS - 1) // (k + 1)) + 1


@pytest.mark.parametrize("k", [1, 2])
def test_spec_half_forced(setup, k):
    cfg, t, ref, prompts, want = setup
    man, emu = emu_for(cfg, t, k, prompts)
    got, stats, _ = speculative_run(emu, man, prompts, STEPS,
                                    draft_hook=forced_hook(prompts, want, lambda p: p % 3 != 0))
    assert got == want
    assert any(0 < n for r in stats.runs for n in r) and any(n < k for r in stats.runs for n in r)


@pytest.mark.parametrize("vt", [32, 64])
def test_verify_pass_at_a_wider_tile_gives_the_same_bits(setup, vt):
    """Tuning.verify_btg: the verify pass and its MTP rows built at the B = 32 or 64 lane's GEMV
    kernels (wgmma_q4, wgmma_sk_q4, gemm_q4) give the lane-tile program's bits: the same tokens,
    accepted runs and drafts with half the drafts forced wrong, and the same last logits."""
    from qwen38gen.tuning import Tuning

    cfg, t, ref, prompts, want = setup
    hook = forced_hook(prompts, want, lambda p: p % 3 != 0)
    runs = []
    for tuning in (None, Tuning(verify_btg=vt)):
        man, emu = emu_for(cfg, t, 1, prompts, tuning=tuning)
        got, stats, drafts = speculative_run(emu, man, prompts, STEPS, draft_hook=hook,
                                             record=True)
        runs.append((got, stats.runs, drafts, emu.get("logits").copy(), man))
    (g0, r0, d0, l0, m0), (g1, r1, d1, l1, m1) = runs
    assert g1 == g0 == want and r1 == r0 and d1 == d0
    assert np.isfinite(np.asarray(l0, np.float32)).all()   # equal NaN bits would compare equal
    assert (l1.view(np.uint16) == l0.view(np.uint16)).all()
    fams = {m1["kernels"][L["k"]]["family"] for L in m1["schedule"]["verify"] if "weight" in L}
    assert {"wgmma_q4", "wgmma_sk_q4"} <= fams
    assert m1["schedule"]["decode"] == m0["schedule"]["decode"]


def test_mtp_row_logits(setup):
    """The emulated MTP row after a prefill chunk equals Reference.mtp_forward's last row."""
    cfg, t, ref, _, _ = setup
    rng = np.random.default_rng(5)
    prompts = [list(map(int, rng.integers(0, cfg.vocab_size, n))) for n in (3, 16)]
    man, emu = emu_for(cfg, t, 1, prompts, steps=1)
    speculative_run(emu, man, prompts, 1)
    st = ref.new_state(2)
    lg, hid = ref.prefill(st, prompts)
    nxt = [int(np.argmax(l[-1])) for l in lg]
    mlg, _ = ref.mtp_forward(st, [p[1:] + [x] for p, x in zip(prompts, nxt)], hid, [0, 0])
    got = emu.get("mlogits")
    for b in range(2):
        assert np.abs(got[b] - mlg[b][-1]).max() < TOL
    assert list(emu.get("vtok").reshape(2, 2)[:, 0]) == nxt
    assert list(emu.get("vtok").reshape(2, 2)[:, 1]) == [int(np.argmax(m[-1])) for m in mlg]
    # MTP cache: every prompt position written
    mk = emu.get("mkc")
    for b, p in enumerate(prompts):
        assert np.abs(mk[b][:, :len(p)] - st.mtp_k[b]).max() < TOL


MTP_SCRATCH = ("vnextval", "mcat", "mh", "mlogits", "dval")


@pytest.mark.parametrize("k", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_spec_reads_no_scratch_before_it_is_written(setup, k):
    """Nothing read before it is written, in the mtp program: every float scratch buffer (the
    plain program's and the MTP row's) NaN at the start of each phase (a phase run in two halves
    around the host's step is poisoned before its first half only: the second reads what the
    first wrote) still gives the reference's greedy streams with the device's own drafts."""
    from tests.test_schedule_emulation import SCRATCH

    class Poisoned(Emu):
        def run(self, phase, start=0, stop=None):
            if start == 0:
                for n in SCRATCH + MTP_SCRATCH:
                    if n in self.buf:
                        self.buf[n][:] = np.nan
            super().run(phase, start, stop)

    cfg, t, ref, prompts, want = setup
    man = emit_program(cfg, Lanes.make(len(prompts), pt=PT, mtp=k)).manifest
    assert set(MTP_SCRATCH) <= set(man["buffers"])
    emu = Poisoned(man, cfg, t, tmax=tmax_needed(prompts, STEPS, k))
    got, _, _ = speculative_run(emu, man, prompts, STEPS, record=True)
    assert got == want
