"""`qwen38gen bench --peers`: fla's gated delta rule over the step's 48 GDN layers.

The peer is flash-linear-attention's decode kernel, ``fla.ops.gated_delta_rule.
fused_recurrent_gated_delta_rule`` (Triton), one token per sequence: q, k [B, 1, H, dk] and
v [B, 1, HV, dv] bf16, g (log decay) and beta [B, 1, HV] fp32, q and k L2-normalized in the
kernel, the fp32 state [B, HV, dk, dv] read and the new one written (as ours). Every layer has its
own state (one shared state would sit in L2). The 48 layers are one CUDA graph, replayed like our
step. It covers the recurrence only: our "delta rule" kind also runs the causal conv, the gates
and the gated RMSNorm, so the peer's time is a lower bound for the same work in fla.

Checked first on one small shape against a float32 recurrence written here (docs/MODEL.md §3:
S ← exp(g)·S; u = β·(v − Sᵀk); S ← S + k uᵀ; o = Sᵀq/√dk). It needs the ``fla-core`` and
``einops`` packages (carried to the GPU machine as wheels, README "On a GPU machine").
"""

from __future__ import annotations

import statistics

from ..config import ModelConfig
from .peers import available, graph_times, rel_err

LABEL = "fla fused_recurrent_gated_delta_rule (recurrence only)"
CHECK_TOL = 2e-2


def _fla():
    from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule

    return fused_recurrent_gated_delta_rule


def reference(q, k, v, g, beta, h0):
    """Float32 gated delta rule, one token: q, k [B, H, dk], v [B, HV, dv], g, beta [B, HV],
    h0 [B, HV, dk, dv] -> (o [B, HV, dv], h [B, HV, dk, dv]); q, k normalized, GVA over HV."""
    import torch

    rep = v.shape[1] // k.shape[1]
    qn = torch.nn.functional.normalize(q.float(), dim=-1).repeat_interleave(rep, dim=1)
    kn = torch.nn.functional.normalize(k.float(), dim=-1).repeat_interleave(rep, dim=1)
    h = h0.float() * torch.exp(g.float())[..., None, None]
    u = beta.float()[..., None] * (v.float() - torch.einsum("bhkv,bhk->bhv", h, kn))
    h = h + torch.einsum("bhk,bhv->bhkv", kn, u)
    o = torch.einsum("bhkv,bhk->bhv", h, qn) / q.shape[-1] ** 0.5
    return o, h


def inputs(B: int, H: int, HV: int, dk: int, dv: int, gen, device):
    import torch

    q = torch.randn(B, 1, H, dk, dtype=torch.bfloat16, device=device, generator=gen)
    k = torch.randn(B, 1, H, dk, dtype=torch.bfloat16, device=device, generator=gen)
    v = torch.randn(B, 1, HV, dv, dtype=torch.bfloat16, device=device, generator=gen)
    g = -torch.rand(B, 1, HV, device=device, generator=gen) * 0.1     # log decay in (-0.1, 0]
    beta = torch.rand(B, 1, HV, device=device, generator=gen)
    return q, k, v, g, beta


def check(cfg: ModelConfig, gen, device, B: int = 2) -> float:
    """fla's output and new state against ``reference`` (max error over max |ref|)."""
    import torch

    H, HV = cfg.linear_num_key_heads, cfg.linear_num_value_heads
    dk, dv = cfg.linear_key_head_dim, cfg.linear_value_head_dim
    q, k, v, g, beta = inputs(B, H, HV, dk, dv, gen, device)
    h0 = torch.randn(B, HV, dk, dv, device=device, generator=gen) * 0.05
    o, ht = _fla()(q, k, v, g=g, beta=beta, initial_state=h0, output_final_state=True,
                   use_qk_l2norm_in_kernel=True)
    ro, rh = reference(q[:, 0], k[:, 0], v[:, 0], g[:, 0], beta[:, 0], h0)
    return max(rel_err(o[:, 0], ro), rel_err(ht, rh))


def time_layers(cfg: ModelConfig, B: int, warmup: int, reps: int, gen, device) -> list[float]:
    """Seconds per replay of one CUDA graph of the 48 layers' recurrences at batch B."""
    import torch

    f = _fla()
    H, HV = cfg.linear_num_key_heads, cfg.linear_num_value_heads
    dk, dv = cfg.linear_key_head_dim, cfg.linear_value_head_dim
    n = len(cfg.linear_layers)
    q, k, v, g, beta = inputs(B, H, HV, dk, dv, gen, device)
    states = [torch.randn(B, HV, dk, dv, device=device, generator=gen) * 0.05 for _ in range(n)]

    def step():
        return [f(q, k, v, g=g, beta=beta, initial_state=s, output_final_state=True,
                  use_qk_l2norm_in_kernel=True) for s in states]

    return graph_times(step, warmup, reps)     # the warm-up compiles the Triton kernels


def run(cfg: ModelConfig, batches: list[int], warmup: int = 5, reps: int = 30, seed: int = 0,
        progress=None) -> dict:
    """The JSON "delta_rule" object: "ok", "error", "check_err", "rows" [{"batch", "ms",
    "ms_spread"}]; a failure (no fla, a wrong result, out of memory) is reported, not raised."""
    r = {"label": LABEL, "layers": len(cfg.linear_layers), "ok": False, "error": None,
         "check_err": None, "rows": []}
    ok, why = available()
    if not ok:
        r["error"] = why
        return r
    import gc

    import torch

    device = torch.device("cuda", 0)
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    try:
        if progress:
            progress("peers: fla delta rule: check")
        r["check_err"] = check(cfg, gen, device)
        if not r["check_err"] < CHECK_TOL:
            raise RuntimeError(f"wrong result: max error {r['check_err']:.3g} of max |ref| "
                               f"(tolerance {CHECK_TOL})")
        for B in batches:
            if progress:
                progress(f"peers: fla delta rule: B={B}: timing {reps} graph replays")
            t = time_layers(cfg, B, warmup, reps, gen, device)
            r["rows"].append({"batch": B, "ms": statistics.median(t) * 1e3,
                              "ms_spread": [min(t) * 1e3, max(t) * 1e3]})
        r["ok"] = True
    except Exception as e:  # no fla, a compile error, out of memory, a failed check
        r["error"] = f"{type(e).__name__}: {e}".splitlines()[0][:300]
    finally:
        gc.collect()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    return r


def lines(r: dict, rows) -> list[str]:
    """One line per B beside our delta rule kind's graph time, or why it did not run."""
    if not r["ok"]:
        return [f"peers: {r['label']} failed: {r['error']}"]
    ours = {x.batch: x.graph_ms.get("delta rule") for x in rows}
    return [f"peers: {r['label']}, {r['layers']} layers, B={x['batch']}: {x['ms']:.3f} ms "
            f"(our delta rule kind, conv and norms included: "
            f"{ours[x['batch']]:.3f} ms)" if ours.get(x["batch"]) is not None else
            f"peers: {r['label']}, {r['layers']} layers, B={x['batch']}: {x['ms']:.3f} ms"
            for x in r["rows"]]
