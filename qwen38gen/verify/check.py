"""The equivalence locks: build a program, run it on the golden prompts, compare.

* ``run_batches``: prompts through a Runtime, B at a time (more prompts than B run in successive
  batches).
* ``update_golden``: the batch-1 program's runs, checked against the numpy reference, written.
* ``validate_golden``: the committed golden file against the reference (CPU, what CI runs).
* ``check_gpu``: the batched program teacher-forced on the golden streams, against the golden
  file (bitwise where the same kernel path runs) and its final state against the reference.
"""

from __future__ import annotations

import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..build import build
from ..compare import rel_error, worst
from ..config import PRESETS, ModelConfig
from ..errors import UserError
from ..interrupt import in_worker
from ..lanes import Lanes
from ..outputs import write_text
from ..weights import default_tensors
from . import golden as G


def check_model(spec, folder: Path | None = None) -> ModelConfig:
    """`check --model SPEC`: the preset whose golden runs `check` compares against. Golden runs
    are of a preset's seeded synthetic weights, so a checkpoint's weights, or a geometry without
    a golden file in ``folder`` (default: the packaged one), are refused naming those that have
    one. A config.json or a folder of only a config.json of such a preset's geometry is that
    preset."""
    from ..config import resolve_model

    resolved = resolve_model(spec)
    names = [n for n in PRESETS if G.golden_path(PRESETS[n], folder=folder).is_file()]
    names = names or [G.MODEL]   # no golden file at all: load_golden names the missing one
    match = next((PRESETS[n] for n in names if PRESETS[n].hash == resolved.config.hash), None)
    if resolved.has_weights or match is None:
        lack = "weights have" if resolved.has_weights else "geometry has"
        raise UserError(f"check --model {str(spec)!r}: check compares against the golden runs, "
                        f"which exist only for {', '.join(names)} (its seeded synthetic "
                        f"weights); this model's {lack} none. Check a geometry with `qwen38gen check "
                        "--reference MODEL` (against the numpy reference), a checkpoint's text "
                        "with `qwen38gen run --backend reference --model DIR` against `--backend gpu`")
    return match


def run_batches(cfg, lanes, tensors, prompts, steps, tmax, forced=None, topk=True,
                keep_state=False):
    from ..runtime import Runtime

    cubin, manifest = build(cfg, lanes)
    out, states = [], []
    with Runtime(cubin, manifest, cfg, tensors, tmax) as rt:
        for i in range(0, len(prompts), lanes.batch):
            chunk = prompts[i:i + lanes.batch]
            f = forced[i:i + lanes.batch] if forced is not None else None
            out += rt.generate(chunk, steps, topk=topk, forced=f)
            if keep_state:
                states.append({n: rt.get(n) for n in ("rec", "conv", "kc", "vc", "pos")})
    return out, states


# ------------------------------------------------------------------------------- reference side
_REF = {}


def _ref_worker(args):
    """(prompt, tokens) -> teacher-forced reference logits and final state, in a subprocess."""
    prompt, tokens = args
    if "ref" not in _REF:
        from ..quantize import int4_weights
        from ..reference import Reference

        cfg = PRESETS[G.MODEL]
        _REF["ref"] = Reference(cfg, int4_weights(cfg, default_tensors(cfg)))
    lg, st = G.reference_logits(_REF["ref"], prompt, tokens)
    return lg, st


def reference_runs(pairs: list[tuple[list[int], list[int]]]):
    """Teacher-forced reference runs of (prompt, tokens) pairs, spread over the CPU cores."""
    jobs = max(1, min(len(pairs), os.cpu_count() or 1))
    if jobs == 1:
        return [_ref_worker(p) for p in pairs]
    pool = ProcessPoolExecutor(max_workers=jobs, initializer=in_worker)
    try:
        return list(pool.map(_ref_worker, pairs))
    finally:   # on a signal: drop the runs not started; the workers end with their current one
        pool.shutdown(wait=True, cancel_futures=True)


@dataclass
class Outcome:
    ok: bool
    rows: list[list[str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def validate_golden(g: G.Golden) -> Outcome:
    """Every golden sequence against the reference teacher-forced on its own token stream."""
    refs = reference_runs([(s["prompt"], s["tokens"]) for s in g.sequences])
    out = Outcome(ok=True)
    for i, (s, (lg, _)) in enumerate(zip(g.sequences, refs)):
        r = G.compare_to_reference(s, lg, i)
        out.ok &= r.ok
        if r.nonfinite:
            out.notes.append(f"sequence {i}: non-finite: {r.nonfinite}")
        out.rows.append([str(i), str(len(s["prompt"])), str(r.steps), f"{r.max_logit_err:.3f}",
                         f"{r.argmax_checked - r.argmax_mismatch}/{r.argmax_checked}",
                         "ok" if r.ok else "MISMATCH"])
    return out


def update_golden(cfg: ModelConfig | None = None, candidate: Path | None = None,
                  folder: Path | None = None) -> tuple[Outcome, Path | None]:
    """Produce the golden runs with the batch-1 program; write them only if the reference agrees,
    into ``folder`` (default: the packaged golden/ folder).

    ``candidate``: also write the runs there whatever the outcome (for inspecting a failure)."""
    cfg = cfg or PRESETS[G.MODEL]
    lanes = G.golden_lanes()
    prompts = G.golden_prompts(cfg)
    seqs, _ = run_batches(cfg, lanes, default_tensors(cfg), prompts, G.STEPS,
                          tmax=max(map(len, prompts)) + G.STEPS)
    for p, s in zip(prompts, seqs):
        s["prompt"] = p
    g = G.Golden(cfg_hash=cfg.hash, lane=lanes.name, seed=G.SEED, steps=G.STEPS,
                 sequences=[{"prompt": s["prompt"], "tokens": s["tokens"], "topk": s["topk"]}
                            for s in seqs])
    if candidate is not None:
        write_text(candidate, g.to_json(), name="--candidate")
    out = validate_golden(g)
    if not out.ok:
        return out, None
    path = G.golden_path(cfg, lanes, folder)
    write_text(path, g.to_json())
    return out, path


def state_errors(cfg: ModelConfig, bufs: dict, slot: int, st, b: int = 0) -> dict[str, float]:
    """One sequence's final state in the program's buffers (``bufs``: rec, conv, kc, vc and pos
    as Runtime.get returns them, the sequence in row ``slot``) against the reference State ``st``
    (row ``b``): the worst relative error over the layers, for the recurrent state, the conv ring
    (the reference's last K-1 rows laid out as the kernel's ring, reference.conv_to_ring) and the
    K and V caches up to the sequence's position."""
    by_layer = state_errors_by_layer(cfg, bufs, slot, st, b)
    return {k: worst(v.values()) for k, v in by_layer.items()}


def state_errors_by_layer(cfg: ModelConfig, bufs: dict, slot: int, st,
                          b: int = 0) -> dict[str, dict[int, float]]:
    """``state_errors`` per layer: {"rec" | "conv": {GDN layer: err}, "k" | "v": {attention
    layer: err}} (layer indices of the model, 0 = first)."""
    from ..reference import conv_to_ring

    pos = int(bufs["pos"][slot])
    gdn = list(enumerate(cfg.linear_layers))
    attn = list(enumerate(cfg.full_layers))
    return {
        "rec": {L: rel_error(bufs["rec"][j, slot], st.rec[L][b]) for j, L in gdn},
        "conv": {L: rel_error(bufs["conv"][j, slot], conv_to_ring(st.conv[L][b], pos)) for j, L in gdn},
        "k": {L: rel_error(bufs["kc"][j, slot][:, :pos], st.k[L][b]) for j, L in attn},
        "v": {L: rel_error(bufs["vc"][j, slot][:, :pos], st.v[L][b]) for j, L in attn},
    }


def state_ratio(cfg: ModelConfig, bufs: dict, slot: int, st, setting: str, b: int = 0) -> float:
    """The worst over layers and kinds of (state error / its tolerance, golden.tol_state): ≤ 1
    passes; NaN where any error is NaN."""
    by_layer = state_errors_by_layer(cfg, bufs, slot, st, b)
    return worst(e / G.tol_state(setting, L) for kinds in by_layer.values()
                   for L, e in kinds.items())


def state_nonfinite(cfg: ModelConfig, bufs: dict, slot: int) -> str | None:
    """Where the first non-finite value of slot ``slot``'s state is (recurrent state, conv ring,
    then the K and V caches below the slot's position), or None."""
    pos = int(bufs["pos"][slot])
    parts = [(f"recurrent state of layer {L}", bufs["rec"][j, slot])
             for j, L in enumerate(cfg.linear_layers)]
    parts += [(f"conv ring of layer {L}", bufs["conv"][j, slot])
              for j, L in enumerate(cfg.linear_layers)]
    parts += [(f"{n} cache of layer {L}", bufs[c][j, slot][:, :pos])
              for j, L in enumerate(cfg.full_layers) for n, c in (("K", "kc"), ("V", "vc"))]
    for what, a in parts:
        where = G.nonfinite_where(np.asarray(a, dtype=np.float32), f"slot {slot} {what}")
        if where:
            return where
    return None



def check_gpu(lanes: Lanes, g: G.Golden, cfg: ModelConfig | None = None) -> Outcome:
    """The batched program on the golden streams: tokens and top-k against the golden file,
    final states against the reference."""
    cfg = cfg or PRESETS[G.MODEL]
    n = len(g.sequences)
    count = max(n, lanes.batch)       # fill every slot of a large batch (prompts cycle)
    seqs = [g.sequences[i % n] for i in range(count)]
    prompts = [s["prompt"] for s in seqs]
    forced = [s["tokens"] for s in seqs]
    tmax = max(map(len, prompts)) + g.steps
    got, states = run_batches(cfg, lanes, default_tensors(cfg), prompts, g.steps, tmax,
                              forced=forced, keep_state=True)
    same_path = lanes.pt == G.golden_lanes().pt
    refs = reference_runs([(s["prompt"], s["tokens"]) for s in g.sequences])
    out = Outcome(ok=True)
    out.notes.append(
        "bitwise: the tokens and top-k logits must equal the batch-1 golden run bit for bit, "
        "since every kernel computes a row the same way whatever the batch and the batch tile "
        f"(pt={lanes.pt} is the golden pt)" if same_path else
        f"pt={lanes.pt} differs from the golden pt={G.golden_lanes().pt}: prompt chunks run "
        "different kernel instances, so the comparison is within the named tolerances")
    B = lanes.batch
    for i, (s, r) in enumerate(zip(seqs, got)):
        gi = i % n
        lg, st = refs[gi]
        rep = G.compare_to_reference(r, lg, gi, "golden", cfg.num_hidden_layers)
        bit = r["tokens"] == s["tokens"] and r["topk"] == s["topk"]
        tok_eq = r["tokens"] == s["tokens"]
        ok = rep.ok and (bit if same_path else True)
        # Final state of this slot against the reference (same token stream).
        sb, slot = states[i // B], i % B
        pos = int(sb["pos"][slot])
        state_err = state_ratio(cfg, sb, slot, st, "golden")
        ok &= state_err <= 1.0 and pos == len(s["prompt"]) + g.steps - 1
        where = rep.nonfinite or state_nonfinite(cfg, sb, slot)
        if where:
            ok = False
            out.notes.append(f"slot {i}: non-finite: {where}")
        out.ok &= ok
        out.rows.append([str(i), str(gi), str(len(s["prompt"])),
                         "yes" if bit else ("tokens" if tok_eq else "no"),
                         f"{rep.max_logit_err:.3f}",
                         f"{rep.argmax_checked - rep.argmax_mismatch}/{rep.argmax_checked}",
                         f"{state_err:.2f}", "ok" if ok else "MISMATCH"])
    out.notes.append(_rule_note("golden", cfg))
    return out


def _rule_note(setting: str, cfg: ModelConfig) -> str:
    L = cfg.num_hidden_layers
    return (f"tolerances (docs/PRECISION.md): {G.RULE} × HF transformers' own bf16 error at the "
            f"same depth ({setting} setting): |Δlogit| ≤ {G.tol_logits(setting, L):.3f} σ of the "
            f"reference row, argmax where its top-2 margin > {G.argmax_margin(setting, L):.3f} σ, "
            f"state error per layer ≤ {G.tol_state(setting, 0):.3g} (first layer) … "
            f"{G.tol_state(setting, L - 1):.3g} (layer {L - 1}); 'state' is the worst error / "
            "tolerance (≤ 1 passes)")


def check_spec(lanes: Lanes, g: G.Golden, cfg: ModelConfig | None = None) -> Outcome:
    """`check --mtp K`: speculative decoding with the mtp program (qwen38gen.verify.spec_runtime) on
    every golden prompt, B at a time (prompts cycle to fill a large batch): its token streams
    must equal the golden greedy streams exactly. Twice: with the program's own drafts, and with
    the drafts forced right from the golden stream (then every verify pass but a sequence's last
    must accept all K drafts, which exercises the multi-token accept and the state-slot rollback).
    Rows: mode, slot, golden sequence, prompt length, tokens, acceptance, target passes, status."""
    from ..runtime import Runtime
    from .spec_runtime import speculative_run, tmax_needed

    cfg = cfg or PRESETS[G.MODEL]
    K, B = lanes.mtp, lanes.batch
    n = len(g.sequences)
    count = max(n, B)
    seqs = [g.sequences[i % n] for i in range(count)]
    prompts = [s["prompt"] for s in seqs]
    want = [s["tokens"][:g.steps] for s in seqs]
    tmax = tmax_needed(prompts, g.steps, K)
    cubin, man = build(cfg, lanes)
    out = Outcome(ok=True)
    out.notes.append(
        f"mtp={K}: each verify pass runs {K + 1} rows per sequence through the target (other kernel "
        "instances than the golden batch-1 program's decode), so a token can differ from the golden "
        "one only at a near tie; a mismatch row names the step and the golden top-2 margin there")
    with Runtime(cubin, man, cfg, default_tensors(cfg, mtp=True), tmax) as rt:
        for mode in ("own drafts", "forced right"):
            for i0 in range(0, count, B):
                chunk, w = prompts[i0:i0 + B], want[i0:i0 + B]

                def hook(b, position, d, chunk=chunk, w=w):
                    j = position - len(chunk[b])
                    return w[b][j] if 0 <= j < len(w[b]) else d

                got, st, _ = speculative_run(rt, man, chunk, g.steps, tmax=tmax,
                                             draft_hook=hook if mode == "forced right" else None)
                for j, (tok, wt) in enumerate(zip(got, w)):
                    i = i0 + j
                    eq = tok == wt
                    if eq:
                        tcell = "equal"
                    else:
                        s = next(k for k, (a, b) in enumerate(zip(tok, wt)) if a != b)
                        tk = seqs[i]["topk"][s]
                        tcell = (f"differs at step {s} (golden top-2 margin "
                                 f"{tk[0][1] - tk[1][1]:.3g})")
                    ok = eq
                    if mode == "forced right":
                        ok &= all(r == K for r in st.runs[j][:-1])
                    if st.nonfinite[j]:
                        ok = False
                        out.notes.append(f"{mode}, slot {i}: non-finite: {st.nonfinite[j]}")
                    out.ok &= ok
                    out.rows.append([mode, str(i), str(i % n), str(len(prompts[i])), tcell,
                                     f"{st.accepted[j]}/{st.proposed[j]} = "
                                     f"{st.acceptance_rate[j]:.2f}",
                                     str(st.verify_passes[j]), "ok" if ok else "MISMATCH"])
    return out


# ------------------------------------------------------------------ `check --reference MODEL`
REF_PROMPT_LENGTHS = (1, 7, 16, 33)   # one token, within one chunk, a full chunk, three chunks
REF_STEPS = 16


def reference_prompts(cfg: ModelConfig, seed: int = G.PROMPT_SEED) -> list[list[int]]:
    """The prompts of `check --reference` (seeded token ids, REF_PROMPT_LENGTHS)."""
    rng = np.random.default_rng(seed)
    return [[int(t) for t in rng.integers(0, cfg.vocab_size, n)] for n in REF_PROMPT_LENGTHS]


def quantized_synthetic(cfg: ModelConfig, seed: int = G.SEED) -> dict:
    """Seeded synthetic weights with every linear weight quantized once (int4 g128
    `QuantizedTensor`s): the program packs them as they are and the reference computes with
    their dequantization, so both see the same int4 weights."""
    from ..quantize import QuantizedTensor
    from ..weights import quantize_pack

    shapes = cfg.tensor_shapes()
    out = {}
    for n, v in default_tensors(cfg, seed).items():
        if n in shapes and cfg.is_int4(n, shapes[n]):
            q, s = quantize_pack(np.asarray(v, dtype=np.float32), n)
            out[n] = QuantizedTensor(q, s, tuple(v.shape))
        else:
            out[n] = v
    return out


def compare_with_reference(cfg: ModelConfig, prompts: list[list[int]], got: list[dict],
                           states: list[dict], batch: int, refs: list) -> Outcome:
    """The program's own greedy runs against the reference teacher-forced on them.

    ``got[i]``: slot i's run ({"tokens", "topk"}) of prompt ``i % len(prompts)`` (prompts cycle
    to fill the batch); ``states[i // batch]``: the buffers (rec, conv, kc, vc, pos) after the
    batch that held slot i; ``refs[p]``: (logits, State) of the reference teacher-forced on the
    token stream of slot p (the first slot of prompt p). Per slot: its stream equals the first
    slot's of the same prompt (every row computes alike whatever its slot), its top-k logits are
    within the "reference" setting's logit tolerance (golden.tol_logits, in units of the σ of each
    reference row) and its argmax agrees wherever the reference's top-2 margin exceeds
    golden.argmax_margin, and its final state is within golden.tol_state layer by layer. Rows:
    slot, prompt, prompt length, same as first, σ (of the sequence's reference logits),
    max |Δlogit| / σ, argmax, state err / tol, status."""
    n = len(prompts)
    sigma = [float(np.std(lg)) or 1.0 for lg, _ in refs]
    out = Outcome(ok=True)
    for i, r in enumerate(got):
        p = i % n
        lg, st = refs[p]
        rep = G.compare_to_reference(r, lg, p, "reference", cfg.num_hidden_layers)
        same = r["tokens"] == got[p]["tokens"] and r["topk"] == got[p]["topk"]
        sb, slot = states[i // batch], i % batch
        pos = int(sb["pos"][slot])
        state_err = state_ratio(cfg, sb, slot, st, "reference")
        ok = (rep.ok and same and state_err <= 1.0
              and pos == len(prompts[p]) + len(r["tokens"]) - 1)
        where = rep.nonfinite or state_nonfinite(cfg, sb, slot)
        if where:
            ok = False
            out.notes.append(f"slot {i}: non-finite: {where}")
        out.ok &= ok
        out.rows.append([str(i), str(p), str(len(prompts[p])), "yes" if same else "no",
                         f"{sigma[p]:.2f}", f"{rep.max_logit_err:.3f}",
                         f"{rep.argmax_checked - rep.argmax_mismatch}/{rep.argmax_checked}",
                         f"{state_err:.2f}", "ok" if ok else "MISMATCH"])
    out.notes.append(
        f"{cfg.name}, synthetic int4 weights (seed {G.SEED}): the program's greedy streams, the "
        "reference teacher-forced on each; " + _rule_note("reference", cfg))
    return out


def check_reference(cfg: ModelConfig, lanes: Lanes, steps: int = REF_STEPS) -> Outcome:
    """`check --reference`: the program of ``cfg`` (any supported geometry, e.g. a published
    dense size) on synthetic int4 weights, its own greedy streams on REF_PROMPT_LENGTHS prompts
    (cycled to fill the batch) against the numpy reference teacher-forced on them."""
    from ..quantize import dequantized_weights
    from ..reference import Reference

    prompts = reference_prompts(cfg)
    count = max(len(prompts), lanes.batch)
    slots = [prompts[i % len(prompts)] for i in range(count)]
    tensors = quantized_synthetic(cfg)
    got, states = run_batches(cfg, lanes, tensors, slots, steps,
                              tmax=max(map(len, prompts)) + steps, keep_state=True)
    ref = Reference(cfg, dequantized_weights(tensors))
    refs = [G.reference_logits(ref, p, got[i]["tokens"]) for i, p in enumerate(prompts)]
    return compare_with_reference(cfg, prompts, got, states, lanes.batch, refs)
