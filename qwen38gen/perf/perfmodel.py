"""A timing model of the decode step: what each launch must move and compute, calibrated on the
committed measurements, predicting the step for today's program and for a persistent streaming
step (docs/TIMING_MODEL.md: "item 1", a new GEMV contract, and "item 2", that persistent step).
Every figure it prints is a model prediction, not a measurement.

Per launch l of the manifest's decode schedule (typed fields only: the kernel's "family", a GEMV's
"weight" and "btg"):

    b_l   HBM bytes it must move: a GEMV its weight's int4 nibbles + bf16 group scales
          (rows · k · (1/2 + 2/128)); the GDN its layer's fp32 recurrent state and bf16 conv ring,
          read and written, for B sequences; attn_tc its layer's K and V for T tokens (bf16).
          Summed over the step, b equals ModelConfig.floor_parts exactly (padding rows aside).
    a_l   activation bytes (x, h, proj, o, gu, act, logits): small and L2-resident, so they are
          kept out of b and timed only where nothing else is (the "rest" kind).
    f_l   flops the tensor cores execute: 2 · rows · k · Bpad, Bpad = B rounded up to the batch
          tile btg the launch computes.
    occ_l min(1, blocks / SMs): a launch of fewer blocks than SMs streams from fewer SMs.

Today's program: a sequence of launches, the step the sum of their times,

    GEMV     t = c_b + max(b / (R · e_G · occ),  b · u_F + f / P_F)
    GDN      t = c_g + b / (R · e_g · occ)
    attn_tc  t = c_a + b / (R · e_a · occ)
    others   t = c_r + a / R_act                   (norms, attn_prep, SwiGLU, embed, argmax)

R is the read rate of a persistent stream (the weights in one launch: 13.21 GB in 2.90 ms,
version 15) and c_b the launch boundary ((3.29 − 2.90) ms / 257 launches); both are measured,
not fitted. F is the GEMV family: gemv_q4 (mma.sync; u = 0: its unpacking shows as e_G) or
wgmma (wgmma_q4, wgmma_sk_q4: a per-weight-byte issue cost u and a tensor rate P, the serialized
unpack → wgmmas → drain → scale of today's contract). Fitted: e_G and P(gemv_q4) on the
smallest and the largest gemv_q4 tile, u and P(wgmma) on the wgmma points, (c_g, e_g),
(c_a, e_a) and (c_r, R_act) by least squares on each kind's own graph time. Only the
calibration batches are used; the others are held out and reported on their own.

The persistent step (item 2): one block per SM, a loader streaming every byte that does not
depend on the step's results into a shared-memory ring, consumers waiting on counters. Its
three bounds:

    stream   Σ s_l,  s_l = b_l / R (weights, KV: read) or b_l / R_copy (GDN state: r + w)
    chain    Σ (h + λ_l), every op waiting on the one before: λ = f / P_c for a GEMV,
             c_g − c_b for the GDN, c_a − c_b for attention, c_r − c_b for the others
    tensor   Σ f_l / P_c

and the prediction, a walk down the same chain in which the loader runs at most one ring
ahead (D = SMs · ring bytes / R seconds of stream) and fills the ring while an op waits:

    rest_l   = max(0, s_l − ahead)
    d_l      = max(rest_l, h + λ_l)
    ahead   := min(D, max(0, ahead − s_l) + d_l − rest_l)
    step     = Σ d_l  ≥  max(stream, chain, tensor)

"binds" is the bound that sets the largest share of the walk (stream where rest_l ≥ h + λ_l,
else tensor for a GEMV, chain for the others). h (a counter hand-over) and the ring's size are
assumed, not measured; P_c is the contract's chain rate: ~715 TFLOP/s measured for today's
per-group contract, ~945 for a plain wgmma chain (item 1's contract: scale before the MMA, one
fp32 accumulator, MMAs in flight). Item 1 in today's program: P(wgmma) scaled by 945 / 715
(rate only), and the unpacking overlapped with the MMAs (max(b · u, f / P) for their sum).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from ..config import INT4_GROUP, ModelConfig, load_config
from ..errors import UserError
from ..lanes import Lanes
from ..plan.entries import cdiv
from ..plan.families import FAMILIES, KINDS
from .timing import kind_of

# ---------------------------------------------------------------- measured anchors (H200)
N_SM = 132
# docs/PERFORMANCE.md, version 15 (scripts/stream_bench.py): the step's weights with no arithmetic
STREAM_ONE_MS = 2.90            # in one launch
STREAM_257_MS = 3.29            # in 257 launches
STREAM_LAUNCHES = 257
STREAM_BYTES = 13.21e9          # W of the 27B geometry
CHAIN_TFLOPS = 715.0            # wgmma chain with int4 unpacking and a per-group drain (v16)
PLAIN_TFLOPS = 945.0            # a plain m64n64k16 wgmma chain (v16: 940-950)
# assumptions of the persistent design (stated, not measured)
COUNTER_US = 1.0                # a release store and an acquire poll through L2
RING_BYTES = 160 * 1024         # shared-memory ring of one SM's loader
CALIBRATION_BATCHES = (1, 16, 32, 64)
DESIGNS = ("today", "persistent", "both")
# The GEMV families and the timing model's class of each (plan/families.py's gemv column).
GEMV_FAMILIES = {n: f.gemv for n, f in FAMILIES.items() if f.gemv}
DTYPE_BYTES = {"bfloat16": 2, "float32": 4, "int32": 4}
MEASURED_KINDS = KINDS


@dataclass(frozen=True)
class LaunchCost:
    """What one launch of the decode schedule must do."""
    family: str
    kind: str           # plan.families.KINDS: gemv, delta rule, attention, rest
    hbm: float          # b: bytes from HBM
    part: str           # which floor term b belongs to: weights, state, kv, or ""
    act: float          # a: activation bytes (L2-resident)
    flops: float        # f: tensor-core flops at the batch tile
    occ: float          # min(1, blocks / SMs)
    tile: int = 0       # a GEMV's batch tile btg


def launch_costs(cfg: ModelConfig, manifest: dict, ctx: int) -> list[LaunchCost]:
    """Per launch of manifest's decode schedule, its bytes, flops and occupancy at T = ctx."""
    B = manifest["lanes"]["batch"]
    ws, kernels = manifest["weights"], manifest["kernels"]
    act_w = DTYPE_BYTES.get(manifest["buffers"]["x"]["dtype"], 2)
    H, F, V = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size
    n_lin, n_full = len(cfg.linear_layers), len(cfg.full_layers)
    gdn_b = B * 2 * (cfg.recurrent_state_bytes + cfg.conv_state_bytes) / n_lin
    kv_b = B * ctx * cfg.kv_bytes_per_token / n_full
    n_in = max(w["rows"] for n, w in ws.items() if n.endswith(".in"))
    out = []
    for L in manifest["schedule"]["decode"]:
        fam = kernels[L["k"]]["family"]
        kind = kind_of(manifest, L)
        g = L["grid"]
        occ = min(1.0, g[0] * g[1] * g[2] / N_SM)
        hbm, part, flops, tile = 0.0, "", 0.0, 0
        if fam in GEMV_FAMILIES:
            w = ws[L["weight"]]
            hbm, part = w["rows"] * w["k"] * (0.5 + 2.0 / INT4_GROUP), "weights"
            tile = L["btg"]
            flops = 2.0 * w["rows"] * w["k"] * cdiv(B, tile) * tile
            act = B * (w["k"] + w["rows"]) * act_w
        elif fam == "gdn":
            hbm, part = gdn_b, "state"
            act = B * (n_in + cfg.linear_value_dim) * act_w
        elif fam == "attn_tc":
            hbm, part = kv_b, "kv"
            act = B * 2 * cfg.q_dim * act_w
        elif fam == "attn_prep":
            act = B * (n_in + 2 * cfg.kv_dim) * act_w
        elif fam in ("rmsnorm", "rmsnorm_ld", "embed"):
            act = B * 2 * H * act_w
        elif fam == "swiglu":
            act = B * 3 * F * act_w
        elif fam in ("argmax", "topk"):
            act = B * V * DTYPE_BYTES.get(manifest["buffers"]["logits"]["dtype"], 2)
        else:
            act = 0.0
        out.append(LaunchCost(fam, kind, hbm, part, act, flops, occ, tile))
    return out


def hbm_parts(costs: list[LaunchCost]) -> dict[str, float]:
    """The step's HBM bytes by floor term (weights, state, kv), to compare with floor_parts."""
    parts = {"weights": 0.0, "state": 0.0, "kv": 0.0}
    for c in costs:
        if c.part:
            parts[c.part] += c.hbm
    return parts


def program_costs(cfg: ModelConfig, batch: int, ctx: int) -> list[LaunchCost]:
    """Emit today's default decode program at `batch` (as bench does) and cost its launches."""
    from ..emit import emit_program

    return launch_costs(cfg, emit_program(cfg, Lanes.make(batch, pt=1, model=cfg)).manifest, ctx)


# ---------------------------------------------------------------- today's program
@dataclass(frozen=True)
class Params:
    """The model's constants: R, c_b measured; the rest fitted (seconds, bytes/s, flop/s)."""
    R: float            # read rate of a persistent stream
    c_b: float          # launch boundary of a GEMV
    e_G: float          # GEMV stream efficiency
    P_q: float          # gemv_q4 issue rate (flop/s at its tile)
    u_w: float          # wgmma: seconds per weight byte (unpack, scale, drain)
    P_w: float          # wgmma tensor rate
    c_g: float
    e_g: float
    c_a: float
    e_a: float
    c_r: float
    R_act: float
    R_copy: float       # the calibration run's copy bandwidth (r + w)


def gemv_terms(c: LaunchCost, p: Params, P_w: float | None = None,
               overlap: bool = False) -> tuple[float, float]:
    """(stream, compute) seconds of one GEMV launch. P_w, overlap: item 1's contract (another
    wgmma rate; the unpacking overlapped with the MMAs in flight instead of added to them)."""
    stream = c.hbm / (p.R * p.e_G * c.occ)
    if GEMV_FAMILIES[c.family] == "gemv_q4":
        return stream, c.flops / p.P_q
    unpack, mma = c.hbm * p.u_w, c.flops / (P_w or p.P_w)
    return stream, max(unpack, mma) if overlap else unpack + mma


def launch_time(c: LaunchCost, p: Params, **contract) -> float:
    """Seconds of one launch in today's program (the module's equations)."""
    if c.family in GEMV_FAMILIES:
        return p.c_b + max(gemv_terms(c, p, **contract))
    if c.family == "gdn":
        return p.c_g + c.hbm / (p.R * p.e_g * c.occ)
    if c.family == "attn_tc":
        return p.c_a + c.hbm / (p.R * p.e_a * c.occ)
    return p.c_r + c.act / p.R_act


def step_today(costs: list[LaunchCost], p: Params, **contract) -> dict[str, float]:
    """Seconds by kind and in all ("step") of today's program: its launches one after another."""
    kinds: dict[str, float] = {}
    for c in costs:
        kinds[c.kind] = kinds.get(c.kind, 0.0) + launch_time(c, p, **contract)
    kinds["step"] = sum(kinds.values())
    return kinds


# ---------------------------------------------------------------- calibration
def load_measured(path: Path | str) -> dict:
    """A `bench --json` file: its rows by batch, validated enough to calibrate on."""
    p = Path(path)
    try:
        d = json.loads(p.read_text())
    except OSError as e:
        raise UserError(f"cannot read measurements {str(p)!r}: {e.strerror or e}; give a "
                        "`qwen38gen bench --json` file") from None
    except json.JSONDecodeError as e:
        raise UserError(f"{str(p)!r} is not JSON ({e.msg}, line {e.lineno}); give a "
                        "`qwen38gen bench --json` file") from None
    ok = (isinstance(d, dict) and isinstance(d.get("rows"), list) and d["rows"]
          and all(isinstance(r, dict) and {"batch", "step_ms", "graph_ms"} <= set(r)
                  and isinstance(r["graph_ms"], dict) and set(MEASURED_KINDS) <= set(r["graph_ms"])
                  for r in d["rows"])
          and all(k in d for k in ("model", "ctx", "copy_bandwidth")))
    if not ok:
        raise UserError(f"{str(p)!r} is not a `qwen38gen bench --json` file: it needs model, "
                        "ctx, copy_bandwidth and rows with batch, step_ms and graph_ms (ms of "
                        f"{', '.join(MEASURED_KINDS)})")
    return d


def _lsq(rows: list[list[float]], y: list[float]) -> np.ndarray:
    return np.linalg.lstsq(np.array(rows, float), np.array(y, float), rcond=None)[0]


@dataclass
class Fit:
    """A calibration: its parameters and, per measured batch, the prediction against the figure."""
    params: Params
    model: str
    ctx: int
    calibration: tuple[int, ...]
    rows: list[dict]            # batch, measured, predicted, error, held_out, kinds

    def max_error(self, held_out: bool) -> float:
        errs = [abs(r["error"]) for r in self.rows if r["held_out"] == held_out]
        return max(errs) if errs else float("nan")

    def to_json(self) -> dict:
        return {"model": self.model, "ctx": self.ctx, "calibration": list(self.calibration),
                "params": asdict(self.params), "rows": self.rows,
                "max_error_calibration": self.max_error(False),
                "max_error_held_out": self.max_error(True)}


def calibrate(measured: dict, batches=CALIBRATION_BATCHES) -> Fit:
    """Fit the free parameters on the kind graph times of `batches` (of the measured json), then
    predict every measured batch's step; the others are held out."""
    cfg = load_config(measured["model"])
    ctx = int(measured["ctx"])
    by_b = {int(r["batch"]): r for r in measured["rows"]}
    missing = [b for b in batches if b not in by_b]
    if missing:
        raise UserError(f"calibration batch {missing[0]} is not in the measurements (they have "
                        f"B = {', '.join(map(str, sorted(by_b)))})")
    costs = {b: program_costs(cfg, b, ctx) for b in sorted(by_b)}
    R = STREAM_BYTES / (STREAM_ONE_MS * 1e-3)
    c_b = (STREAM_257_MS - STREAM_ONE_MS) * 1e-3 / STREAM_LAUNCHES

    def graph(b, kind):
        return by_b[b]["graph_ms"][kind] * 1e-3

    def of(b, pred):
        return [c for c in costs[b] if pred(c)]

    # rest: n · c_r + Σa / R_act
    rest = {b: of(b, lambda c: c.kind == "rest") for b in batches}
    c_r, inv_act = _lsq([[len(rest[b]), sum(c.act for c in rest[b])] for b in batches],
                        [graph(b, "rest") for b in batches])
    # delta rule and attention: n · c + Σ b / (R occ) · (1/e) (+ attn_prep, timed as rest)
    sol = {}
    for fam, kind in (("gdn", "delta rule"), ("attn_tc", "attention")):
        A, y = [], []
        for b in batches:
            cs = of(b, lambda c: c.family == fam)
            others = of(b, lambda c: c.kind == kind and c.family != fam)
            A.append([len(cs), sum(c.hbm / (R * c.occ) for c in cs)])
            y.append(graph(b, kind) - sum(c_r + c.act * inv_act for c in others))
        sol[fam] = _lsq(A, y)
    # GEMV: gemv_q4 stream-bound at its smallest calibrated tile, issue-bound at its largest
    def tile(b):
        return max(c.tile for c in costs[b])

    fam_of = {b: {GEMV_FAMILIES[c.family] for c in costs[b] if c.family in GEMV_FAMILIES}
              for b in batches}
    q = sorted((tile(b), b) for b in batches if fam_of[b] == {"gemv_q4"})
    w = [b for b in batches if fam_of[b] == {"wgmma"}]
    if len(q) < 2 or q[0][0] == q[-1][0] or len(w) < 2:
        raise UserError("the calibration batches must include two gemv_q4 tiles (e.g. B = 1 "
                        "and 16) and two wgmma batches (e.g. B = 32 and 64)")
    g = {b: of(b, lambda c: c.family in GEMV_FAMILIES) for b in batches}
    b_lo, b_hi = q[0][1], q[-1][1]
    e_G = sum(c.hbm / (R * c.occ) for c in g[b_lo]) / (graph(b_lo, "gemv") - len(g[b_lo]) * c_b)
    P_q = sum(c.flops for c in g[b_hi]) / (graph(b_hi, "gemv") - len(g[b_hi]) * c_b)
    u_w, inv_P = _lsq([[sum(c.hbm for c in g[b]), sum(c.flops for c in g[b])] for b in w],
                      [graph(b, "gemv") - len(g[b]) * c_b for b in w])
    p = Params(R=R, c_b=c_b, e_G=float(e_G), P_q=float(P_q), u_w=float(u_w), P_w=float(1 / inv_P),
               c_g=float(sol["gdn"][0]), e_g=float(1 / sol["gdn"][1]), c_a=float(sol["attn_tc"][0]),
               e_a=float(1 / sol["attn_tc"][1]), c_r=float(c_r), R_act=float(1 / inv_act),
               R_copy=float(measured["copy_bandwidth"]))
    bad = [f"{k} = {v:.3g}" for k, v in asdict(p).items() if not (math.isfinite(v) and v > 0)]
    if bad:
        raise UserError(f"the calibration on B = {', '.join(map(str, batches))} gives "
                        f"{', '.join(bad)}: choose batches that span the tiles (1, 16, 32, 64)")
    for b in (b_lo, b_hi):   # the regimes the closed forms assumed
        got = step_today(of(b, lambda c: c.kind == "gemv"), p)["step"]
        if not math.isclose(got, graph(b, "gemv"), rel_tol=1e-6):
            raise UserError(f"the GEMV at B = {b} is not {'stream' if b == b_lo else 'issue'}-"
                            "bound under the fitted parameters: calibrate on other batches")
    rows = []
    for b in sorted(by_b):
        kinds = step_today(costs[b], p)
        meas = by_b[b]["step_ms"] * 1e-3
        rows.append({"batch": b, "measured_ms": by_b[b]["step_ms"],
                     "predicted_ms": kinds["step"] * 1e3, "error": kinds["step"] / meas - 1,
                     "held_out": b not in batches,
                     "kinds_ms": {k: v * 1e3 for k, v in kinds.items() if k != "step"},
                     "measured_kinds_ms": dict(by_b[b]["graph_ms"])})
    return Fit(p, cfg.name, ctx, tuple(batches), rows)


# ---------------------------------------------------------------- the persistent step
def persistent(costs: list[LaunchCost], p: Params, tflops: float = CHAIN_TFLOPS) -> dict:
    """Item 2's step in seconds: its three bounds (stream, chain, tensor) and the walk that
    predicts it, with the share of the walk each bound sets ("binds": the largest share)."""
    P, h = tflops * 1e12, COUNTER_US * 1e-6
    D = N_SM * RING_BYTES / p.R
    ahead, walk = 0.0, 0.0
    chain = tensor = stream = 0.0
    share = {"stream": 0.0, "chain": 0.0, "tensor": 0.0}
    for c in costs:
        s = c.hbm / (p.R_copy if c.part == "state" else p.R)
        if c.family in GEMV_FAMILIES:
            lat, who = c.flops / P, "tensor"
            tensor += lat
        else:
            own = {"gdn": p.c_g, "attn_tc": p.c_a}.get(c.family, p.c_r)
            lat, who = max(0.0, own - p.c_b), "chain"
        chain += h + lat
        stream += s
        rest = max(0.0, s - ahead)                 # bytes not yet in the ring
        dur = max(rest, h + lat)
        share["stream" if rest >= h + lat else who] += dur
        ahead = min(D, max(0.0, ahead - s) + dur - rest)   # the loader fills the ring meanwhile
        walk += dur
    bound = max(stream, chain, tensor)
    return {"step": walk, "binds": max(share, key=share.get), "bound": bound, "stream": stream,
            "chain": chain, "tensor": tensor, "serial": stream + chain,
            "share": {k: v / walk for k, v in share.items()}}


def item1_today(costs: list[LaunchCost], p: Params, tflops: float = PLAIN_TFLOPS) -> dict:
    """Item 1's contract in today's program: the wgmma rate scaled from the chain's 715 to the
    plain chain's rate (rate only), and with the unpacking overlapped with MMAs in flight."""
    P_new = p.P_w * tflops / CHAIN_TFLOPS
    return {"rate_only": step_today(costs, p, P_w=P_new)["step"],
            "rate_and_overlap": step_today(costs, p, P_w=P_new, overlap=True)["step"],
            "P_w_new": P_new}


def _persistent_both(costs: list[LaunchCost], p: Params) -> dict:
    """The persistent step at today's contract's rate, and its step at item 1's plain rate."""
    d = persistent(costs, p)
    plain = persistent(costs, p, PLAIN_TFLOPS)
    return {**d, "step_item1": plain["step"], "binds_item1": plain["binds"]}


def parse_batches(text: str) -> list[int]:
    """`--batch 1,16,64` as a list of supported batch sizes, or a UserError naming the bad one."""
    from ..lanes import SUPPORTED

    lo, hi = SUPPORTED["batch"][0], SUPPORTED["batch"][-1]
    try:
        bs = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UserError(f"--batch {text!r} is not a comma-separated list of integers, "
                        "e.g. 1,16,64") from None
    bad = [b for b in bs if not lo <= b <= hi]
    if not bs or bad:
        raise UserError(f"--batch {text!r}: batch sizes must be {lo}..{hi}, e.g. 1,16,64")
    return bs


@dataclass
class Prediction:
    batch: int
    floor: float            # floor seconds at the calibration run's copy bandwidth
    today: float | None
    measured: float | None
    persistent: dict | None
    item1: dict | None      # item 1's contract in today's program (item1_today)

    def to_json(self) -> dict:
        return asdict(self)


def predict(cfg: ModelConfig, batches: list[int], ctx: int, fit: Fit, design: str = "both",
            measured: dict | None = None) -> list[Prediction]:
    """Per batch: the floor, today's program and/or the persistent step, the measured figure
    where `measured` (a bench json of the same model and ctx) has the batch."""
    if design not in DESIGNS:
        raise UserError(f"design {design!r} is unknown; choose one of {', '.join(DESIGNS)}")
    if ctx < 1:
        raise UserError(f"--ctx {ctx} must be at least 1 cached token")
    meas = {}
    if measured is not None:
        if measured["model"] != cfg.name or int(measured["ctx"]) != ctx:
            raise UserError(f"the measurements are of {measured['model']} at T = "
                            f"{measured['ctx']}, not {cfg.name} at T = {ctx}; give --model and "
                            "--ctx to match")
        meas = {int(r["batch"]): r["step_ms"] * 1e-3 for r in measured["rows"]}
    out = []
    for b in batches:
        costs = program_costs(cfg, b, ctx)
        today = design != "persistent"
        out.append(Prediction(
            b, cfg.floor_bytes(b, ctx) / fit.params.R_copy,
            step_today(costs, fit.params)["step"] if today else None, meas.get(b),
            _persistent_both(costs, fit.params) if design != "today" else None,
            item1_today(costs, fit.params) if today else None))
    return out
