"""The program plan: which kernel instantiations a model and lane choice need, their entry points,
the buffers, the fused weights, and the launch schedule of a decode step and a prefill chunk (and,
for the mtp lane, its prefill and verify schedules).
"""

from __future__ import annotations

from ..config import ModelConfig
from ..lanes import Lanes
from .arch import arch_facts
from .attention import attn_part_floats, attn_stride
from .builder import ScheduleBuilder
from .elementwise import TOPK, topk_entry
from .entries import HEADERS, MTP_HEADERS, Plan, buf, cdiv, fused_weights, raw_dtype
from .sampling import HEADER as SAMPLE_HEADER
from .sampling import sample_buffers, sample_phase
from .speculative import SpecBuilder


def resolve_shape(shape: list, tmax: int) -> list[int]:
    """A buffer shape with its run-time entries replaced: "Tmax" -> tmax, "Tsplits" ->
    attn_stride(tmax)."""
    return [tmax if d == "Tmax" else attn_stride(tmax) if d == "Tsplits" else d for d in shape]


def chunk_tile(lanes: Lanes) -> int:
    """The batch tile of the prefill chunks of at least that many rows: Tuning.chunk_btg where
    it is more than the lane's tile (pt > 1), else the lane's. The table's choice is 64 where
    the lane's tile is at most 16 rows and the arch has wgmma (the B = 64 lane's kernels; a
    row's bits do not depend on the tile: tests/gpu/test_serve_lock.py)."""
    t = lanes.tuning.chunk_btg
    if t is None:
        t = 64 if lanes.btg <= 16 and arch_facts(lanes.arch).wgmma else 0
    return t if lanes.pt > 1 and t > lanes.btg else lanes.btg


def verify_tile(lanes: Lanes) -> int:
    """The batch tile of an mtp program's verify pass: Tuning.verify_btg where it is more than
    the lane's tile, else the lane's. The table's choice is 32 at lanes of 16-row tiles whose
    verify pass has more than 16 rows, on an arch with wgmma (measured at B = 16, mtp 1: the
    B = 32 lane's kernels stream the verify pass's weights at about the decode step's rate)."""
    t = lanes.tuning.verify_btg
    if t is None:
        wide = lanes.btg == 16 and lanes.batch * (lanes.mtp + 1) > 16
        t = 32 if wide and arch_facts(lanes.arch).wgmma else 0
    return t if lanes.mtp and t > lanes.btg else lanes.btg


def plan_buffers(cfg: ModelConfig, lanes: Lanes, n_in: int) -> dict:
    """The program's buffers: name -> {"dtype", "shape"} ("state": kept between steps)."""
    # btg: the widest tile any schedule runs, for h/o/act
    B, btg, K = lanes.batch, max(chunk_tile(lanes), verify_tile(lanes)), lanes.mtp
    KP = K + 1
    H, F, V = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size
    C, Cv, hv = cfg.conv_dim, cfg.linear_value_dim, cfg.linear_num_value_heads
    D, Hkv = cfg.head_dim, cfg.num_key_value_heads
    rmax = B * max({1, lanes.pt} | ({KP} if K else set()))
    kc = cfg.linear_conv_kernel_dim - 1
    RS, SLOTS = (kc + K, KP) if K else (kc, 1)
    buffers = {
        "tokens": {"dtype": "int32", "shape": [rmax]},
        "pos": {"dtype": "int32", "shape": [B]},
        "ntok": {"dtype": "int32", "shape": [B]},
        # A packed chunk (docs/KERNELS.md): each sequence's first row, each row's sequence.
        "row0": {"dtype": "int32", "shape": [B]},
        "rowseq": {"dtype": "int32", "shape": [rmax]},
        "x": {"dtype": "bfloat16", "shape": [rmax, H]},
        # h and act may hold a GEMV input in tile order: whole batch tiles of rows.
        "h": {"dtype": "bfloat16", "shape": [cdiv(rmax, btg) * btg, H]},
        "proj": {"dtype": "bfloat16", "shape": [rmax, n_in]},
        "o": {"dtype": "bfloat16", "shape": [cdiv(rmax, btg) * btg, max(Cv, cfg.q_dim)]},
        "qbuf": {"dtype": "bfloat16", "shape": [rmax, cfg.q_dim]},
        "gu": {"dtype": "bfloat16", "shape": [rmax, 2 * F]},
        "act": {"dtype": "bfloat16", "shape": [cdiv(rmax, btg) * btg, F]},
        "hlast": {"dtype": "bfloat16", "shape": [B, H]},
        "logits": {"dtype": "bfloat16", "shape": [B, V]},
        "next": {"dtype": "int32", "shape": [B]},
        "topk_val": {"dtype": "float32", "shape": [B, TOPK]},
        "topk_idx": {"dtype": "int32", "shape": [B, TOPK]},
        "nextval": {"dtype": "float32", "shape": [B]},
        # Arrival counters of the GDN conv-ring write; every launch leaves them at zero.
        "ring_arrivals": {"dtype": "int32", "shape": [B, cfg.linear_num_key_heads]},
        # attn split-K scratch, shared by every attention layer: per (row, kv head) up to
        # "Tsplits" = attn_stride(Tmax) fp32 partials, and an arrival counter that every launch
        # leaves at zero (all buffers are allocated zeroed).
        "attn_part": {"dtype": "float32", "shape": [rmax, Hkv, "Tsplits", attn_part_floats(cfg)]},
        "attn_arrivals": {"dtype": "int32", "shape": [rmax, Hkv]},
        "conv": {"dtype": "bfloat16", "state": True,
                 "shape": [len(cfg.linear_layers), B, RS, C]},
        "rec": {"dtype": "float32", "state": True,
                "shape": [len(cfg.linear_layers), B] + ([SLOTS] if K else []) +
                         [hv, cfg.linear_key_head_dim, cfg.linear_value_head_dim]},
        # Tmax is chosen at run time: shape entry "Tmax" is replaced by it.
        "kc": {"dtype": "bfloat16", "state": True, "shape": [len(cfg.full_layers), B, Hkv, "Tmax", D]},
        "vc": {"dtype": "bfloat16", "state": True, "shape": [len(cfg.full_layers), B, Hkv, "Tmax", D]},
    }
    if K:
        buffers["logits"]["shape"] = [B * KP, V]
        buffers.update({
            "vtok": {"dtype": "int32", "shape": [B * KP]},      # verify rows [x, d1 … dK]
            "vnext": {"dtype": "int32", "shape": [B * KP]},     # a_j, argmax of verify row j
            "vnextval": {"dtype": "float32", "shape": [B * KP]},
            "emit": {"dtype": "int32", "shape": [B, KP]},       # a_0 … a_n, then −1
            "count": {"dtype": "int32", "shape": [B]},          # n + 1
            "slot": {"dtype": "int32", "state": True, "shape": [B]},
            "ntok_m": {"dtype": "int32", "shape": [B]},
            "mnext": {"dtype": "int32", "shape": [B * lanes.pt]},
            "mtok": {"dtype": "int32", "shape": [B * lanes.pt]},
            "mcat": {"dtype": "bfloat16", "shape": [rmax, 2 * H]},
            "mh": {"dtype": "bfloat16", "shape": [B, H]},
            "mlogits": {"dtype": "bfloat16", "shape": [B, V]},
            "dnext": {"dtype": "int32", "shape": [B]},
            "dval": {"dtype": "float32", "shape": [B]},
            "mpos": {"dtype": "int32", "shape": [B]},
            "one": {"dtype": "int32", "shape": [B]},
            "mkc": {"dtype": "bfloat16", "state": True, "shape": [B, Hkv, "Tmax", D]},
            "mvc": {"dtype": "bfloat16", "state": True, "shape": [B, Hkv, "Tmax", D]},
        })
    return buffers


def prefill_buckets(batch: int, pt: int, btg: int) -> list[int]:
    """The row counts a packed prefill chunk is emitted for: btg, 2·btg, 4·btg …
    below B·pt, then B·pt (a chunk runs in the first that holds its rows: at most twice the rows
    it carries, in whole batch tiles)."""
    cap, r, out = batch * pt, btg, []
    while r < cap:
        out.append(r)
        r *= 2
    return out + [cap]


def plan_program(cfg: ModelConfig, lanes: Lanes) -> Plan:
    """Entries, buffers, weights and the decode / prefill schedules for cfg at these lanes
    (and, for lanes.mtp = K > 0, the mtp lane's prefill and verify schedules)."""
    K = lanes.mtp
    wgmma = arch_facts(lanes.arch).wgmma
    plan = Plan(headers=list(HEADERS) + (["wgmma_q4.cuh", "wgmma_sk_q4.cuh"] if wgmma else [])
                + (MTP_HEADERS if K else [])
                + ([SAMPLE_HEADER] if not K or lanes.spec_sample else []))
    plan.weights = fused_weights(cfg, mtp=bool(K))
    n_in = max(w["rows"] for n, w in plan.weights.items() if n.endswith(".in"))
    plan.constants = [("Q38_BATCH", lanes.batch), ("Q38_BTG", lanes.btg), ("Q38_PT", lanes.pt),
                      ("Q38_MTP", lanes.mtp)]
    plan.buffers = plan_buffers(cfg, lanes, n_in)
    raw = [n for n, s in cfg.tensor_shapes(mtp=bool(K)).items() if not cfg.is_int4(n, s)]
    plan.tensors = {n: raw_dtype(n) for n in raw}

    Builder = SpecBuilder if K else ScheduleBuilder
    b = Builder(cfg, lanes, plan)
    # Tuning.chunk_btg: chunks of at least ct rows at that tile, from a builder of their own
    ct = chunk_tile(lanes)
    wide = Builder(cfg, lanes, plan, btg=ct) if ct > lanes.btg else b
    # Tuning.verify_btg: the verify pass at that tile (the chunks' builder where it is the same)
    vt = verify_tile(lanes)
    vb = b if vt == lanes.btg else wide if vt == ct else Builder(cfg, lanes, plan, btg=vt)
    plan.schedule = {"decode": b.step(1)}

    def chunk(pt: int, rows: int | None = None) -> list[dict]:
        """A prefill chunk (the mtp lane's: + MTP rows over it)."""
        c = wide if rows is not None and rows >= ct else b
        return c.prefill(pt, rows=rows) if K else c.step(pt, rows=rows)

    if lanes.pt == 1:
        plan.schedule["prefill"] = chunk(1) if K else plan.schedule["decode"]
    plan.schedule["prefill_pt"] = lanes.pt
    if lanes.pt > 1:
        # Packed chunks (docs/KERNELS.md): one schedule per row count a chunk may round up to,
        # so a chunk costs about the rows it carries (inputs.chunk_phase picks one).
        buckets = prefill_buckets(lanes.batch, lanes.pt, lanes.btg)
        plan.schedule["prefill_buckets"] = {"rows": buckets}
        for r in buckets:
            plan.schedule["prefill" if r == buckets[-1] else f"prefill_r{r}"] = chunk(
                lanes.pt, rows=r)
    if K:
        plan.schedule["verify"] = vb.verify()
        plan.schedule["verify_rows"] = K + 1
        if lanes.spec_sample:   # the verify pass samples on the device (spec_sample)
            plan.buffers.update(sample_buffers(lanes.batch))
            plan.buffers["sacc"] = {"dtype": "int32", "shape": [lanes.batch * (K + 1)]}
            plan.buffers["stok"] = {"dtype": "int32", "shape": [lanes.batch * (K + 1)]}
    # split-K scratch, shared by every launch with ZS > 1 (launches run one at a time): fp32
    # partials, and arrival counters that every launch leaves at zero.
    scratch = {k: max(x.scratch[k] for x in (b, wide, vb)) for k in b.scratch}
    plan.buffers["gemm_part"] = {"dtype": "float32", "shape": [scratch["part"]]}
    plan.buffers["gemm_arrivals"] = {"dtype": "int32", "shape": [scratch["arrivals"]]}
    tk = plan.entry(topk_entry(cfg.vocab_size))
    # Optional, after a step: the top-k logits of each sequence's sampled row.
    plan.schedule["topk"] = [{"k": tk.name, "grid": [lanes.batch, 1, 1],
                              "args": [buf("logits"), buf("topk_val"), buf("topk_idx")]}]
    if not K:   # optional, after a step where some slot samples (the mtp lane decodes greedily)
        plan.buffers.update(sample_buffers(lanes.batch))
        plan.schedule["sample"] = sample_phase(plan, lanes.batch, cfg.vocab_size,
                                               lanes.tuning.sample_split)
    return plan
