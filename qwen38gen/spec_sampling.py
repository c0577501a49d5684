"""Speculative sampling: which of a verify pass's drafts a request keeps, and the token after them.

This is the host path: for an mtp program the engine reads the verify rows' logits from the
program and decides here, in numpy (the program's own accept kernel, kernels/speculative.cuh,
is greedy only). Plain programs sample on the device (kernels/sampling.cuh); sampling.py is the
definition both follow.

Target distribution. For one row of logits x and a request's parameters, the target law is the
law of ``sampling.sample``: p_i = w_i / W' for i in S (``sampling.survivors``: temperature, top_k,
min_p, top_p; w the integer weights), 0 outside S. ``target_weights`` returns w masked to S.

The rule (Leviathan et al. 2023, Chen et al. 2023), for a verify pass whose row j (0 … K) gives
the target law p_j of the token at position P + j, drafts d_1 … d_K and their draft laws
q_1 … q_K (the MTP drafts greedily, so q_j is one-hot at d_j, which this allows as any other law):

* for j = 1 … K: u = U(seed, P+j−1, ACCEPT) / 2^64; d_j is accepted iff u · q_j(d_j) < p_{j−1}(d_j)
  (probability min(1, p/q)). At the first rejection the token at P+j−1 is drawn from the residual
  max(0, p_{j−1} − q_j), normalised, by inverse CDF in index order with U(seed, P+j−1, RESIDUAL),
  and the pass ends: n = j−1 drafts kept, n+1 tokens. With one-hot drafts (the MTP's; q None)
  both are integer arithmetic on the rule's weights w (``judge_draft``): accepted iff
  floor(U · W' / 2^64) < w(d), W' = Σ w; the residual is the weights with w(d) set to 0, drawn as
  ``draw_weighted`` draws. kernels/sampling.cuh (SPEC = 1) computes the same, bit for bit.
* all K accepted: the bonus token at P+K is drawn from p_K with U(seed, P+K, 0), exactly as
  ``sampling.sample(x_K, params, P+K)`` draws it (bit for bit).

Every token is then distributed as plain sampling would have it (tests/test_spec_sampling.py
checks it statistically, with a negative control). U(seed, position, purpose) is Philox4x32-10
with counter (position, purpose, 0, 0) and key (seed low, seed high): purpose 0 is
``sampling.draw_u64``; ACCEPT and RESIDUAL are separate streams. A request's tokens therefore depend
on its seed, its positions and its drafts only, not on B, its slot or its neighbours.

Greedy requests (``params.greedy``) keep drafts while d_j equals the argmax of row j−1 and end
with the argmax of row n (``greedy_accept``, what the accept kernel computes).
"""

from __future__ import annotations

import numpy as np

from .sampling import M32, SamplingParams, philox4x32_10, survivors

ACCEPT = 1
RESIDUAL = 2
TWO64 = float(1 << 64)


def keyed_u64(seed: int, position: int, purpose: int) -> int:
    """U(seed, position, purpose); purpose 0 is ``sampling.draw_u64(seed, position)``."""
    s = int(seed) % (1 << 64)
    a, b, _, _ = philox4x32_10((position, purpose, 0, 0), (s & M32, s >> 32))
    return a | (b << 32)


def target_weights(x: np.ndarray, params: SamplingParams) -> np.ndarray:
    """uint64 [V]: the rule's integer weights on S, 0 elsewhere (the target law is w / Σw)."""
    keep, w = survivors(np.asarray(x, np.float32), params)
    return np.where(keep, w, np.uint64(0))


def target_probs(x: np.ndarray, params: SamplingParams) -> np.ndarray:
    """float64 [V]: the target law of a sampled row (see the module docstring)."""
    w = target_weights(x, params).astype(np.float64)
    return w / w.sum()


def draw_weighted(w: np.ndarray, u: int) -> int:
    """``sampling.sample``'s draw (rule step 6) on integer weights w with the 64-bit number u."""
    cum = np.cumsum(w, dtype=np.uint64)
    r = (u * int(cum[-1])) >> 64
    return int(np.searchsorted(cum, np.uint64(r), side="right"))


def judge_draft(w: np.ndarray, d: int, seed: int, position: int) -> tuple[bool, int | None]:
    """A verify row's judgement of its one-hot draft d, on the row's ``target_weights`` w:
    (accepted, None), or (rejected, the token drawn from the rest) (module docstring)."""
    W = int(w.sum(dtype=np.uint64))
    wd = int(w[d])
    if (keyed_u64(seed, position, ACCEPT) * W) >> 64 < wd:
        return True, None
    rest = w.copy()
    rest[d] = 0
    return False, draw_weighted(rest, keyed_u64(seed, position, RESIDUAL))


def residual(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """The law drawn from after a rejection, unnormalised: max(0, p − q)."""
    return np.maximum(p - q, 0.0)


def speculative_sample(weights: list[np.ndarray], drafts, seed: int, position: int,
                       q: np.ndarray | None = None) -> list[int]:
    """The tokens one verify pass emits for a sampled request: n kept drafts and one more.

    weights: K+1 rows of ``target_weights`` (row j: the target law of position ``position``+j);
    drafts: d_1 … d_K; q: the draft laws [K, V] (None: one-hot at each draft, the MTP's greedy
    drafting). Returns d_1 … d_n, then the residual draw (n < K) or the bonus token (n = K).
    """
    K = len(drafts)
    if len(weights) != K + 1:
        raise ValueError(f"{len(weights)} target rows for {K} drafts; need {K + 1}")
    out: list[int] = []
    for j in range(K):
        w = weights[j]
        d = int(drafts[j])
        if q is None:                       # one-hot drafts: integer arithmetic
            ok, t = judge_draft(w, d, seed, position + j)
            out.append(d if ok else t)
            if ok:
                continue
            return out
        p = w.astype(np.float64) / float(w.sum())
        qj = np.asarray(q[j], np.float64)
        u = keyed_u64(seed, position + j, ACCEPT) / TWO64
        if u * qj[d] < p[d]:
            out.append(d)
            continue
        r = residual(p, qj)
        cum = np.cumsum(r)
        x = keyed_u64(seed, position + j, RESIDUAL) / TWO64 * cum[-1]
        i = int(np.searchsorted(cum, x, side="right"))
        out.append(i if i < len(cum) else int(np.flatnonzero(r)[-1]))   # x rounded up to Σr
        return out
    out.append(draw_weighted(weights[K], keyed_u64(seed, position + K, 0)))
    return out


def greedy_accept(argmax_rows, drafts) -> list[int]:
    """Greedy verification: drafts while d_j == argmax of row j−1, then the argmax of row n."""
    n = 0
    while n < len(drafts) and int(drafts[n]) == int(argmax_rows[n]):
        n += 1
    return [int(d) for d in drafts[:n]] + [int(argmax_rows[n])]


def accept_row(logits: np.ndarray, drafts, params: SamplingParams, position: int,
               argmax_rows=None) -> list[int]:
    """One request's tokens from its verify rows' logits [K+1, V] (the engine's host path).
    Greedy: ``greedy_accept`` on ``argmax_rows`` (the program's argmax; default np.argmax)."""
    if params.greedy:
        am = np.argmax(logits, axis=-1) if argmax_rows is None else argmax_rows
        return greedy_accept(am, drafts)
    return speculative_sample(_Rows(logits, params), drafts, params.seed, position)


class _Rows:
    """The K+1 rows' ``target_weights``, each made when the rule first reads it: row j is read
    only while drafts 1 … j are kept, so a pass that rejects d_1 costs one row, not K+1."""

    def __init__(self, logits: np.ndarray, params: SamplingParams):
        self.logits, self.params, self.made = logits, params, {}

    def __len__(self) -> int:
        return len(self.logits)

    def __getitem__(self, j: int) -> np.ndarray:
        if j not in self.made:
            self.made[j] = target_weights(self.logits[j], self.params)
        return self.made[j]
