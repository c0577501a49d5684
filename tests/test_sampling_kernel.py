"""kernels/sampling.cuh without a GPU: it compiles through the gate (no spills, no stack, its
registers fit 1024 threads), its float32 constants are the twin's, and its algorithm (16-bit keys,
radix selects over counts and integer weight sums, the warp-sliced draw), replayed here in
numpy step by step, picks the twin's token on bf16 rows. tests/gpu/test_sampling.py runs the
kernel itself."""

from __future__ import annotations

import re
import shutil

import ml_dtypes
import numpy as np
import pytest

from qwen38gen import sampling as S
from qwen38gen.resources import kernels_dir

BF16 = np.dtype(ml_dtypes.bfloat16)
SRC = (kernels_dir() / "sampling.cuh").read_text()


def entry(v: int) -> str:
    """The test entry point of the sampler over a vocabulary of v (docs/KERNELS.md)."""
    return (f'extern "C" __global__ void __launch_bounds__(q38::SampleLaunch<{v}>::threads)\n'
            f"q38_sample_v{v}(const q38::bf16* l, const float* fpar, const uint32_t* upar, "
            f"const int* ctr, int* tok) {{ q38::sample_rows<{v}>(l, fpar, upar, ctr, tok); }}\n")


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
def test_compiles_through_the_gate(tmp_path, monkeypatch):
    from qwen38gen import gate as G

    monkeypatch.setenv("QWEN38_CACHE", str(tmp_path / "cache"))
    src = '#include "sampling.cuh"\n' + entry(1024) + entry(248320)
    _assert_clean(G.compile_source(src, "sampling.cu", include_dirs=(str(kernels_dir()),)),
                  ["q38_sample_v1024", "q38_sample_v248320"])


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
def test_speculative_form_compiles_through_the_gate(tmp_path, monkeypatch):
    """sample_rows with SPEC = 1 (Tuning.spec_sample, both sum forms) compiles through the gate
    without stack or spills (tests/gpu/test_sampling.py runs it against the twin)."""
    from qwen38gen import gate as G

    monkeypatch.setenv("QWEN38_CACHE", str(tmp_path / "cache"))
    src = '#include "sampling.cuh"\n' + "".join(
        f'extern "C" __global__ void __launch_bounds__(1024) q38_spec_{sp}(const q38::bf16* l, '
        f"const float* fpar, const uint32_t* upar, const int* ctr, int* tok, const int* vtok, "
        f"int kp, int* acc) {{ q38::sample_rows<248320, {sp}, 1>(l, fpar, upar, ctr, tok, vtok, "
        f"kp, acc); }}\n" for sp in (0, 1))
    _assert_clean(G.compile_source(src, "spec_sampling.cu", include_dirs=(str(kernels_dir()),)),
                  ["q38_spec_0", "q38_spec_1"])


def _assert_clean(res, names):
    """The gate's result has exactly these kernels, no problem at 1 024 threads, no stack and
    no spills."""
    assert sorted(k.name for k in res.kernels) == names
    for k in res.kernels:
        k.threads = 1024
    assert res.problems == []
    assert all(k.stack == 0 and k.spill_stores == 0 for k in res.kernels)


def test_constants_are_the_twins():
    body = SRC[SRC.index("float exp2q(float t)"):]
    lits = re.findall(r"(0x[0-9a-f.]+p[-+]?\d+)f", body[:body.index("bf16_key")])
    assert [np.float32(float.fromhex(h)) for h in lits[::-1]] == list(S.EXP2_COEFFS)
    assert "__fmul_rn(d, 0x1.715476p+0f)" in SRC and S.LOG2E == np.float32(float.fromhex("0x1.715476p+0"))
    assert "1e-5f" in SRC and S.GREEDY_EPS == np.float32(1e-5)


# ------------------------------------------------------------------- the kernel's algorithm
def keys(bits: np.ndarray) -> np.ndarray:
    b = np.where(bits == 0x8000, 0, bits).astype(np.uint32)
    return np.where(b & 0x8000, ~b & 0xFFFF, b | 0x8000).astype(np.uint32)


def suffix_select(hist: np.ndarray, need: int) -> tuple[int, int]:
    """Largest bin b with Σ_{b' ≥ b} hist ≥ need, and the sum above it."""
    tail = 0
    for b in range(255, -1, -1):
        if tail + int(hist[b]) >= need:
            return b, tail
        tail += int(hist[b])
    raise AssertionError("need exceeds the total")


def kernel_like(row_bf16: np.ndarray, p: S.SamplingParams, pos: int) -> int:
    """sample_rows<V> step by step on one row (the block's reductions as plain sums)."""
    bits = row_bf16.view(np.uint16).astype(np.uint32)
    x = row_bf16.astype(np.float32)
    V = x.size
    if not np.float32(p.temperature) >= np.float32(1e-5):
        return int(np.argmax(x))
    k = keys(bits)
    kk = kp = 0
    if 1 <= p.top_k < V:
        b1, above = suffix_select(np.bincount(k >> 8, minlength=256), p.top_k)
        l, _ = suffix_select(np.bincount(k[(k >> 8) == b1] & 255, minlength=256), p.top_k - above)
        kk = (b1 << 8) | l
    e, w0 = S.weights(x, p.temperature)

    def weight():
        return np.where((e >= np.float32(p.min_p)) & (k >= kk) & (k >= kp), w0, np.uint64(0))

    w = weight()
    h1 = np.bincount(k >> 8, weights=w.astype(np.float64), minlength=256)   # < 2^53: exact
    total = int(h1.sum())
    q24 = min(p.top_p_q24, 1 << 24)
    if q24 < 1 << 24:
        need = -(-(q24 * total) // (1 << 24))
        b1, above = suffix_select(h1, need)
        sel = (k >> 8) == b1
        h2 = np.bincount(k[sel] & 255, weights=w[sel].astype(np.float64), minlength=256)
        l, above2 = suffix_select(h2, need - above)
        kp = (b1 << 8) | l
        total = above + above2 + int(h2[l])
        w = weight()
        assert int(w.sum()) == total
    u = S.draw_u64(p.seed, pos)
    target = (u * total) >> 64
    nv = V // 8
    nvw = -(-nv // 32)
    slices = [w[8 * s * nvw: 8 * min((s + 1) * nvw, nv)] for s in range(32)]
    sums = np.cumsum([int(s.sum()) for s in slices])
    tw = int(np.searchsorted(sums, target, side="right"))
    target -= int(sums[tw]) - int(slices[tw].sum())
    run = np.cumsum(slices[tw], dtype=np.uint64)
    return 8 * tw * nvw + int(np.searchsorted(run, np.uint64(target), side="right"))


PARAMS = [
    S.SamplingParams(),
    S.SamplingParams(temperature=0.8, seed=1),
    S.SamplingParams(temperature=1.0, top_k=1, seed=2),
    S.SamplingParams(temperature=1.3, top_k=40, seed=3),
    S.SamplingParams(temperature=0.7, top_p=0.9, seed=4),
    S.SamplingParams(temperature=2.0, top_p=0.3, top_k=100, min_p=0.05, seed=5),
    S.SamplingParams(temperature=0.5, min_p=0.2, seed=2**63 + 7),
    S.SamplingParams(temperature=5.0, top_p=1e-9, seed=6),
]


@pytest.mark.parametrize("V", [1024, 248320])
def test_kernel_algorithm_is_the_twin(V):
    rng = np.random.default_rng(V)
    rows = 2 if V > 4096 else 6
    for r in range(rows):
        x = (rng.standard_normal(V) * (1 + 2 * r)).astype(BF16)   # bf16: many equal values
        x[rng.integers(0, V, 8)] = x.astype(np.float32).max()     # ties at the top
        x[:4] = np.array([0.0, -0.0, -0.0, 0.0], np.float32).astype(BF16)
        for i, p in enumerate(PARAMS):
            pos = 100 * r + i
            assert kernel_like(x, p, pos) == S.sample(x.astype(np.float32), p, pos), (r, p)


def test_split_sums_are_exact_in_any_order():
    """add_u64_split's rule (sampling.cuh, SPLIT = 1): each amount's low word added to lo, a carry
    into hi by the add that wrapped lo, plus its high word: hi·2^32 + lo is the exact sum for any
    order of the adds (amounts up to 2^32, as floor(e · 2^32) with e <= 1 is)."""
    rng = np.random.default_rng(3)
    for n in (1, 7, 1000, 5000):
        a = rng.integers(0, 2**32 + 1, n, dtype=np.uint64)
        a[rng.random(n) < 0.1] = 2**32                      # the largest amount
        for _ in range(3):
            lo = hi = 0
            for x in rng.permutation(a).tolist():
                al, c = x & 0xFFFFFFFF, x >> 32
                if al:
                    old, lo = lo, (lo + al) & 0xFFFFFFFF
                    c += 1 if lo < old else 0
                hi += c
            assert (hi << 32) + lo == int(a.sum(dtype=object))


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
def test_split_form_has_no_64_bit_shared_atomics(tmp_path):
    """SPLIT = 1 sums with 32-bit shared atomics only; SPLIT = 0 (the default) with 64-bit ones."""
    import subprocess

    for split, want64 in ((0, True), (1, False)):
        cu = tmp_path / f"s{split}.cu"
        cu.write_text('#include "sampling.cuh"\n'
                      'extern "C" __global__ void __launch_bounds__(1024) k(const q38::bf16* l, '
                      'const float* f, const uint32_t* u, const int* c, int* t) '
                      f'{{ q38::sample_rows<248320, {split}>(l, f, u, c, t); }}\n')
        ptx = tmp_path / f"s{split}.ptx"
        subprocess.run(["nvcc", "-arch=sm_90", "-std=c++17", "-ptx", "-I", str(kernels_dir()),
                        "-o", str(ptx), str(cu)], check=True)
        atoms = set(re.findall(r"atom\.shared\.add\.(u\d+)", ptx.read_text()))
        assert "u64" in atoms if want64 else atoms == {"u32"}, (split, atoms)
