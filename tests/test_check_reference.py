"""`check --reference`'s comparison (qwen38gen.verify.check.compare_with_reference) on the CPU, with fake
program outputs made from the numpy reference itself (the toy model): exact copies pass; a top-k
logit off by more than the tolerance, a wrong argmax at a wide margin, a slot whose stream differs
from the first slot of its prompt, a perturbed final state or a wrong position fail their row.
The GPU half (the program's runs) runs on the device (scripts/device.sh VERIFY=rest)."""

from __future__ import annotations

import copy
import subprocess
import sys

import numpy as np
import pytest

from qwen38gen.config import PRESETS
from qwen38gen.reference import Reference, conv_to_ring
from qwen38gen.verify import golden as G
from qwen38gen.verify.check import compare_with_reference, reference_prompts
from qwen38gen.weights import synthetic_weights

CFG = PRESETS["toy"]


def _have_gpu() -> bool:
    from qwen38gen.errors import UserError
    from qwen38gen.runtime import cuda_driver

    try:
        cuda_driver()
        return True
    except UserError:
        return False
STEPS, TOPK, T = 6, 8, 48


def conv_to_ring_state(cfg, sts, tmax):
    """One-sequence reference States -> the program's state buffers for a batch of len(sts):
    rec [layers, B, Hv, dk, dv], conv rings [layers, B, K-1, C], kc/vc [layers, B, Hkv, T, D]."""
    B, pos = len(sts), np.array([int(st.pos[0]) for st in sts])
    gdn, attn = cfg.linear_layers, cfg.full_layers
    bufs = {"pos": pos,
            "rec": np.stack([np.stack([st.rec[L][0] for st in sts]) for L in gdn]),
            "conv": np.stack([np.stack([conv_to_ring(st.conv[L][0], p) for st, p in zip(sts, pos)])
                              for L in gdn])}
    for name, attr in (("kc", "k"), ("vc", "v")):
        a = np.full((len(attn), B, cfg.num_key_value_heads, tmax, cfg.head_dim), np.nan, np.float32)
        for j, L in enumerate(attn):
            for b, st in enumerate(sts):
                a[j, b, :, :pos[b]] = getattr(st, attr)[L][0]
        bufs[name] = a
    return bufs


@pytest.fixture(scope="module")
def fake():
    """Prompts, the reference's greedy runs as a program would report them (top-8 logits rounded
    to bf16), the final-state buffers in the program's layout, and the teacher-forced refs."""
    import ml_dtypes

    ref = Reference(CFG, synthetic_weights(CFG, 0))
    prompts = reference_prompts(CFG)
    tokens = ref.generate(prompts, STEPS)
    refs = [G.reference_logits(ref, p, t) for p, t in zip(prompts, tokens)]
    got = []
    for t, (lg, _) in zip(tokens, refs):
        top = []
        for row in lg:
            ids = np.argsort(-row, kind="stable")[:TOPK]
            vals = row[ids].astype(ml_dtypes.bfloat16).astype(np.float32)
            top.append([[int(i), float(v)] for i, v in zip(ids, vals)])
        got.append({"tokens": list(t), "topk": top})
    states = [conv_to_ring_state(CFG, [st for _, st in refs], T)]
    return prompts, got, states, refs


def _run(fake, got=None, states=None):
    prompts, g0, s0, refs = fake
    return compare_with_reference(CFG, prompts, got or g0, states or s0, len(prompts), refs)


def test_exact_copies_pass(fake):
    res = _run(fake)
    assert res.ok
    assert [r[-1] for r in res.rows] == ["ok"] * 4
    assert [r[3] for r in res.rows] == ["yes"] * 4
    assert all(float(r[5]) <= 0.01 for r in res.rows)
    assert [r[4] for r in res.rows] == [f"{np.std(lg):.2f}" for lg, _ in fake[3]]
    tol = G.tol_logits("reference", CFG.num_hidden_layers)
    assert f"|Δlogit| ≤ {tol:.3f} σ" in res.notes[0] and "toy" in res.notes[0]


@pytest.mark.parametrize("off, verdict", [(1.25, "MISMATCH"), (0.75, "ok")])
def test_a_logit_over_the_tolerance_in_sigmas_fails_its_row(fake, off, verdict):
    got = copy.deepcopy(fake[1])
    off *= G.tol_logits("reference", CFG.num_hidden_layers)   # in units of the tolerance
    sigma = float(np.std(fake[3][2][0][3]))                  # σ of the reference row
    got[2]["topk"][3][1][1] += off * sigma
    res = _run(fake, got=got)
    assert res.ok == (verdict == "ok")
    assert [r[-1] for r in res.rows] == ["ok", "ok", verdict, "ok"]
    assert off - 0.01 <= float(res.rows[2][5]) <= off + 0.01


def test_a_wrong_argmax_at_a_wide_margin_fails(fake):
    prompts, g0, _, refs = fake
    got = copy.deepcopy(g0)
    lg = refs[1][0]
    margin = G.argmax_margin("reference", CFG.num_hidden_layers)
    wide = [np.diff(np.sort(row)[-2:])[0] > margin * np.std(row) for row in lg]
    s = wide.index(True)
    got[1]["tokens"][s] = int(np.argsort(lg[s])[-2])
    res = _run(fake, got=got)
    assert [r[-1] for r in res.rows] == ["ok", "MISMATCH", "ok", "ok"]
    checked = int(res.rows[1][6].split("/")[1])
    assert res.rows[1][6] == f"{checked - 1}/{checked}"


def test_a_slot_unlike_the_first_slot_of_its_prompt_fails(fake):
    """Batch 8 over 4 prompts: slot 5 repeats prompt 1; its stream must equal slot 1's."""
    prompts, g0, s0, refs = fake
    got = [copy.deepcopy(r) for r in g0 + g0]   # no aliasing between the two copies
    states = [conv_to_ring_state(CFG, [st for _, st in refs] * 2, T)]
    got[5]["topk"][0][0][1] = float(np.nextafter(np.float32(got[5]["topk"][0][0][1]), 9))
    res = compare_with_reference(CFG, prompts, got, states, 8, refs)
    assert [r[3] for r in res.rows] == ["yes"] * 5 + ["no"] + ["yes"] * 2
    assert [r[-1] == "ok" for r in res.rows] == [True] * 5 + [False] + [True] * 2


def test_a_perturbed_state_or_a_wrong_position_fails(fake):
    prompts, g0, s0, refs = fake
    st = copy.deepcopy(s0)
    st[0]["rec"][0, 3] *= 1.2
    st[0]["pos"][0] += 1
    res = _run(fake, states=st)
    assert [r[-1] for r in res.rows] == ["MISMATCH", "ok", "ok", "MISMATCH"]
    assert float(res.rows[3][7]) > 1.0   # the worst state error over its tolerance


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "cli", *args], capture_output=True, text=True,
                          timeout=300)


@pytest.mark.skipif(_have_gpu(), reason="a GPU answers here: the device run covers this")
def test_cli_reference_without_a_gpu_says_nothing_was_compared():
    r = _cli("check", "--reference", "qwen3.5-0.8b", "--batch", "3")
    assert r.returncode == 3, r.stderr   # neither pass (0) nor fail (1): nothing ran
    assert "GPU part NOT run" in r.stdout and "Nothing was compared" in r.stdout


@pytest.mark.parametrize("args, msg", [
    (["--reference", "toy"], "error: model 'toy': linear_key_head_dim=16 is not supported by "
                             "the kernels; supported linear_key_head_dim: 128"),
    (["--reference", "tiny", "--mtp", "1"], "error: check --reference runs the plain decode "
                                            "program; drop --mtp"),
    (["--reference", "nope"], "error: unknown model 'nope': not a preset and no such file"),
])
def test_cli_reference_bad_input(args, msg):
    r = _cli("check", *args)
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith(msg) and r.stderr.count("\n") == 1 and not r.stdout


@pytest.mark.slow
def test_check_reference_wiring_with_a_perfect_fake_program(monkeypatch):
    """check_reference end to end on the tiny model with run_batches replaced by the reference on
    the same int4 weights (what a correct program computes, up to bf16): the program gets the
    quantized tensors, prompts cycle over a batch of 6, and every slot passes."""
    import ml_dtypes

    from qwen38gen.verify import check as C
    from qwen38gen.lanes import Lanes
    from qwen38gen.quantize import QuantizedTensor, dequantized_weights

    cfg, steps = PRESETS["tiny"], 3
    seen = {}

    def fake_run_batches(cfg_, lanes, tensors, prompts, steps_, tmax, keep_state=False, **kw):
        down = tensors["model.language_model.layers.0.mlp.down_proj.weight"]
        seen.update(n=len(prompts), tmax=tmax, steps=steps_,
                    quantized=isinstance(down, QuantizedTensor))
        ref = Reference(cfg_, dequantized_weights(tensors))
        got, sts = [], []
        for p in prompts:
            (toks,) = ref.generate([p], steps_)
            lg, st = G.reference_logits(ref, p, toks)
            top = [[[int(i), float(np.float32(row[i]).astype(ml_dtypes.bfloat16))]
                    for i in np.argsort(-row, kind="stable")[:8]] for row in lg]
            got.append({"tokens": toks, "topk": top})
            sts.append(st)
        return got, [conv_to_ring_state(cfg_, sts, tmax)]

    monkeypatch.setattr(C, "run_batches", fake_run_batches)
    res = C.check_reference(cfg, Lanes.make(6, pt=16), steps=steps)
    assert seen == {"n": 6, "tmax": 33 + steps, "steps": steps, "quantized": True}
    assert res.ok, res.rows
    assert [r[1] for r in res.rows] == ["0", "1", "2", "3", "0", "1"]
    assert [r[2] for r in res.rows] == ["1", "7", "16", "33", "1", "7"]
