"""`qwen38gen bench --peers`: torch's own kernels over the linear layers of one decode step.

Two peers, each timed as a CUDA graph of the whole step's linear layers (the 64 layers' fused
in / out / gate_up / down weights and lm_head, in step order, the shapes of `plan.entries.fused_weights`),
replayed like our own step (warm-up, then the median of `reps` replays timed with CUDA events):

- ``cublas_bf16``: y = x @ W.T, x [B, k] and W [rows, k] bf16 (``torch.nn.functional.linear``);
- ``int4pack``: PyTorch's built-in int4 g128 ("tinygemm"), ``torch._weight_int4pack_mm(x, Wp,
  128, scales_and_zeros)`` on weights packed by ``torch._convert_weight_to_int4pack``;
- ``gemlite``: GemLite's A16W4 Triton kernels (``gemlite.GemLiteLinear``, 4-bit, group 128, bf16
  in and out, HQQ's (W_q − zero) · scale), its shipped H100 configs loaded so that no autotuning
  runs inside the timing; it needs the ``gemlite`` package (carried to the GPU machine as a wheel,
  README "On a GPU machine").

Every layer's weight is its own allocation (one shared weight would sit in the 50 MB L2 and
flatter the peer). One peer's weights (bf16: 2 bytes/param, about 51 GB for 27B) are allocated
at a time, on the GPU from torch's generator, and freed before the next. Each peer is first
checked on one shape against a float32 matmul of the same (dequantized) weights; a peer that
fails the check, or raises, is reported with the reason instead of a time.

torch is imported inside the functions only: it is not a dependency of the package.

tinygemm's formats (aten/src/ATen/native/cuda/int4mm.cu):
- packing input: uint8 [n, k/2], element k = 2j in the HIGH nibble of byte j, 2j+1 in the low;
- scales_and_zeros: [k / group, n, 2] in x's dtype, [..., 0] the scale, [..., 1] the zero;
- dequant: w = (q - 8) * scale + zero, q in 0..15 (computed in bf16 by the kernel);
- inner_k_tiles 2, 4 or 8: k must be a multiple of inner_k_tiles * 16; n a multiple of 8.
The CPU variants (``_convert_weight_to_int4pack_for_cpu`` takes int32 [n, k] values 0..15) use
the same scales_and_zeros and dequant; the tests check those there.
"""

from __future__ import annotations

import functools
import statistics

from ..config import ModelConfig
from ..plan.entries import fused_weights

GROUP = 128
INNER_K_TILES = 8        # 16-byte loads, gpt-fast's default; our k (5120, 6144, 17408) % 128 == 0
# Peer check: max |y - ref| / max |ref| on one layer's shape. The reference is float32 on the
# same bf16 (dequantized) weights, so the difference is the bf16 rounding of the output
# (2^-8 relative) plus summation order; a wrong layout (nibble order, scale layout) gives O(1).
CHECK_TOL = 2e-2
PEERS = ("cublas_bf16", "int4pack", "gemlite")
LABELS = {"cublas_bf16": "cuBLAS bf16 (F.linear)", "int4pack": "torch int4 g128 (_weight_int4pack_mm)",
          "gemlite": "GemLite A16W4 g128 (GemLiteLinear)"}
SHORT = {"cublas_bf16": "cuBLAS bf16", "int4pack": "torch int4pack", "gemlite": "GemLite int4"}


def linear_shapes(cfg: ModelConfig) -> list[tuple[str, int, int]]:
    """(name, rows, k) of every linear layer of one decode step, in step order (fused, padded)."""
    return [(n, w["rows"], w["k"]) for n, w in fused_weights(cfg).items()]


def available() -> tuple[bool, str]:
    """(True, torch/CUDA versions) or (False, why the peers cannot run)."""
    try:
        import torch
    except Exception as e:  # ImportError, or a broken install
        return False, f"torch is not importable ({type(e).__name__}: {e})"
    if not torch.cuda.is_available():
        return False, f"torch {torch.__version__} has no CUDA device"
    return True, f"torch {torch.__version__}, CUDA {torch.version.cuda}"


# ------------------------------------------------------------------------ int4 format helpers
def random_int4(n: int, k: int, gen, device):
    """Random tinygemm weight: (uint8 [n, k/2] nibble pairs, scales_and_zeros [k/128, n, 2] bf16)."""
    import torch

    u8 = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, device=device, generator=gen)
    sz = torch.empty(k // GROUP, n, 2, dtype=torch.bfloat16, device=device)
    sz[..., 0].uniform_(0.005, 0.015, generator=gen)     # scale
    sz[..., 1].uniform_(-0.02, 0.02, generator=gen)      # zero
    return u8, sz


def unpack_u8(u8):
    """uint8 [n, k/2] -> int32 [n, k], values 0..15; even k from the high nibble."""
    import torch

    n, h = u8.shape
    q = torch.empty(n, 2 * h, dtype=torch.int32, device=u8.device)
    q[:, 0::2] = (u8 >> 4).to(torch.int32)
    q[:, 1::2] = (u8 & 15).to(torch.int32)
    return q


def dequant(q, sz):
    """int32 [n, k] (0..15) and scales_and_zeros [k/128, n, 2] -> W [n, k] bf16, as the kernel."""
    import torch

    s = sz[..., 0].float().t().repeat_interleave(GROUP, dim=1)     # [n, k]
    z = sz[..., 1].float().t().repeat_interleave(GROUP, dim=1)
    return ((q.float() - 8.0) * s + z).to(torch.bfloat16)


def rel_err(y, ref) -> float:
    y, ref = y.float(), ref.float()
    return float((y - ref).abs().max() / ref.abs().max().clamp_min(1e-30))


def gemlite_layer(n: int, k: int, gen, device):
    """One GemLite A16W4 g128 layer on random codes: (the packed layer, (codes, scales, zeros))
    with W = (codes − zeros) · scales, codes uint8 [n, k] in 0..15, scales and zeros [n, k/128]."""
    import torch
    from gemlite import DType, GemLiteLinear

    _gemlite_configs()
    wq = torch.randint(0, 16, (n, k), dtype=torch.uint8, device=device, generator=gen)
    sc = torch.empty(n, k // GROUP, dtype=torch.bfloat16, device=device).uniform_(
        0.005, 0.015, generator=gen)
    ze = torch.full((n, k // GROUP), 8.0, dtype=torch.bfloat16, device=device)
    lin = GemLiteLinear(4, group_size=GROUP, in_features=k, out_features=n,
                        input_dtype=DType.BF16, output_dtype=DType.BF16)
    lin.pack(wq, sc, ze, None)
    return lin, (wq, sc, ze)


@functools.cache
def _gemlite_configs() -> bool:
    """Load GemLite's shipped H100 kernel configs once (sm_90: the H200 too), so that the first
    call of a shape picks a config instead of autotuning."""
    import os

    import gemlite
    from gemlite import GemLiteLinear

    path = os.path.join(os.path.dirname(gemlite.__file__), "configs", "h100.json")
    return GemLiteLinear.load_config(path, print_error=False)


def _nbytes(ts) -> int:
    import torch

    return sum(t.numel() * t.element_size() for t in ts if isinstance(t, torch.Tensor))


# ------------------------------------------------------------------------------------- peers
class _Peer:
    """Weights for every linear layer of the step, and the call of one layer."""

    def __init__(self, kind: str, shapes, gen, device):
        import torch

        self.kind, self.w, self.nbytes = kind, [], 0
        for _, n, k in shapes:
            if kind == "cublas_bf16":
                w = torch.empty(n, k, dtype=torch.bfloat16, device=device).uniform_(
                    -0.05, 0.05, generator=gen)
                self.w.append((w,))
                self.nbytes += w.numel() * w.element_size()
            elif kind == "gemlite":
                lin, raw = gemlite_layer(n, k, gen, device)
                del raw
                self.w.append((lin,))
                self.nbytes += _nbytes(lin.get_tensor_args())
            else:
                u8, sz = random_int4(n, k, gen, device)
                wp = torch._convert_weight_to_int4pack(u8, INNER_K_TILES)
                del u8
                self.w.append((wp, sz))
                self.nbytes += wp.numel() * wp.element_size() + sz.numel() * sz.element_size()

    def layer(self, x, i: int):
        import torch

        if self.kind == "cublas_bf16":
            return torch.nn.functional.linear(x, self.w[i][0])
        if self.kind == "gemlite":
            return self.w[i][0](x)
        wp, sz = self.w[i]
        return torch._weight_int4pack_mm(x, wp, GROUP, sz)


def check_peer(kind: str, n: int, k: int, B: int, gen, device) -> tuple[float, str]:
    """Relative error of the peer against float32 x @ W.T on one shape (its own allocations),
    and a hint for a failure (int4: the error had the nibbles been the other way round)."""
    import torch

    x = torch.randn(B, k, dtype=torch.bfloat16, device=device, generator=gen)
    if kind == "cublas_bf16":
        w = torch.empty(n, k, dtype=torch.bfloat16, device=device).uniform_(-0.05, 0.05,
                                                                            generator=gen)
        return rel_err(torch.nn.functional.linear(x, w), x.float() @ w.float().t()), ""
    if kind == "gemlite":
        lin, (wq, sc, ze) = gemlite_layer(n, k, gen, device)
        w = ((wq.float() - ze.float().repeat_interleave(GROUP, dim=1))
             * sc.float().repeat_interleave(GROUP, dim=1))
        return rel_err(lin(x), x.float() @ w.t()), ""
    u8, sz = random_int4(n, k, gen, device)
    y = torch._weight_int4pack_mm(x, torch._convert_weight_to_int4pack(u8, INNER_K_TILES),
                                  GROUP, sz)
    err = rel_err(y, x.float() @ dequant(unpack_u8(u8), sz).float().t())
    swapped = dequant(unpack_u8(((u8 & 15) << 4) | (u8 >> 4)), sz)
    return err, f"; with the nibbles swapped: {rel_err(y, x.float() @ swapped.float().t()):.3g}"


def time_step(peer: _Peer, shapes, B: int, warmup: int, reps: int, gen, device) -> list[float]:
    """Seconds per replay of one CUDA graph holding every linear layer of the step at batch B."""
    import torch

    xs = {k: torch.randn(B, k, dtype=torch.bfloat16, device=device, generator=gen)
          for k in sorted({k for _, _, k in shapes})}

    def step():
        return [peer.layer(xs[k], i) for i, (_, _, k) in enumerate(shapes)]

    return graph_times(step, warmup, reps)


def graph_times(step, warmup: int, reps: int) -> list[float]:
    """Seconds per replay of ``step`` (torch work) captured as one CUDA graph: two eager calls
    on a side stream first (cuBLAS handles, workspaces, Triton compiles), then ``warmup``
    untimed and ``reps`` timed replays, each between two CUDA events."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        outs = step()
    out = []
    for i in range(warmup + reps):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        g.replay()
        e1.record()
        e1.synchronize()
        if i >= warmup:
            out.append(e0.elapsed_time(e1) / 1e3)
    del g, outs
    return out


def run(cfg: ModelConfig, batches: list[int], bw: float, warmup: int = 5, reps: int = 30,
        seed: int = 0, progress=None) -> dict:
    """Time both peers at every B; call after our own runs have freed their GPU memory.

    Returns the JSON "peers" object: {"available": False, "reason"} without torch + CUDA, else
    the shapes' totals, the weights-only floors at `bw` and, per peer, "ok", "error",
    "check_err" and "rows" [{"batch", "ms", "ms_spread"}]."""
    ok, why = available()
    if not ok:
        return {"available": False, "reason": why}
    import gc

    import torch

    gc.collect()          # our runtimes (PyCUDA) are closed by now; drop what they left
    shapes = linear_shapes(cfg)
    params = sum(n * k for _, n, k in shapes)
    w4 = cfg.int4_weight_bytes()
    res = {"available": True, "torch": why, "device": torch.cuda.get_device_name(0),
           "layers": len(shapes), "params": params, "group": GROUP, "inner_k_tiles": INNER_K_TILES,
           "int4_weight_bytes": w4, "bf16_weight_bytes": 2.0 * params,
           "int4_floor_ms": w4 / bw * 1e3, "bf16_floor_ms": 2.0 * params / bw * 1e3,
           "copy_bandwidth": bw, "reps": reps, "warmup": warmup, "peers": {}}
    device = torch.device("cuda", 0)
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    _, n0, k0 = shapes[0]
    for kind in PEERS:
        r = res["peers"][kind] = {"label": LABELS[kind], "ok": False, "error": None,
                                  "check_err": None, "weight_bytes": None, "rows": []}
        peer = None
        try:
            if progress:
                progress(f"peers: {kind}: check on {n0}×{k0}")
            r["check_err"], hint = check_peer(kind, n0, k0, max(batches), gen, device)
            if not r["check_err"] < CHECK_TOL:
                raise RuntimeError(f"wrong result on {n0}×{k0}: max error {r['check_err']:.3g} "
                                   f"of max |ref| (tolerance {CHECK_TOL}){hint}")
            need = 2.0 * params if kind == "cublas_bf16" else params * (0.5 + 4.0 / GROUP)
            need += max(n * k for _, n, k in shapes) if kind == "gemlite" else 0  # codes, packing
            free = torch.cuda.mem_get_info(0)[0]
            if free < need + (2 << 30):
                raise RuntimeError(f"needs {need / 1e9:.1f} GB of weights, {free / 1e9:.1f} GB free")
            if progress:
                progress(f"peers: {kind}: {len(shapes)} weights, {need / 1e9:.1f} GB on the GPU")
            peer = _Peer(kind, shapes, gen, device)
            r["weight_bytes"] = peer.nbytes
            for B in batches:
                if progress:
                    progress(f"peers: {kind}: B={B}: timing {reps} graph replays")
                t = time_step(peer, shapes, B, warmup, reps, gen, device)
                r["rows"].append({"batch": B, "ms": statistics.median(t) * 1e3,
                                  "ms_spread": [min(t) * 1e3, max(t) * 1e3]})
            r["ok"] = True
        except Exception as e:  # a missing op, out of memory, a failed check: report, go on
            r["error"] = f"{type(e).__name__}: {e}".splitlines()[0][:300]
        finally:
            del peer
            gc.collect()
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
    return res


def summary(res: dict) -> list[str]:
    """One line per peer that did not run, or the one line when none could."""
    if not res.get("available"):
        return [f"peers: not run: {res['reason']}"]
    return [f"peers: {p['label']} failed: {p['error']}" for p in res["peers"].values()
            if not p["ok"]]
