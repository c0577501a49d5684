"""Greedy MTP speculative decoding (qwen38gen.speculative, docs/MODEL.md §8.2–8.3) against plain greedy.

The lock is greedy equality: for every seed, batch and k the speculative output equals
``Reference.generate`` token for token. With random weights the MTP rarely guesses right, so three
draft regimes are run:

* natural: the MTP's own drafts (mostly rejected: n = 0, rollback every pass);
* forced right: a draft_hook returning the true greedy tokens, so every draft is accepted
  (acceptance 1.0, no rollback, ⌈(steps−1)/(k+1)⌉ verify passes);
* half forced: drafts at odd positions forced wrong, at even positions right, so passes accept
  0 < n < k drafts and roll back; the exact run lengths are predicted from the positions alone.

The toy preset in float32 (the reference's default dtype); a batch mixes prompt lengths 1, 2, 5, 17.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from qwen38gen.config import PRESETS
from qwen38gen.reference import Reference
from qwen38gen.speculative import speculative_generate
from qwen38gen.weights import synthetic_weights

from tests._blas_threads import single_threaded  # noqa: F401  (autouse: 1 BLAS thread)

CFG = PRESETS["toy"]
SEEDS = (0, 1, 2)
LENGTHS = (1, 2, 5, 17)
STEPS = 12
KS = (1, 2, 3)

_REFS: dict[int, Reference] = {}


def reference(seed: int) -> Reference:
    if seed not in _REFS:
        _REFS[seed] = Reference(CFG, synthetic_weights(CFG, seed))
    return _REFS[seed]


def prompts_for(seed: int) -> list[list[int]]:
    rng = np.random.default_rng(100 + seed)
    return [rng.integers(0, CFG.vocab_size, n).tolist() for n in LENGTHS]


def greedy_streams(ref, prompts, extra):
    """Greedy tokens (steps + extra of them) and the full sequences prompt + generated."""
    gen = ref.generate(prompts, STEPS + extra)
    return gen, [list(p) + g for p, g in zip(prompts, gen)]


def forcing_hook(full, right):
    """A draft_hook: the true token at ``position`` where right(position), else a wrong one."""
    def hook(b, position, proposed):
        true = full[b][position]
        return true if right(position) else (true + 1) % CFG.vocab_size
    return hook


def predicted_runs(prompt_len, k, right):
    """The n of each verify pass when draft positions p are accepted exactly where right(p).

    A pass after last processed position t drafts positions t+2 … t+k+1 and accepts the leading
    run of right ones (a draft is right iff it equals the greedy token there, and the verify
    argmax *is* the greedy token since the accepted prefix is the greedy stream); the sequence then
    has STEPS tokens after 1 (prefill) + Σ(n+1) ≥ STEPS.
    """
    t, emitted, runs = prompt_len - 1, 1, []
    while emitted < STEPS:
        n = 0
        while n < k and right(t + 2 + n):
            n += 1
        runs.append(n)
        emitted += n + 1
        t += n + 1
    return runs


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("k", KS)
def test_natural_drafts_equal_greedy(seed, k):
    ref, prompts = reference(seed), prompts_for(seed)
    want = ref.generate(prompts, STEPS)
    got, stats = speculative_generate(ref, prompts, STEPS, k=k)
    assert got == want
    for b in range(len(prompts)):
        assert len(got[b]) == STEPS
        assert stats.proposed[b] == k * stats.verify_passes[b]
        assert 0 <= stats.accepted[b] <= stats.proposed[b]
        assert sum(n + 1 for n in stats.runs[b]) >= STEPS - 1      # enough tokens came out
        assert sum(n + 1 for n in stats.runs[b][:-1]) < STEPS - 1   # ... and no pass too many
        assert stats.rollback_passes[b] <= sum(n < k for n in stats.runs[b])


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("k", KS)
def test_forced_right_drafts_all_accepted(seed, k):
    ref, prompts = reference(seed), prompts_for(seed)
    want, full = greedy_streams(ref, prompts, extra=k + 1)         # drafts may look past STEPS
    got, stats = speculative_generate(ref, prompts, STEPS, k=k,
                                      draft_hook=forcing_hook(full, lambda p: True))
    assert got == [w[:STEPS] for w in want]
    passes = math.ceil((STEPS - 1) / (k + 1))                      # 1 token from prefill, k+1 per pass
    for b in range(len(prompts)):
        assert stats.acceptance_rate[b] == 1.0
        assert stats.target_passes[b] == passes
        assert stats.runs[b] == [k] * passes
        assert stats.rollback_passes[b] == 0


@pytest.mark.parametrize("seed", SEEDS[:2])
@pytest.mark.parametrize("k", KS)
def test_half_forced_drafts_partial_acceptance_and_rollback(seed, k):
    ref, prompts = reference(seed), prompts_for(seed)
    want, full = greedy_streams(ref, prompts, extra=k + 1)
    right = lambda p: p % 2 == 0                                   # noqa: E731
    got, stats = speculative_generate(ref, prompts, STEPS, k=k, draft_hook=forcing_hook(full, right))
    assert got == [w[:STEPS] for w in want]
    for b, pr in enumerate(prompts):
        runs = predicted_runs(len(pr), k, right)
        assert stats.runs[b] == runs
        assert stats.accepted[b] == sum(runs)
        assert stats.proposed[b] == k * len(runs)
        assert stats.verify_passes[b] == len(runs)
        # a rollback re-run for every pass with a rejection, except a final pass that finishes
        finishing = 1 if runs[-1] < k else 0
        assert stats.rollback_passes[b] == sum(n < k for n in runs) - finishing
    all_runs = [n for r in stats.runs for n in r]
    assert any(n < k for n in all_runs)                            # rollback was exercised
    if k >= 2:
        assert any(0 < n < k for n in all_runs)                    # partial acceptance too


def test_forced_wrong_drafts_one_token_per_pass():
    ref, prompts = reference(0), prompts_for(0)
    want, full = greedy_streams(ref, prompts, extra=4)
    got, stats = speculative_generate(ref, prompts, STEPS, k=2,
                                      draft_hook=forcing_hook(full, lambda p: False))
    assert got == [w[:STEPS] for w in want]
    for b in range(len(prompts)):
        assert stats.acceptance_rate[b] == 0.0
        assert stats.target_passes[b] == STEPS - 1
        assert stats.rollback_passes[b] == STEPS - 2               # the last pass needs none


def test_edge_cases():
    ref, prompts = reference(0), prompts_for(0)
    assert speculative_generate(ref, prompts, 0)[0] == [[] for _ in prompts]
    got, stats = speculative_generate(ref, prompts, 1, k=2)
    assert got == ref.generate(prompts, 1) and stats.verify_passes == [0] * len(prompts)
    with pytest.raises(ValueError):
        speculative_generate(ref, [[1], []], 3)
    with pytest.raises(ValueError):
        speculative_generate(ref, prompts, 3, k=0)


def teacher_forced_mtp(ref, seq):
    """The MTP rows over a whole known sequence: a State whose MTP cache holds rows 0 … N−2 (row i =
    (seq[i+1], h_out(i), position i)), their logits [N−1, vocab] and h' [N−1, hidden]."""
    st = ref.new_state(1)
    _, hid = ref.forward(st, [seq])
    lg, hh = ref.mtp_forward(st, [seq[1:]], [hid[0][:-1]], [0])
    return st, lg[0], hh[0]


def recording_hook(calls, inner=None):
    def hook(b, position, proposed):
        calls.setdefault(b, []).append((position, proposed))
        return inner(b, position, proposed) if inner else proposed
    return hook


@pytest.mark.parametrize("k", KS)
def test_drafts_are_the_mtp_chain_of_the_greedy_stream(k):
    """Every proposed draft is what §8.1/8.2 give on the accepted (= greedy) stream.

    Forced-right drafts: the pass after last position t proposes d₁ = argmax of teacher-forced MTP
    row t and d_j = argmax of the chained row (d_{j−1}, h' of the previous row, position t+j−1)
    over the MTP cache of rows 0 … t. Natural drafts: at least every d₁ is row t's argmax (the
    MTP cache always ends up holding the greedy stream's rows, rejected drafts overwritten).
    """
    seed = 1
    ref, prompts = reference(seed), prompts_for(seed)
    _, full = greedy_streams(ref, prompts, extra=k + 1)
    forced, natural = {}, {}
    speculative_generate(ref, prompts, STEPS, k=k,
                         draft_hook=recording_hook(forced, forcing_hook(full, lambda p: True)))
    speculative_generate(ref, prompts, STEPS, k=k, draft_hook=recording_hook(natural))
    for b, pr in enumerate(prompts):
        seq = full[b][:len(pr) + STEPS + k]
        st, lg, hh = teacher_forced_mtp(ref, seq)
        # forced: the whole chain of every pass
        calls = forced[b]
        assert len(calls) % k == 0
        for c0 in range(0, len(calls), k):
            t = calls[c0][0] - 2                                   # d₁ sits at position t+2
            want = [int(np.argmax(lg[t]))]
            s2, h = st.copy(), hh[t]
            for j in range(2, k + 1):                              # row (d_{j−1}, h', t+j−1)
                l2, h2 = ref.mtp_forward(s2, [[seq[t + j]]], [h[None]], [t + j - 1])
                want.append(int(np.argmax(l2[0][0])))
                h = h2[0][0]
            assert [p for p, _ in calls[c0:c0 + k]] == list(range(t + 2, t + k + 2))
            assert [d for _, d in calls[c0:c0 + k]] == want, (b, t)
        # natural: the first draft of every pass
        calls = natural[b]
        for position, proposed in calls[::k]:
            assert proposed == int(np.argmax(lg[position - 2])), (b, position)
