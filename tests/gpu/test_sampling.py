"""kernels/sampling.cuh on the GPU against its numpy twin (qwen38gen/sampling.py), exactly: fresh
random bf16 logits (ties at the top, ±0 planted) at the tiny and the 27B vocabulary, every kind
of row in one launch (greedy, temperature only, top_k, top_p, min_p, all of them), outputs
poisoned with 0x7f bytes. Repeated launches give the same tokens (integer sums: no atomics order
shows). Both forms of the histogram sums (SPLIT 0: 64-bit shared atomics, the default; 1:
32-bit ones with a carry, Tuning.sample_split)."""

from __future__ import annotations

import numpy as np
import pytest

from qwen38gen import sampling as S
from tests.gpu.harness import BF16, build, poisoned, to_gpu
from tests.test_sampling_kernel import PARAMS as KERNEL_PARAMS

VOCAB = [1024, 248320]
# test_sampling_kernel's cases (every rule of the twin), and a temperature below the epsilon
PARAMS = KERNEL_PARAMS + [S.SamplingParams(temperature=1e-6, top_k=3, seed=7)]
_MOD: dict = {}


def _kernels() -> dict:
    """Both sampler forms (SPEC 0: a token per row; SPEC 1: each verify row judged) at each
    vocabulary and sum form, from one module: (kind, V, SPLIT) -> function."""
    if not _MOD:
        src = ['#include "sampling.cuh"']
        args = "const q38::bf16* l, const float* fpar, const uint32_t* upar, const int* ctr, int* tok"
        for n in VOCAB:
            for sp in (0, 1):
                src.append(f'extern "C" __global__ void __launch_bounds__(q38::SampleLaunch<{n}>::threads)\n'
                           f"q38_sample_v{n}_{sp}({args}) "
                           f"{{ q38::sample_rows<{n}, {sp}>(l, fpar, upar, ctr, tok); }}")
                src.append(f'extern "C" __global__ void __launch_bounds__(q38::SampleLaunch<{n}>::threads)\n'
                           f"q38_spec_v{n}_{sp}({args}, const int* vtok, int kp, int* acc) "
                           f"{{ q38::sample_rows<{n}, {sp}, 1>(l, fpar, upar, ctr, tok, vtok, kp, acc); }}")
        mod = build("\n".join(src) + "\n")
        for n in VOCAB:
            for sp in (0, 1):
                for kind in ("sample", "spec"):
                    _MOD[kind, n, sp] = mod.get_function(f"q38_{kind}_v{n}_{sp}")
    return _MOD


def _fn(v: int, split: int = 0):
    return _kernels()["sample", v, split]


def _gpu_sample(logits: np.ndarray, params, positions, split: int = 0) -> np.ndarray:
    R, V = logits.shape
    fpar, upar, ctr = S.pack_params(params, positions)
    l_d = to_gpu(logits.view(np.uint16))
    f_d, u_d, c_d = to_gpu(fpar), to_gpu(upar), to_gpu(ctr)
    tok = poisoned((R,), np.int32)
    _fn(V, split)(l_d.gpudata, f_d.gpudata, u_d.gpudata, c_d.gpudata, tok.gpudata,
           block=(1024, 1, 1), grid=(R, 1))
    return tok.get()


@pytest.mark.parametrize("split", [0, 1])
@pytest.mark.parametrize("V", VOCAB)
@pytest.mark.parametrize("scale", [0.5, 3.0, 12.0])
def test_sampler_is_the_twin(cuda_ctx, V, scale, split):
    rng = np.random.default_rng(int(V * scale))
    reps = 3
    rows = np.concatenate([rng.standard_normal((reps, V)) * scale] * len(PARAMS)).astype(np.float32)
    rows[:, 4:12] = rows.max(axis=1, keepdims=True)          # eight maxima per row
    rows[:, :4] = [0.0, -0.0, -0.0, 0.0]
    logits = rows.astype(BF16)
    params = [p for p in PARAMS for _ in range(reps)]
    positions = [int(n) for n in rng.integers(0, 1 << 20, len(params))]
    got = _gpu_sample(logits, params, positions, split)
    want = [S.sample(logits[i].astype(np.float32), p, n) for i, (p, n) in enumerate(zip(params, positions))]
    assert got.tolist() == want
    assert _gpu_sample(logits, params, positions, split).tolist() == want


def test_draws_follow_the_softmax(cuda_ctx):
    """2048 rows of one 1024-wide row at T = 1, positions 0..2047: the GPU's draws, which equal
    the twin's, land on the top-8 tokens within 5 standard errors of the softmax."""
    rng = np.random.default_rng(9)
    x = (rng.standard_normal(1024) * 3).astype(BF16)
    p = S.SamplingParams(temperature=1.0, seed=123)
    n = 2048
    got = _gpu_sample(np.repeat(x[None], n, axis=0), [p] * n, list(range(n)))
    assert got.tolist() == [S.sample(x.astype(np.float32), p, i) for i in range(n)]
    z = x.astype(np.float64)
    prob = np.exp(z - z.max())
    prob /= prob.sum()
    top = np.argsort(-prob)[:8]
    freq = np.array([(got == t).mean() for t in top])
    assert np.all(np.abs(freq - prob[top]) < 5 * np.sqrt(prob[top] * (1 - prob[top]) / n) + 1e-3)


def _spec_fn(v: int, split: int):
    return _kernels()["spec", v, split]


@pytest.mark.parametrize("split", [0, 1])
@pytest.mark.parametrize("V", VOCAB)
def test_speculative_rows_are_the_twin(cuda_ctx, V, split):
    """sample_rows with SPEC = 1 (Tuning.spec_sample) over a verify pass's rows, KP = 3: for
    every sampled slot, each draft row's judgement (acc) and, where rejected, its residual draw,
    and the last row's draw, equal spec_sampling's integer rule (judge_draft, draw_weighted);
    greedy slots' rows stay poisoned. Drafts are the row's own argmax (mostly kept), a token
    outside the nucleus (never kept) and random ones."""
    from qwen38gen.spec_sampling import draw_weighted, judge_draft, keyed_u64, target_weights

    rng = np.random.default_rng(V + split)
    kp = 3
    params = PARAMS
    B = len(params)
    logits = (rng.standard_normal((B * kp, V)) * 3).astype(np.float32).astype(BF16)
    x = logits.astype(np.float32)
    vtok = rng.integers(0, V, B * kp).astype(np.int32)
    for b in range(B):
        vtok[b * kp + 1] = int(np.argmax(x[b * kp]))          # d_1: row 0's argmax
        vtok[b * kp + 2] = int(np.argmin(x[b * kp + 1]))      # d_2: row 1's smallest logit
    pos = rng.integers(0, 1 << 20, B).astype(np.int32)
    fpar, upar, _ = S.pack_params(params, [0] * B)
    tok, acc = poisoned((B * kp,), np.int32), poisoned((B * kp,), np.int32)
    _spec_fn(V, split)(to_gpu(logits.view(np.uint16)).gpudata, to_gpu(fpar).gpudata,
                       to_gpu(upar).gpudata, to_gpu(pos).gpudata, tok.gpudata,
                       to_gpu(vtok).gpudata, np.int32(kp), acc.gpudata,
                       block=(1024, 1, 1), grid=(B * kp, 1))
    t, a = tok.get(), acc.get()
    poison = 0x7F7F7F7F
    kept = 0
    for b, p in enumerate(params):
        for j in range(kp):
            r = b * kp + j
            if p.greedy:
                assert t[r] == poison and a[r] == poison, (b, j)
                continue
            w = target_weights(x[r], p)
            position = int(pos[b]) + 1 + j
            if j < kp - 1:
                ok, res = judge_draft(w, int(vtok[r + 1]), p.seed, position)
                assert a[r] == int(ok), (b, j)
                kept += ok
                if not ok:
                    assert t[r] == res, (b, j)
            else:
                assert t[r] == draw_weighted(w, keyed_u64(p.seed, position, 0)), (b, j)
    assert kept > 0
