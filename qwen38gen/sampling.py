"""Token choice from one row of logits: greedy or sampled. This numpy twin is the spec;
kernels/sampling.cuh computes the same rule on the GPU, bit for bit on bf16 logits.

Parameters (vLLM's meanings): ``temperature`` ≥ 0, ``top_k`` (−1 or 0: off), ``top_p`` in
(0, 1], ``min_p`` in [0, 1], ``seed`` (an integer, taken mod 2^64). ``SamplingParams`` validates
them and raises ``UserError`` naming the field and its range.

The rule, for a row x_0 … x_{V−1} of finite float32 logits, the request's seed s and the
position n of the token being chosen (the number of tokens before it: prompt + generated):

1. Greedy when float32(temperature) < float32(1e−5) (vLLM's epsilon; temperature 0 is greedy):
   the token is argmax x, the smallest index among equal maxima (numpy.argmax, the program's
   argmax kernel). top_k, top_p, min_p and the seed are then ignored.
2. Scaled logits, in float32 with every operation rounded to nearest (no fused multiply-add):
   m = max x;  d_i = (x_i − m) / T, T = float32(temperature)  (d_i ≤ 0, the maximum has d = 0).
3. Relative probability e_i = exp2q(d_i · LOG2E) ≈ exp(d_i) = p_i / p_max, with exp2q(t) = 0 for
   t < −32 (or t = −inf), else: k = floor(t), f = t − k (exact), q = Horner(EXP2_COEFFS, f)
   (c7·f + c6, ·f + c5, …, ·f + c0, each product and sum rounded to float32), e = q · 2^k (exact).
   exp2q(0) = 1 exactly. The integer weight is w_i = floor(e_i · 2^32) (so w_max = 2^32; a
   token whose e_i < 2^−32 has weight 0 and is never chosen).
4. Candidates K: x_i ≥ τ_k, where τ_k is the top_k-th largest value of x counted with
   multiplicity (1 ≤ top_k < V; otherwise τ_k = −inf: every token; ties at τ_k all stay, as in
   vLLM), and e_i ≥ float32(min_p) (min_p: p_i ≥ min_p · p_max).
5. Nucleus, when q24 = max(1, round(top_p · 2^24)) < 2^24: W = Σ_{i∈K} w_i (exact integer);
   P = ceil(q24 · W / 2^24). Token i ∈ K stays when the weight of the candidates with strictly
   larger logits is below P: Σ_{j∈K, x_j > x_i} w_j < P. (The smallest set of the largest logits
   with mass ≥ top_p, ties at its edge kept; the maximum always stays.) S is what stays.
6. Draw: (a, b, …) = Philox4x32-10(counter = (n mod 2^32, 0, 0, 0), key = (s mod 2^32, s >> 32
   mod 2^32)); U = a + 2^32 · b; W' = Σ_{i∈S} w_i; r = floor(U · W' / 2^64) (0 ≤ r < W'). The
   token is the smallest index i whose running sum of weights over S in index order,
   Σ_{j∈S, j ≤ i} w_j, exceeds r: inverse-CDF sampling in vocabulary order.

Why this shape: every step after the float32 element-wise part is integer arithmetic, so any
summation order gives the same result. A GPU block per row computes it without sorting:
τ_k and the nucleus edge are value searches (radix selects over bf16's 16-bit keys, with counts
and with integer weight sums), and the draw is a block scan. One 64-bit random number per
token, keyed by (seed, position) only: a request's tokens do not depend on its slot, on the
batch or on the other requests. (A Gumbel/exponential race would need a logarithm per token,
whose last bit differs between libraries; the twin and the kernel would then disagree on
rare rows.)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .errors import field_error

GREEDY_EPS = np.float32(1e-5)
LOG2E = np.float32(float.fromhex("0x1.715476p+0"))
# 2^f = Σ (f ln 2)^j / j! for j ≤ 7 on [0, 1) (relative error < 2e−6): c_j = ln2^j / j!, as
# float32 (kernels/sampling.cuh holds the same hex literals; a test compares them).
EXP2_COEFFS = tuple(np.float32(float.fromhex(h)) for h in (
    "0x1p+0", "0x1.62e43p-1", "0x1.ebfbep-3", "0x1.c6b08ep-5",
    "0x1.3b2ab6p-7", "0x1.5d87fep-10", "0x1.430912p-13", "0x1.ffcbfcp-17"))
W_ONE = 1 << 32          # the weight of the maximum
TOP_P_BITS = 24

PHILOX_M = (0xD2511F53, 0xCD9E8D57)
PHILOX_W = (0x9E3779B9, 0xBB67AE85)
M32 = 0xFFFFFFFF


@dataclass(frozen=True)
class SamplingParams:
    """One request's sampling parameters (vLLM's meanings); greedy by default."""

    temperature: float = 0.0
    top_k: int = -1
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int = 0

    def __post_init__(self):
        def num(name, v):
            # Checked in float32, the dtype of the program's sampling columns: 1e308 is inf there.
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise field_error(name, f"must be a finite number, got {v!r}")
            try:
                f = float(v)
            except OverflowError:
                f = math.inf
            if not math.isfinite(f):
                raise field_error(name, f"must be a finite number, got {v!r}")
            with np.errstate(over="ignore"):
                if not math.isfinite(np.float32(f)):
                    raise field_error(name, f"{v!r} is out of range: it overflows float32 (the "
                                      "sampling dtype); give a number of magnitude < 3.4e38")
            return f

        t = num("temperature", self.temperature)
        if t < 0:
            raise field_error("temperature", f"{self.temperature!r} is out of range: it must be ≥ 0 "
                              "(0 = greedy)")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < -1:
            raise field_error("top_k", f"{self.top_k!r} is out of range: it must be an integer ≥ -1 "
                              "(-1 or 0 = off)")
        p = num("top_p", self.top_p)
        if not 0 < p <= 1:
            raise field_error("top_p", f"{self.top_p!r} is out of range: it must be in (0, 1]")
        mp = num("min_p", self.min_p)
        if not 0 <= mp <= 1:
            raise field_error("min_p", f"{self.min_p!r} is out of range: it must be in [0, 1]")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise field_error("seed", f"must be an integer, got {self.seed!r}")

    @property
    def greedy(self) -> bool:
        return bool(np.float32(self.temperature) < GREEDY_EPS)

    @property
    def top_p_q24(self) -> int:
        """top_p in units of 2^−24, at least 1 (rule step 5)."""
        return max(1, round(self.top_p * (1 << TOP_P_BITS)))


# ------------------------------------------------------------------------------ random numbers
def philox4x32_10(ctr: tuple[int, int, int, int], key: tuple[int, int]) -> tuple[int, ...]:
    """Philox4x32-10 (Salmon et al., SC 2011): four 32-bit words of counter, two of key."""
    c0, c1, c2, c3 = (int(c) & M32 for c in ctr)
    k0, k1 = (int(k) & M32 for k in key)
    for r in range(10):
        if r:
            k0, k1 = (k0 + PHILOX_W[0]) & M32, (k1 + PHILOX_W[1]) & M32
        p0, p1 = PHILOX_M[0] * c0, PHILOX_M[1] * c2
        c0, c1, c2, c3 = (p1 >> 32) ^ c1 ^ k0, p1 & M32, (p0 >> 32) ^ c3 ^ k1, p0 & M32
    return c0, c1, c2, c3


def draw_u64(seed: int, position: int) -> int:
    """The row's 64-bit random number U (rule step 6)."""
    s = int(seed) % (1 << 64)
    a, b, _, _ = philox4x32_10((position, 0, 0, 0), (s & M32, s >> 32))
    return a | (b << 32)


# ------------------------------------------------------------------------------ the rule
def exp2q(t: np.ndarray) -> np.ndarray:
    """2^t for float32 t ≤ 0 by the rule's recipe (step 3): bit-exact with the kernel. (float32
    arrays times and plus float32 scalars round each operation to float32, as the rule says;
    only the live entries, t ≥ −32, are computed.)"""
    t = np.asarray(t, np.float32)
    with np.errstate(invalid="ignore"):
        live = np.flatnonzero(t >= np.float32(-32))
    out = np.zeros(t.shape, np.float32)
    tt = t.reshape(-1)[live]
    k = np.floor(tt)
    f = tt - k                                                  # exact, float32
    q = np.full_like(f, EXP2_COEFFS[-1])
    for c in EXP2_COEFFS[-2::-1]:
        q *= f
        q += c
    e = np.ldexp(q, k.astype(np.int32))                         # exact: k in [−32, 0]
    out.reshape(-1)[live] = e
    return out


def weights(x: np.ndarray, temperature: float) -> tuple[np.ndarray, np.ndarray]:
    """(e float32 [V], w uint64 [V]) of a row x (steps 2 and 3)."""
    x = np.asarray(x, np.float32)
    m = x.max()
    d = ((x - m).astype(np.float32) / np.float32(temperature)).astype(np.float32)
    e = exp2q((d * LOG2E).astype(np.float32))
    w = np.floor(e.astype(np.float64) * W_ONE).astype(np.uint64)   # exact: e · 2^32 < 2^53
    return e, w


def survivors(x: np.ndarray, p: SamplingParams) -> tuple[np.ndarray, np.ndarray]:
    """(stays bool [V], w uint64 [V]): the set S of steps 4 and 5 and the weights."""
    x = np.asarray(x, np.float32)
    V = x.shape[0]
    e, w = weights(x, p.temperature)
    keep = e >= np.float32(p.min_p)
    if 1 <= p.top_k < V:
        tau = np.partition(x, V - p.top_k)[V - p.top_k]
        keep &= x >= tau
    if p.top_p_q24 < 1 << TOP_P_BITS:
        keep = _nucleus(x, w, keep, p.top_p_q24)
    return keep, w


def _nucleus(x: np.ndarray, w: np.ndarray, keep: np.ndarray, q24: int) -> np.ndarray:
    """Step 5: the candidates i with Σ_{j∈K, x_j > x_i} w_j < P. Only the largest candidates can
    stay, so the candidates are ranked from the top, m at a time (a partition, then a sort of
    the m), until the ones ranked hold ≥ P of the weight: a candidate below all of them has at
    least that much above it, and one tied with the lowest of them stays as that one does."""
    idx = np.flatnonzero(keep)
    xk, wk = x[idx], w[idx]
    W = int(wk.sum(dtype=np.uint64))
    P = -(-(q24 * W) // (1 << TOP_P_BITS))
    n = idx.size
    m = min(n, 1024)
    while True:
        top = np.argpartition(xk, n - m)[n - m:] if m < n else np.arange(n)
        top = top[np.argsort(-xk[top], kind="stable")]             # descending values
        xs, ws = xk[top], wk[top]
        cum = np.cumsum(ws, dtype=np.uint64)
        if m == n or int(cum[-1]) >= P:
            break
        m = min(n, 8 * m)
    # above[i] = Σ w over ranked values > xs[i]: the sum before the first of xs[i]'s ties
    first = np.searchsorted(-xs, -xs, side="left")
    above = np.where(first > 0, cum[np.maximum(first - 1, 0)], np.uint64(0))
    stay_ranked = above < np.uint64(P)
    stay = np.zeros(x.shape[0], bool)
    stay[idx[top[stay_ranked]]] = True
    if m < n and stay_ranked[-1]:          # ties of the lowest ranked value outside the ranked m
        stay[idx[xk == xs[-1]]] = True
    return stay


def sample(x: np.ndarray, p: SamplingParams, position: int) -> int:
    """The token of row x [V] for a request with parameters p at ``position`` (the rule)."""
    x = np.asarray(x, np.float32)
    if p.greedy:
        return int(np.argmax(x))
    keep, w = survivors(x, p)
    s = np.where(keep, w, np.uint64(0))
    cum = np.cumsum(s, dtype=np.uint64)
    r = (draw_u64(p.seed, position) * int(cum[-1])) >> 64
    return int(np.searchsorted(cum, np.uint64(r), side="right"))


def sample_rows(logits: np.ndarray, params: list[SamplingParams], positions: list[int]) -> np.ndarray:
    """``sample`` per row: logits [R, V], one parameter set and position per row -> int32 [R]."""
    return np.array([sample(logits[r], params[r], positions[r]) for r in range(len(params))],
                    np.int32)


# ---------------------------------------------------------------- the kernel's parameter columns
# The one owner of the per-row parameter layout that kernels/sampling.cuh reads (fpar[2 r + j],
# upar[4 r + j]); the program's buffers (plan/sampling.py), the backends and the emulator take it
# from here.
FPAR_COLUMNS = ("temperature", "min_p")                        # float32 [R, 2]
UPAR_COLUMNS = ("top_k", "top_p_q24", "seed_lo", "seed_hi")    # uint32 [R, 4]
DEFAULTS = SamplingParams()   # a request's parameters where it gives none (greedy)


def pack_params(params: list[SamplingParams], positions: list[int]):
    """The kernel's per-row arguments (kernels/sampling.cuh): fpar float32 [R, 2] (FPAR_COLUMNS),
    upar uint32 [R, 4] (UPAR_COLUMNS: top_k, top_p_q24, seed low word, seed high word), ctr int32
    [R] (the positions)."""
    R = len(params)
    fpar = np.zeros((R, len(FPAR_COLUMNS)), np.float32)
    upar = np.zeros((R, len(UPAR_COLUMNS)), np.uint32)
    for i, p in enumerate(params):
        s = int(p.seed) % (1 << 64)
        fpar[i] = (p.temperature, p.min_p)
        upar[i] = (p.top_k & M32, min(p.top_p_q24, 1 << TOP_P_BITS), s & M32, s >> 32)
    return fpar, upar, np.asarray(positions, np.int64).astype(np.uint32).view(np.int32)


def put_greedy_params(put, buffers: dict, batch: int) -> None:
    """Greedy parameters for every slot into a program's sampler columns (samp_fpar, samp_upar),
    where it has them: what a greedy run of an mtp program that judges sampled drafts
    (Tuning.spec_sample) must find there, not what a fill or a poison left."""
    if "samp_fpar" not in buffers:
        return
    fpar, upar, _ = pack_params([DEFAULTS] * batch, [0] * batch)
    put("samp_fpar", fpar)
    put("samp_upar", upar.view(np.int32))


def unpack_params(fpar, upar) -> SamplingParams:
    """One row of pack_params's arrays back to its parameters (what the kernel reads)."""
    u = [int(v) & M32 for v in upar]
    top_k = u[0] - (1 << 32) if u[0] >> 31 else u[0]
    return SamplingParams(temperature=float(np.float32(fpar[0])), min_p=float(np.float32(fpar[1])),
                          top_k=top_k, top_p=u[1] / (1 << TOP_P_BITS), seed=u[2] | (u[3] << 32))
