"""Greedy speculative decoding with the MTP drafter, in plain numpy on top of ``Reference``.

This is docs/MODEL.md §8.2–8.3 written as a loop over a batch of B independent sequences; it is the
reference for a GPU implementation, not a fast path. Greedy acceptance makes the output identical
to plain greedy decoding of the target (``Reference.generate``), which is what the tests lock.

Public API
----------

``speculative_generate(ref, prompts, steps, k=1, draft_hook=None) -> (tokens, stats)``
    ``prompts``: B non-empty lists of token ids. Returns ``tokens``: B lists of exactly ``steps``
    new token ids each, and ``stats`` (``SpecStats``, per sequence). ``k`` >= 1 drafts per verify
    pass. ``draft_hook(b, position, proposed) -> token``, if given, is called for every draft the
    MTP proposes (sequence b, ``position`` = the absolute position the drafted token would occupy,
    prompt tokens being at 0 … L−1) and its return value is used as the draft instead: a test hook
    to force drafts right or wrong. The replaced token is also what the next draft row reads.

The loop (t = the last position the target has processed for a sequence; x_{t+1} its next token):

1. Prefill the prompt (positions 0 … L−1, t = L−1) and take x_{t+1} = argmax of the last row; it
   is the first emitted token. Run the MTP rows for all prompt positions (§8.2 step 1): row i =
   (token_{i+1}, h_out(i), position i), the last row reading x_{t+1}; its argmax is d₁.
2. Draft d₂ … d_k (§8.2 step 2): MTP row (d_{j−1}, h' of the previous row, position t+j−1).
3. Verify (§8.3): ONE target ``forward`` chunk [x_{t+1}, d₁, …, d_k] at positions t+1 … t+k+1;
   a_j = argmax ℓ_j. Accept while d_j == a_{j−1}; with n accepted emit d₁ … d_n, a_n.
4. Roll back to the accepted length t+1+n (below), then run the MTP rows for the n+1 verified rows
   (positions t+1 … t+1+n, tokens d₁ … d_n, a_n, the verify pass's h_out) — this truncates the MTP
   cache at t+1, overwriting the rejected draft rows — and the last one gives the next d₁.
   t ← t+1+n, x_{t+1} ← a_n; back to 2 until ``steps`` tokens are out (the last run is truncated).

Rollback (§8.3 allows either of two options; this is the second): before the verify pass the whole
``State`` is snapshot (``State.copy()``). If all k drafts are accepted (n = k) the state after the
verify pass is already the state after the accepted tokens and is kept. Otherwise sequence b is
restored from the snapshot (GDN conv/recurrent state, attention KV, MTP KV, position) and the
n+1 accepted tokens [x_{t+1}, d₁ … d_n] are re-run through the target in one more ``forward`` call
(a "rollback pass"; its logits/hiddens are not used: the verify pass's rows are the ones §8.3
names). The slot-per-token alternative (vLLM: keep the recurrent state after each of the k+1
tokens) would need per-token GDN states out of ``Reference.forward``, which it does not expose.

Sequences advance by different counts (n differs per sequence and pass); every forward /
mtp_forward call is batched over the sequences still running, the others pass an empty chunk.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from .reference import Reference, State

__all__ = ["SpecStats", "speculative_generate"]

DraftHook = Callable[[int, int, int], int]


@dataclass
class SpecStats:
    """Per-sequence counters of one ``speculative_generate`` call (lists of length B).

    * ``proposed[b]``: drafts verified (k per verify pass).
    * ``accepted[b]``: drafts accepted (d_j == a_{j−1}), counted before the final truncation.
    * ``verify_passes[b]``: target verify passes (chunks of k+1) that sequence b took part in; the
      prefill and the rollback re-runs are not counted.
    * ``rollback_passes[b]``: re-runs of the accepted tokens from the snapshot (passes with n < k).
    * ``runs[b]``: n (drafts accepted) of each verify pass, in order.
    * ``nonfinite[b]``: where sequence b's first non-finite logit was (a row a token was chosen
      from), or None; filled by the GPU/emulated runs (spec_runtime), empty otherwise.
    """

    proposed: list[int]
    accepted: list[int]
    verify_passes: list[int]
    rollback_passes: list[int]
    runs: list[list[int]] = field(default_factory=list)
    nonfinite: list[str | None] = field(default_factory=list)

    @property
    def acceptance_rate(self) -> list[float]:
        """accepted / proposed per sequence (nan when nothing was proposed)."""
        return [a / p if p else float("nan") for a, p in zip(self.accepted, self.proposed)]

    @property
    def target_passes(self) -> list[int]:
        """Target passes per sequence after the prefill: verify passes (rollback re-runs excluded)."""
        return list(self.verify_passes)


def _restore_sequence(state: State, snap: State, b: int) -> None:
    """Put sequence b of ``state`` back to its values in ``snap`` (layouts: reference.py docstring)."""
    state.pos[b] = snap.pos[b]
    for i in state.conv:
        state.conv[i][b] = snap.conv[i][b]
        state.rec[i][b] = snap.rec[i][b]
    for i in state.k:
        state.k[i][b] = snap.k[i][b]
        state.v[i][b] = snap.v[i][b]
    state.mtp_k[b] = snap.mtp_k[b]
    state.mtp_v[b] = snap.mtp_v[b]


def speculative_generate(ref: Reference, prompts: list[list[int]], steps: int, k: int = 1,
                         draft_hook: DraftHook | None = None) -> tuple[list[list[int]], SpecStats]:
    """Greedy MTP speculative decoding (docs/MODEL.md §8.2–8.3); see the module docstring.

    Returns (tokens, stats): B lists of ``steps`` token ids (equal to ``ref.generate(prompts,
    steps)``) and the per-sequence ``SpecStats``.
    """
    if k < 1:
        raise ValueError(f"speculative_generate: k must be >= 1, got {k}")
    if any(len(pr) == 0 for pr in prompts):
        raise ValueError("speculative_generate: every prompt needs at least one token")
    B = len(prompts)
    stats = SpecStats([0] * B, [0] * B, [0] * B, [0] * B, [[] for _ in range(B)])
    out: list[list[int]] = [[] for _ in range(B)]
    if steps <= 0:
        return out, stats

    st = ref.new_state(B)
    # ---- 1. prefill, first token, MTP rows over the whole prompt (§8.2 step 1)
    logits, hid = ref.prefill(st, prompts)                   # per b: [L_b, vocab], [L_b, hidden]
    nxt = [int(np.argmax(lg[-1])) for lg in logits]          # x_{t+1}, t = L_b − 1
    for b in range(B):
        out[b].append(nxt[b])
    t = [len(pr) - 1 for pr in prompts]                      # last position processed by the target
    mtp_lg, mtp_h = ref.mtp_forward(st, [list(pr[1:]) + [nxt[b]] for b, pr in enumerate(prompts)],
                                    hid, [0] * B)
    # the draft row state per sequence: logits [vocab] and h' [hidden] of the last MTP row
    d_logit = [lg[-1] for lg in mtp_lg]
    d_hid = [h[-1] for h in mtp_h]

    def running() -> list[bool]:
        return [len(o) < steps for o in out]

    while any(running()):
        act = running()
        # ---- 2. draft k tokens per running sequence (§8.2)
        drafts: list[list[int]] = [[] for _ in range(B)]
        for j in range(1, k + 1):
            if j > 1:                                        # row (d_{j−1}, h', position t+j−1)
                lg, hh = ref.mtp_forward(
                    st, [[drafts[b][-1]] if act[b] else [] for b in range(B)],
                    [d_hid[b][None] if act[b] else np.zeros((0, ref.cfg.hidden_size)) for b in range(B)],
                    [t[b] + j - 1 if act[b] else 0 for b in range(B)])
                for b in range(B):
                    if act[b]:
                        d_logit[b], d_hid[b] = lg[b][0], hh[b][0]
            for b in range(B):
                if act[b]:
                    d = int(np.argmax(d_logit[b]))           # d_j: guess for position t+j+1
                    if draft_hook is not None:
                        d = int(draft_hook(b, t[b] + j + 1, d))
                    drafts[b].append(d)

        # ---- 3. verify [x_{t+1}, d_1 … d_k] in one target pass (§8.3)
        snap = st.copy()                                     # rollback point (state after t)
        chunks = [[nxt[b]] + drafts[b] if act[b] else [] for b in range(B)]
        v_lg, v_hid = ref.forward(st, chunks)                # per b: [k+1, vocab], [k+1, hidden]
        accepted_rows: list[list[int]] = [[] for _ in range(B)]   # tokens of positions t+1 … t+1+n
        rerun = [False] * B
        for b in range(B):
            if not act[b]:
                continue
            a = [int(x) for x in np.argmax(v_lg[b], axis=-1)]     # a_0 … a_k
            n = 0
            while n < k and drafts[b][n] == a[n]:            # d_{n+1} == a_n
                n += 1
            stats.proposed[b] += k
            stats.accepted[b] += n
            stats.verify_passes[b] += 1
            stats.runs[b].append(n)
            emit = drafts[b][:n] + [a[n]]                    # d_1 … d_n, a_n
            out[b].extend(emit[:steps - len(out[b])])        # truncate the last run
            accepted_rows[b] = [nxt[b]] + drafts[b][:n]
            rerun[b] = n < k
            nxt[b] = a[n]                                    # x_{t'+1} for the next pass
            # the verified rows that §8.2 step 1 re-reads: h_out of positions t+1 … t+1+n
            v_hid[b] = v_hid[b][:n + 1]

        # ---- 4a. rollback: sequences with a rejected draft go back to the snapshot and re-run
        #          the accepted tokens; finished sequences need no further state.
        act = [act[b] and len(out[b]) < steps for b in range(B)]
        rerun = [rerun[b] and act[b] for b in range(B)]
        if any(rerun):
            for b in range(B):
                if rerun[b]:
                    _restore_sequence(st, snap, b)
                    stats.rollback_passes[b] += 1
            ref.forward(st, [accepted_rows[b] if rerun[b] else [] for b in range(B)])

        # ---- 4b. MTP rows for the verified rows (§8.3 last sentence → §8.2 step 1):
        #          row t+1+i = (token at t+2+i, h_out(t+1+i)), tokens d_1 … d_n, a_n
        if any(act):
            lg, hh = ref.mtp_forward(
                st, [accepted_rows[b][1:] + [nxt[b]] if act[b] else [] for b in range(B)],
                [v_hid[b] if act[b] else np.zeros((0, ref.cfg.hidden_size)) for b in range(B)],
                [t[b] + 1 if act[b] else 0 for b in range(B)])
            for b in range(B):
                if act[b]:
                    d_logit[b], d_hid[b] = lg[b][-1], hh[b][-1]
                    t[b] += len(accepted_rows[b])            # t ← t+1+n
                    assert st.pos[b] == t[b] + 1, (b, st.pos[b], t[b])
    return out, stats
