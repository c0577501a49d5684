"""Greedy speculative decoding on an emitted mtp-lane program (docs/MODEL.md §8.2–8.3), written against
a small executor interface so that the same loop runs on the GPU (``runtime.Runtime``: each
schedule one CUDA graph) and on the numpy schedule emulator (``emu.schedule.Emu``).

Executor: ``reset()`` (zero the per-sequence state and positions), ``put(name, array)``,
``get(name) -> array`` (the manifest buffer, shaped), ``run_phase(name)`` (one schedule).

The program (``plan.program.plan_program`` with lanes.mtp = K) has two schedules this loop uses:

* ``prefill``: a prompt chunk of pt rows per sequence through the target, then the MTP rows over
  the chunk (row t: the next prompt token — host-supplied in ``mnext``, −1 on a prompt's last row
  meaning "the target's freshly sampled token" — with the target's post-norm hidden of row t);
  this fills the MTP KV cache for the prompt, and after a prompt's last chunk its verify rows
  ``vtok[b] = [next, d1 … dK]`` are ready.
* ``verify``: the target over the K+1 rows ``vtok[b]`` at positions pos[b] … pos[b]+K, the argmax
  of every row, the accept kernel (n = leading drafts equal to the target's argmax; the GDN state
  rolls back by picking state slot n, the conv ring is kept by position), the MTP rows over the
  n+1 accepted rows, pos += n+1, and the drafts of the next verify. Out: ``emit[b, :count[b]]``.

One ``verify`` replay per step, then two small reads (``emit``, ``count``). Every sequence runs
every step (B is fixed); a sequence that has its tokens keeps running and its output is dropped,
so the cache needs ``tmax_needed`` positions.

Forced drafts (a test hook): ``draft_hook(b, position, proposed) -> token`` is called for each
draft before a verify (``position``: the absolute position the drafted token would occupy, prompt
tokens at 0 … L−1, as in ``speculative.speculative_generate``); a different return value
overwrites that verify row on the device. The device's later drafts (d2 …) were already made from
the device's own d1, so for K > 1 a forced d1 does not steer d2 the way the numpy reference's hook
does; the emitted tokens are greedy whatever the drafts are.
"""

from __future__ import annotations

from typing import Callable, Protocol

import numpy as np

from ..compare import nonfinite_where
from ..errors import UserError
from ..inputs import put_chunk
from ..sampling import put_greedy_params
from ..speculative import SpecStats

__all__ = ["Executor", "speculative_run", "tmax_needed"]

DraftHook = Callable[[int, int, int], int]


class Executor(Protocol):
    def reset(self) -> None: ...

    def put(self, name: str, arr) -> None: ...

    def get(self, name: str) -> np.ndarray: ...

    def run_phase(self, name: str) -> None: ...


def tmax_needed(prompts: list[list[int]], steps: int, k: int) -> int:
    """Cache positions the loop may touch: a sequence advances by at most k+1 per verify pass
    and there are at most steps − 1 passes; each pass writes rows up to pos + k."""
    return max(len(p) for p in prompts) + max(steps - 1, 0) * (k + 1) + k + 1


def speculative_run(ex: Executor, manifest: dict, prompts: list[list[int]], steps: int,
                    draft_hook: DraftHook | None = None, tmax: int | None = None,
                    record: bool = False):
    """Run prompts (at most B) through the mtp program; returns (tokens, stats, drafts).

    tokens: per prompt, exactly ``steps`` greedy token ids (the first from the prefill).
    stats: ``speculative.SpecStats`` per prompt (proposed / accepted drafts, verify passes, and
    where the first non-finite logit of a row the prompt's tokens came from was: every such row
    is scanned whole, the prefill's last row and each verify pass's K+1 rows).
    drafts: with record=True (or a hook), per prompt the list of (position, proposed draft)
    in the order proposed (before the hook replaced any); else empty lists.
    """
    lanes, sched = manifest["lanes"], manifest["schedule"]
    B, K, pt = lanes["batch"], int(lanes.get("mtp", 0)), sched["prefill_pt"]
    if not K or "verify" not in sched:
        raise UserError(f"program {manifest.get('lane_name')} is not an mtp lane (mtp=0); emit it "
                        "with --mtp K")
    KP = K + 1
    n = len(prompts)
    if not 1 <= n <= B:
        raise ValueError(f"{n} prompts for a batch of {B}")
    if min(len(p) for p in prompts) < 1:
        raise UserError("every prompt needs at least one token")
    if steps < 1:
        raise UserError(f"steps must be ≥ 1, got {steps}")
    need = tmax_needed(prompts, steps, K)
    if tmax is not None and need > tmax:
        raise UserError(f"speculative decoding of {steps} tokens with {K} drafts may touch "
                        f"{need} cache positions; the max context is {tmax}: pass a larger --ctx")
    padded = [list(p) for p in prompts] + [[0]] * (B - n)   # idle slots run a dummy sequence
    ex.reset()
    put_greedy_params(ex.put, manifest["buffers"], B)   # this run is greedy
    out: list[list[int]] = [[] for _ in range(n)]
    stats = SpecStats([0] * n, [0] * n, [0] * n, [0] * n, [[] for _ in range(n)], [None] * n)

    def scan(b: int, rows: np.ndarray, what: str) -> None:
        if stats.nonfinite[b] is None:
            stats.nonfinite[b] = nonfinite_where(np.asarray(rows, dtype=np.float32),
                                                 f"sequence {b} {what} logits")
    drafts: list[list[tuple[int, int]]] = [[] for _ in range(n)]
    vt = np.zeros((B, KP), np.int64)
    nch = [-(-len(p) // pt) for p in padded]

    # ---- prefill chunks (target + MTP rows over the chunk)
    for c in range(max(nch)):
        # packed (pt > 1); mnext: each row's next prompt token, −1: the chosen one
        chunks = [p[c * pt:(c + 1) * pt] for p in padded]
        nexts = [p[(c + 1) * pt] if (c + 1) * pt < len(p) else None for p in padded]
        ex.run_phase(put_chunk(ex.put, sched, chunks, nexts))
        ends = [b for b in range(B) if nch[b] == c + 1]
        if ends:
            nxt = ex.get("next").reshape(-1)
            v = ex.get("vtok").reshape(B, KP)
            lg = ex.get("logits")
            for b in ends:
                vt[b] = v[b]
                if b < n:
                    out[b].append(int(nxt[b]))
                    scan(b, lg[b], "prefill")
    pos = [len(p) for p in padded]
    ex.put("vtok", vt.reshape(-1).astype(np.int32))
    ex.put("ntok", np.full(B, KP, np.int32))

    # ---- verify + accept + MTP + drafts, one replay per step
    while any(len(o) < steps for o in out):
        act = [len(out[b]) < steps for b in range(n)]
        if draft_hook is not None or record:
            v = ex.get("vtok").reshape(B, KP).astype(np.int64)
            changed = False
            for b in range(n):
                if not act[b]:
                    continue
                for j in range(1, KP):
                    d = int(v[b, j])
                    drafts[b].append((pos[b] + j, d))
                    if draft_hook is not None:
                        f = int(draft_hook(b, pos[b] + j, d))
                        if f != d:
                            v[b, j], changed = f, True
            if changed:
                ex.put("vtok", v.reshape(-1).astype(np.int32))
        ex.run_phase("verify")
        em = ex.get("emit").reshape(B, KP)
        cnt = ex.get("count").reshape(-1)
        lg = ex.get("logits").reshape(B, KP, -1)
        for b in range(B):
            c = int(cnt[b])
            assert 1 <= c <= KP, (b, c)
            if b < n and act[b]:
                stats.proposed[b] += K
                stats.accepted[b] += c - 1
                stats.verify_passes[b] += 1
                stats.runs[b].append(c - 1)
                scan(b, lg[b], f"verify pass {stats.verify_passes[b]}")
                out[b].extend(int(t) for t in em[b, :c][:steps - len(out[b])])
            pos[b] += c
    return out, stats, drafts
