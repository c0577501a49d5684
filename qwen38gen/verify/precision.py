"""The program's precision measured against fp32, beside HF transformers' own bf16 inference.

The yardstick: users run Qwen3.5 in HF transformers in bf16 every day and accept its rounding.
So the tolerances of the locks are set from what HF's bf16 inference does to the same weights,
not guessed: for a model (synthetic int4 weights, as ``check --reference`` uses them) and prompts of
1, 7, 16 and 33 tokens, the program runs its own greedy streams at batch B; HF transformers runs
teacher-forced on each stream twice, in fp32 (the reference: it equals the numpy reference to
1e-5, tests/test_reference_hf.py) and in bf16, on the same dequantized weights (lm_head untied:
the program's lm_head is the int4 of a tied embedding). Measured per step and per layer:

* logits: max over the program's top-k token ids of |x − fp32| / σ, σ the fp32 row's standard
  deviation; the program's top-k logits, and HF bf16's logits at the same ids;
* state, per layer, at the end of the stream: ‖x − fp32‖ / ‖fp32‖ of the GDN recurrent state
  (fp32 in both) and conv ring, and of the attention K and V caches, for the program and HF bf16.

It needs a GPU with PyCUDA, torch and transformers (Qwen3_5ForCausalLM): ``scripts/precision.py``
runs it on the device and writes the JSON that ``docs/PRECISION.md`` is made from.
"""

from __future__ import annotations

import numpy as np

from ..compare import rel_error, worst
from ..config import DECODER, LM_HEAD, MTP, ModelConfig
from ..lanes import Lanes
from ..quantize import dequantized_weights
from ..reference import conv_to_ring
from .check import quantized_synthetic, reference_prompts, run_batches

STEPS = 16


def _one_tensor(args):
    """(cfg, seed, name, shape) -> (name, array or QuantizedTensor, its float32 dequantization
    or None): ``check.quantized_synthetic``'s tensor, in a worker process."""
    from ..config import EMBED
    from ..quantize import QuantizedTensor
    from ..weights import quantize_pack, synthetic_tensor

    cfg, seed, n, shape = args
    tied = cfg.tie_word_embeddings and n == LM_HEAD
    v = synthetic_tensor(EMBED if tied else n, shape, seed)
    if cfg.is_int4(n, shape):
        q, sc = quantize_pack(np.asarray(v, dtype=np.float32), n)
        qt = QuantizedTensor(q, sc, tuple(shape))
        return n, qt, qt.dequantize()
    return n, v, None


def quantized_synthetic_parallel(cfg: ModelConfig, jobs: int, seed: int = 0):
    """``check.quantized_synthetic(cfg, seed)`` (each tensor is seeded by its name, so the same
    arrays) and its dequantization, made by ``jobs`` processes: (tensors, dequantized)."""
    from concurrent.futures import ProcessPoolExecutor

    shapes = cfg.tensor_shapes(mtp=False)
    tensors, deq = {}, {}
    with ProcessPoolExecutor(max_workers=max(1, jobs)) as pool:
        for n, v, d in pool.map(_one_tensor, [(cfg, seed, n, sh) for n, sh in shapes.items()]):
            tensors[n] = v
            deq[n] = d if d is not None else np.asarray(v).astype(np.float32)
    return tensors, deq


def hf_models(cfg: ModelConfig, deq: dict, device: str = "cuda"):
    """(fp32, bf16) ``Qwen3_5ForCausalLM`` on ``device`` holding the dequantized weights
    ``deq`` (lm_head untied, MTP left out: HF has no MTP layer)."""
    import copy

    import torch
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    d = cfg.to_hf_dict()
    d["tie_word_embeddings"] = False
    conf = Qwen3_5TextConfig(**d)
    with torch.device(device):
        m = Qwen3_5ForCausalLM(conf)
    sd = {}
    for n, a in deq.items():
        if n.startswith(MTP):
            continue
        sd["model." + n[len(DECODER):] if n.startswith(DECODER) else n] = torch.from_numpy(
            np.ascontiguousarray(a, dtype=np.float32))
    if LM_HEAD not in sd:      # a tied config's lm_head is the embedding (quantize_pack'd)
        raise ValueError("the dequantized weights lack lm_head.weight")
    missing, unexpected = m.load_state_dict(sd, strict=False)
    if missing or unexpected:
        raise ValueError(f"HF state dict: missing {missing}, unexpected {unexpected}")
    m32 = m.float().eval()
    m16 = copy.deepcopy(m32).to(torch.bfloat16).eval()
    return m32, m16


def hf_teacher_forced(model, prompt: list[int], tokens: list[int], device: str = "cuda"):
    """HF prefill of ``prompt`` then one decode step per token of ``tokens[:-1]`` (as users run
    it: a cache, one token a step). Returns (logits [len(tokens), V] float64, per-layer final
    state {layer: {"rec", "conv", "k", "v"}} as float64 numpy)."""
    import torch

    rows = []
    with torch.no_grad():
        out = model(input_ids=torch.tensor([prompt], device=device), use_cache=True)
        rows.append(out.logits[0, -1].double().cpu().numpy())
        pkv = out.past_key_values
        for t in tokens[:-1]:
            out = model(input_ids=torch.tensor([[int(t)]], device=device), past_key_values=pkv,
                        use_cache=True)
            pkv = out.past_key_values
            rows.append(out.logits[0, -1].double().cpu().numpy())
    state = {}
    for i, layer in enumerate(pkv.layers):
        if getattr(layer, "recurrent_states", None) is not None:
            # HF keeps [batch, ...] tensors in a one-element list: [0][0] is sequence 0
            state[i] = {"rec": layer.recurrent_states[0][0].double().cpu().numpy(),  # [Hv, dk, dv]
                        "conv": layer.conv_states[0][0].double().cpu().numpy()}      # [C, K]
        else:
            state[i] = {"k": layer.keys[0].double().cpu().numpy(),            # [Hkv, T, D]
                        "v": layer.values[0].double().cpu().numpy()}
    return np.stack(rows), state


def _logit_errs(topk: list, f32: np.ndarray, other: np.ndarray | None = None) -> list[float]:
    """Per step: max over the run's top-k ids of |x − fp32| / σ(fp32 row); x is the run's own
    top-k logit, or ``other``'s logit at those ids."""
    errs = []
    for s, top in enumerate(topk):
        ids = np.array([i for i, _ in top])
        x = (np.array([v for _, v in top], np.float64) if other is None else other[s][ids])
        sigma = float(np.std(f32[s])) or 1.0
        errs.append(worst(np.abs(x - f32[s][ids]) / sigma))
    return errs


def _state_errs_prog(cfg: ModelConfig, bufs: dict, slot: int, f32: dict) -> dict:
    pos = int(bufs["pos"][slot])
    out = {}
    for j, L in enumerate(cfg.linear_layers):
        ring = conv_to_ring(f32[L]["conv"][:, 1:].T, pos)   # HF [C, K] -> ours [K-1, C] as a ring
        out[L] = {"rec": rel_error(bufs["rec"][j, slot], f32[L]["rec"]),
                  "conv": rel_error(bufs["conv"][j, slot], ring)}
    for j, L in enumerate(cfg.full_layers):
        out[L] = {"k": rel_error(bufs["kc"][j, slot][:, :pos], f32[L]["k"]),
                  "v": rel_error(bufs["vc"][j, slot][:, :pos], f32[L]["v"])}
    return out


def _state_errs_hf(bf16: dict, f32: dict) -> dict:
    return {L: {k: rel_error(bf16[L][k], f32[L][k]) for k in f32[L]} for L in f32}


def measure(cfg: ModelConfig, batches=(3, 16), steps: int = STEPS, tensors: dict | None = None,
            deq: dict | None = None, device: str = "cuda") -> dict:
    """The program at each B in ``batches`` and HF fp32 / bf16, as the module docstring says.

    Returns a JSON-able dict: {"model", "layers", "steps", "prompts": [lengths], "runs": [{"batch",
    "same_across_slots", "sequences": [{"prompt", "tokens", "logits": {"program", "hf_bf16"}
    (per step), "state": {"program", "hf_bf16"} ({layer: {kind: err}}), "argmax": {...}}]}]}."""
    tensors = tensors if tensors is not None else quantized_synthetic(cfg)
    deq = deq if deq is not None else dequantized_weights(tensors)
    prompts = reference_prompts(cfg)
    tmax = max(map(len, prompts)) + steps
    runs = []
    for B in batches:
        slots = [prompts[i % len(prompts)] for i in range(max(B, len(prompts)))]
        got, states = run_batches(cfg, Lanes.make(B, model=cfg), tensors, slots, steps, tmax,
                                  keep_state=True)
        runs.append({"batch": B, "got": got, "states": states})
    del tensors
    m32, m16 = hf_models(cfg, deq, device)
    del deq
    out = {"model": cfg.name, "layers": cfg.num_hidden_layers, "steps": steps,
           "prompts": [len(p) for p in prompts], "runs": []}
    hf_cache: dict = {}

    def forced(prompt, toks):
        key = (tuple(prompt), tuple(toks))
        if key not in hf_cache:   # the same stream at another B: HF's rows are the same
            hf_cache[key] = (hf_teacher_forced(m32, prompt, toks, device),
                             hf_teacher_forced(m16, prompt, toks, device))
        return hf_cache[key]

    for run in runs:
        B, got, states = run["batch"], run["got"], run["states"]
        same = all(got[i]["tokens"] == got[i % len(prompts)]["tokens"]
                   and got[i]["topk"] == got[i % len(prompts)]["topk"] for i in range(len(got)))
        seqs = []
        for p, prompt in enumerate(prompts):
            toks = got[p]["tokens"]
            (f32, s32), (b16, s16) = forced(prompt, toks)
            margin = np.sort(f32, axis=1)[:, -2:] @ np.array([-1.0, 1.0])
            sig = np.std(f32, axis=1)
            seqs.append({
                "prompt": len(prompt), "tokens": toks,
                "logits": {"program": _logit_errs(got[p]["topk"], f32),
                           "hf_bf16": _logit_errs(got[p]["topk"], f32, b16)},
                "state": {"program": _state_errs_prog(cfg, states[p // B], p % B, s32),
                          "hf_bf16": _state_errs_hf(s16, s32)},
                "argmax": {"program_agrees": [int(t) == int(np.argmax(r)) for t, r in zip(toks, f32)],
                           "hf_bf16_agrees": [int(np.argmax(a)) == int(np.argmax(r))
                                              for a, r in zip(b16, f32)],
                           "fp32_margin_sigma": (margin / sig).tolist()},
                "nonfinite": got[p].get("nonfinite"),
            })
        out["runs"].append({"batch": B, "same_across_slots": same, "sequences": seqs})
    return out


def hf_yardstick(cfg: ModelConfig, deq: dict, runs: list[dict], device: str = "cpu") -> dict:
    """HF bf16 against HF fp32 alone (no program) on recorded runs ({"prompt", "tokens",
    "topk"}: a golden file's sequences): per sequence the top-k logit error per step and the
    per-layer state error at the end. JSON-able, the shape of ``measure``'s hf_bf16 parts."""
    m32, m16 = hf_models(cfg, deq, device)
    seqs = []
    for r in runs:
        f32, s32 = hf_teacher_forced(m32, r["prompt"], r["tokens"], device)
        b16, s16 = hf_teacher_forced(m16, r["prompt"], r["tokens"], device)
        seqs.append({"prompt": len(r["prompt"]), "steps": len(r["tokens"]),
                     "logits": _logit_errs(r["topk"], f32, b16),
                     "state": _state_errs_hf(s16, s32)})
    return {"model": cfg.name, "layers": cfg.num_hidden_layers, "sequences": seqs}


def summary_rows(doc: dict) -> list[dict]:
    """Per run (model, B): the worst logit error and the worst state error (over layers, kinds,
    sequences) of the program and of HF bf16, and their ratio; plus the worst per layer."""
    rows = []
    for run in doc["runs"]:
        lp = worst(e for s in run["sequences"] for e in s["logits"]["program"])
        lh = worst(e for s in run["sequences"] for e in s["logits"]["hf_bf16"])
        per_layer = {}
        for who in ("program", "hf_bf16"):
            for s in run["sequences"]:
                for L, kinds in s["state"][who].items():
                    for k, e in kinds.items():
                        key = (int(L), k)
                        per_layer.setdefault(key, {}).setdefault(who, []).append(e)
        sp = worst(e for v in per_layer.values() for e in v["program"])
        sh = worst(e for v in per_layer.values() for e in v["hf_bf16"])
        ratio = worst(worst(v["program"]) / max(worst(v["hf_bf16"]), 1e-30)
                      for v in per_layer.values())
        rows.append({"model": doc["model"], "layers": doc["layers"], "batch": run["batch"],
                     "same_across_slots": run["same_across_slots"],
                     "logit_program": lp, "logit_hf_bf16": lh,
                     "state_program": sp, "state_hf_bf16": sh, "state_ratio_per_layer": ratio,
                     "per_layer": {f"{L}:{k}": {w: worst(v[w]) for w in v}
                                   for (L, k), v in sorted(per_layer.items())}})
    return rows
