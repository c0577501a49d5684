"""The bf16 weight of docs/GEMV_MAINLOOP.md §2 "New" on the CPU: weights.dequantize_bf16 against an
integer formulation of round-to-nearest-even (ties, subnormal scales, every q), the twin
weights.gemv_cv_reference against gemv_reference within the weights' rounding, and the GPU test's
kernels (tests/gpu/test_gemv_cv.py) compiled by nvcc for sm_90a without spills or serialization."""

import shutil
from pathlib import Path

import numpy as np
import pytest

from qwen38gen import weights as wq
from qwen38gen.errors import UserError
from qwen38gen.weights import BF16


def _round_bf16_exact(q: np.ndarray, sbits: np.ndarray):
    """q · s rounded to bf16, nearest even, in integers: (value as float64, q < 0, a tie, rounded
    up). s is given by its bf16 bits (positive, finite): q · s = M · 2^E exactly, with E = -133
    for subnormal s. Independent of ml_dtypes and of float multiplication."""
    exp = (sbits >> 7).astype(np.int64)
    man = (sbits & 0x7F).astype(np.int64)
    M = q.astype(np.int64) * np.where(exp > 0, man + 128, man)
    E = np.where(exp > 0, exp - 134, -133)
    a = np.abs(M)
    lead = np.zeros_like(a)                      # bit length - 1 of |M| (|M| < 2^11)
    for b in range(1, 12):
        lead += (a >> b) > 0
    top = lead + E                               # exponent of the leading bit of |q · s|
    quantum = np.where(top >= -126, top - 7, -133)  # bf16: 8 significant bits, subnormals 2^-133
    shift = np.maximum(quantum - E, 0)
    quo = a >> shift
    rem = a - (quo << shift)
    half = np.where(shift > 0, 1 << np.maximum(shift - 1, 0), 0)
    up = (shift > 0) & ((rem > half) | ((rem == half) & ((quo & 1) == 1)))
    quo = quo + up
    val = np.sign(M) * np.ldexp(quo.astype(np.float64), (E + shift).astype(np.int64))
    tie = (shift > 0) & (rem == half)
    return val, q < 0, tie, up


def _one_scale_per_row(sbits: np.ndarray):
    """A weight of one row per scale and one group: row i holds every q of -8 ... 7 eight times
    under scale sbits[i]. Returns (qweight, scales, shape, q [N, 128])."""
    n = len(sbits)
    q = np.tile(np.repeat(np.arange(-8, 8, dtype=np.int8), 8), (n, 1))
    s = sbits.astype(np.uint16).view(BF16).reshape(n, 1)
    qw, st = wq.pack_int4(q, s)
    return qw, st, (n, 128), q


def test_dequantize_bf16_rounds_to_nearest_even():
    """Every positive finite bf16 scale up to 2^124 (8 · s stays finite), zero, and the
    subnormals, times every q: Ŵ equals the integer rounding, signs of zeros included; ties occur
    and round both ways; products of subnormal scales round."""
    sbits = np.arange(0, 0x7D80, dtype=np.int64)   # exponent field < 251: 2^124 · 1.99 at most
    qw, st, shape, q = _one_scale_per_row(sbits)
    got = wq.dequantize_bf16(qw, st, shape).astype(np.float64)
    want, neg, tie, up = _round_bf16_exact(q, np.repeat(sbits[:, None], 128, axis=1))
    assert np.array_equal(got, want)
    zero = want == 0
    assert np.array_equal(np.signbit(got[zero]), neg[zero]), "the sign of a zero product"
    assert (tie & up).sum() > 1000 and (tie & ~up).sum() > 1000, "ties rounding up and down"
    sub = np.repeat((sbits < 0x80)[:, None], 128, axis=1)   # subnormal scales
    exact_product = q * np.ldexp((sbits & 0x7F)[:, None].astype(np.float64), -133)
    assert (sub & (got != exact_product)).sum() > 1000, "products of subnormal scales round"
    exact = np.isin(np.abs(q), [0, 1, 2, 4, 8])
    w_til = wq.dequantize(qw, st, shape).astype(np.float64)
    assert np.array_equal(got[exact], w_til[exact]), "|q| in {0, 1, 2, 4, 8} is exact"
    assert not np.array_equal(got, w_til)
    # bf16's unit roundoff: less than 2^-8 of the weight (9 significant bits of q · s rounded to 8)
    normal = np.abs(w_til) >= 2.0 ** -126
    assert np.all(np.abs(got - w_til)[normal] < 2.0 ** -8 * np.abs(w_til)[normal])
    assert np.array_equal(got[~normal], w_til[~normal]), "products below 2^-126 are exact"


def test_known_ties():
    """Two ties worked by hand: 3 · (1 + 2^-7) = 1.10000011b · 2 rounds up to 1.1000010b · 2
    (3.03125); 3 · (1 + 3 · 2^-7) = 1.10001001b · 2 rounds down to 1.1000100b · 2 (3.0625)."""
    qw, st, shape, q = _one_scale_per_row(np.array([0x3F81, 0x3F83]))
    got = wq.dequantize_bf16(qw, st, shape)
    col = int(np.flatnonzero(q[0] == 3)[0])
    assert got[0, col] == 3.03125 and got[1, col] == 3.0625


@pytest.mark.parametrize("N,K", [(40, 1024), (4100, 256), (96, 2176)])
def test_gemv_cv_reference_within_weight_rounding(N, K):
    """The twin differs from gemv_reference (W~, fp64) by no more than the weights' rounding,
    2^-8 · Σ|x||W~| per output, and does differ; its parts (KS(K) or 1) change only fp64 sums;
    it is x @ Ŵ.T (4100 rows: more than one of the packer's row blocks; K = 2176: uneven parts)."""
    rng = np.random.default_rng([N, K])
    w = (rng.standard_normal((N, K)) / np.sqrt(K)).astype(np.float32)
    qw, st = wq.quantize_pack(w)
    x = rng.standard_normal((5, K)).astype(np.float32).astype(BF16).astype(np.float64)
    ks = min(8, K // 128)
    cv = wq.gemv_cv_reference(qw, st, (N, K), x, ks)
    ref = wq.gemv_reference(qw, st, (N, K), x)
    w_til = wq.dequantize(qw, st, (N, K)).astype(np.float64)
    bound = 2.0 ** -8 * (np.abs(x) @ np.abs(w_til).T)
    assert np.all(np.abs(cv - ref) <= bound * (1 + 1e-9) + 1e-300)
    assert np.abs(cv - ref).max() > 1e-6 * np.abs(ref).max(), "the rounding shows"
    one = wq.gemv_cv_reference(qw, st, (N, K), x, 1)
    assert np.allclose(cv, one, rtol=1e-12, atol=1e-12 * np.abs(one).max())
    plain = x @ wq.dequantize_bf16(qw, st, (N, K)).astype(np.float64).T
    assert np.allclose(cv, plain, rtol=1e-12, atol=1e-12 * np.abs(plain).max())


def test_gemv_cv_reference_refuses():
    qw, st = wq.quantize_pack(np.ones((16, 256), np.float32))
    x = np.ones((1, 256))
    for ks in (0, 3):
        with pytest.raises(UserError, match=f"ks = {ks}: the parts of K = 256 number 1 to 2"):
            wq.gemv_cv_reference(qw, st, (16, 256), x, ks)
    with pytest.raises(UserError, match="x has last dim 128, expected K = 256"):
        wq.gemv_cv_reference(qw, st, (16, 256), np.ones((1, 128)), 2)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
def test_gpu_test_kernels_compile_clean():
    """Every instance tests/gpu/test_gemv_cv.py launches, in the unit it compiles (the launch
    figures static_asserted against plan.gemv.gemv_cv_launch), for sm_90a through the gate: no
    spills, no stack frame, no C7513/C7514."""
    from qwen38gen.gate import compile_kernels
    from tests.gpu import test_gemv_cv as g

    res = compile_kernels(g.source(), "gemv_cv_test.cu", arch="sm_90a")
    threads = {}
    for i in g.instances():
        k, nt, ks, _, st, wm, _, _, mi, _, ar = i
        threads[g.name(*i)] = g.gemv_cv_launch(nt, ks, st, wm, mi)[0]
        if ar:   # gemv_q4, the bitwise reference of AR = 1
            threads[g.q4_name(k, nt, ks)] = 32 * ks
    assert {k.name for k in res.kernels} == set(threads)
    for k in res.kernels:
        assert not (k.spill_stores or k.spill_loads or k.stack), (k.name, k)
        # one block of the instance fits the register file (MI = 4 at NT = 2 takes 130)
        assert 0 < k.registers <= min(255, 65536 // threads[k.name]), (k.name, k.registers)
    log = (Path(res.cubin).parent / "ptxas.log").read_text()
    assert "C7513" not in log and "C7514" not in log, log
