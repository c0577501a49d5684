"""Speculative sampling (qwen38gen/spec_sampling.py) is exact in distribution: a statistical test
at the sampling-rule level, pure numpy, not through the emulator.

A toy model over V = 6 tokens whose target logits depend on the prefix, a draft law q that
differs from the target (other logits, softmax), K = 2 drafts drawn from q. For each of N seeds
the speculative loop runs until two tokens are out; the joint law of (y1, y2) must be
p(y1) · p(y2 | y1), the law plain sampling (``sampling.sample``) has, with the target after
temperature / top_k / top_p / min_p. Pearson's chi-square over the cells (those with an expected
count below 5 pooled; a token in a cell of probability 0 fails at once), rejected when its
p-value is below ALPHA = 1e-6: a correct sampler fails it with probability 1e-6 for a random
choice of seeds (the seeds are fixed, so the test is deterministic). The same test passes
plain sampling (the harness is sound) and fails a sampler with a wrong residual (p instead of
max(0, p − q)): the negative control.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from qwen38gen import spec_sampling as SS
from qwen38gen.sampling import SamplingParams, sample

V, K, N, POS = 6, 2, 6000, 10
ALPHA = 1e-6

SETTINGS = {
    "filters": SamplingParams(temperature=0.9, top_k=4, top_p=0.9, min_p=0.05),
    "plain": SamplingParams(temperature=1.3),
}


def chi2_sf(x: float, df: int) -> float:
    """P(χ²_df > x): the regularised upper incomplete gamma Q(df/2, x/2) (series / continued
    fraction, Numerical Recipes §6.2)."""
    a, z = df / 2.0, x / 2.0
    if z <= 0:
        return 1.0
    lg = a * math.log(z) - z - math.lgamma(a)
    if z < a + 1:
        term = s = 1.0 / a
        n = a
        while abs(term) > abs(s) * 1e-15:
            n += 1
            term *= z / n
            s += term
        return 1.0 - s * math.exp(lg)
    b, c, d = z + 1 - a, 1e300, 1 / (z + 1 - a)
    h = d
    for i in range(1, 10000):
        an = -i * (i - a)
        b += 2
        d = an * d + b
        d = 1 / d if d else 1e300
        c = b + an / c if c else 1e300
        h *= d * c
        if abs(d * c - 1) < 1e-15:
            break
    return math.exp(lg) * h


def test_chi2_sf_known_values():
    assert chi2_sf(3.841458820694124, 1) == pytest.approx(0.05, rel=1e-9)
    assert chi2_sf(18.307038053275146, 10) == pytest.approx(0.05, rel=1e-9)
    assert chi2_sf(5.0, 10) == pytest.approx(0.8911780189141513, rel=1e-9)


class Toy:
    """Target logits and draft law per prefix (seeded by the prefix)."""

    def __init__(self, params: SamplingParams):
        self.params, self._x, self._q = params, {}, {}

    def logits(self, prefix: tuple) -> np.ndarray:
        if prefix not in self._x:
            rng = np.random.default_rng([7, len(prefix), *prefix])
            self._x[prefix] = (rng.normal(size=V) * 1.5).astype(np.float32)
        return self._x[prefix]

    def weights(self, prefix):
        return SS.target_weights(self.logits(prefix), self.params)

    def p(self, prefix):
        return SS.target_probs(self.logits(prefix), self.params)

    def q(self, prefix):
        if prefix not in self._q:
            rng = np.random.default_rng([9, len(prefix), *prefix])
            z = rng.normal(size=V) * 1.5
            self._q[prefix] = np.exp(z) / np.exp(z).sum()
        return self._q[prefix]


def speculative_pair(toy: Toy, seed: int, rng) -> tuple[int, int]:
    out: list[int] = []
    while len(out) < 2:
        pre = tuple(out)
        drafts, qs = [], []
        for _ in range(K):
            qj = toy.q(pre + tuple(drafts))
            qs.append(qj)
            drafts.append(int(rng.choice(V, p=qj)))
        rows = [toy.weights(pre + tuple(drafts[:j])) for j in range(K + 1)]
        out += SS.speculative_sample(rows, drafts, seed, POS + len(out), q=np.array(qs))
    return out[0], out[1]


def plain_pair(toy: Toy, seed: int, rng) -> tuple[int, int]:
    p = replace(toy.params, seed=seed)
    y1 = sample(toy.logits(()), p, POS)
    return y1, sample(toy.logits((y1,)), p, POS + 1)


def chi2_test(toy: Toy, draw) -> tuple[float, int, float]:
    """(statistic, degrees of freedom, p-value) of the (y1, y2) counts of N seeds against
    p(y1) p(y2 | y1)."""
    rng = np.random.default_rng(2026)
    counts = np.zeros((V, V))
    for s in range(N):
        counts[draw(toy, 1000 + s, rng)] += 1
    want = np.array([[toy.p(())[a] * toy.p((a,))[b] for b in range(V)] for a in range(V)]) * N
    assert not counts[want == 0].any(), "a token of probability 0 was drawn"
    e, o = want[want > 0], counts[want > 0]
    small = e < 5
    if small.any():
        e = np.append(e[~small], e[small].sum())
        o = np.append(o[~small], o[small].sum())
    stat = float(((o - e) ** 2 / e).sum())
    df = len(e) - 1
    return stat, df, chi2_sf(stat, df)


@pytest.mark.parametrize("name", list(SETTINGS))
def test_speculative_sampling_matches_plain(name):
    toy = Toy(SETTINGS[name])
    # the draft law differs from the target (else every draft would be kept)
    assert 0.5 * np.abs(toy.q(()) - toy.p(())).sum() > 0.2
    stat, df, pv = chi2_test(toy, speculative_pair)
    print(f"{name}: chi2 {stat:.1f} on {df} dof, p = {pv:.3g}")
    assert pv > ALPHA, (stat, df, pv)


def test_plain_sampling_passes_the_same_test():
    stat, df, pv = chi2_test(Toy(SETTINGS["filters"]), plain_pair)
    print(f"plain sampling: chi2 {stat:.1f} on {df} dof, p = {pv:.3g}")
    assert pv > ALPHA, (stat, df, pv)


def test_negative_control_wrong_residual_fails(monkeypatch):
    """Resampling from p itself after a rejection (instead of max(0, p − q)) over-weights the
    tokens q favours; the test must see it."""
    monkeypatch.setattr(SS, "residual", lambda p, q: p)
    stat, df, pv = chi2_test(Toy(SETTINGS["filters"]), speculative_pair)
    print(f"wrong residual: chi2 {stat:.1f} on {df} dof, p = {pv:.3g}")
    assert pv < ALPHA, (stat, df, pv)


def test_bonus_is_plain_sampling_and_draws_are_keyed():
    """All drafts kept: the bonus token is sampling.sample's token at that position, bit for
    bit; the keyed draws are sampling.draw_u64 for purpose 0 and differ by purpose."""
    from qwen38gen.sampling import draw_u64

    p = SamplingParams(temperature=0.7, top_p=0.95, seed=123)
    rng = np.random.default_rng(3)
    for _ in range(20):
        x = rng.normal(size=(3, 50)).astype(np.float32) * 3
        rows = [SS.target_weights(r, p) for r in x]
        # drafts of probability 1 under q and high under p are kept with probability p(d)
        got = SS.speculative_sample(rows, [int(np.argmax(x[0])), int(np.argmax(x[1]))], p.seed, 40)
        if len(got) == 3:
            assert got[2] == sample(x[2], p, 42)
    assert SS.keyed_u64(5, 17, 0) == draw_u64(5, 17)
    assert len({SS.keyed_u64(5, 17, k) for k in (0, SS.ACCEPT, SS.RESIDUAL)}) == 3


def test_greedy_accept():
    assert SS.greedy_accept([4, 5, 6], [4, 5]) == [4, 5, 6]
    assert SS.greedy_accept([4, 5, 6], [4, 9]) == [4, 5]
    assert SS.greedy_accept([4, 5, 6], [1, 5]) == [4]
    p = SamplingParams()
    x = np.zeros((2, 8), np.float32)
    x[0, 3], x[1, 6] = 1, 1
    assert SS.accept_row(x, [3], p, 0) == [3, 6]
    assert SS.accept_row(x, [2], p, 0) == [3]
