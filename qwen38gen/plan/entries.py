"""The plan's parts every kernel family shares: Entry (one extern "C" entry point), Plan (what
a program is made of), the fused weights and their roles, the buffer argument form.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from ..config import ModelConfig

BF = "const q38::bf16*"
I32 = "const int*"

@dataclass(frozen=True)
class Entry:
    """One extern "C" __global__ entry point wrapping a q38:: kernel body."""

    name: str
    call: str                               # e.g. "q38::gemv_q4<512, 1, 2, 4, 0>"
    params: tuple[tuple[str, str], ...]     # (C type, name), in argument order
    threads: int
    smem: int = 0                           # dynamic shared memory bytes
    cluster: int = 1                        # thread-block cluster size along x (1: none)
    min_blocks: int = 0                     # __launch_bounds__ minBlocksPerSM (0: not given)
    # Blocks per SM the schedule was measured at and its grid sized for, where that is more than
    # min_blocks promises: the gate fails a build whose registers or shared memory allow fewer
    # (0: not checked). Not rendered; the manifest carries it.
    resident: int = 0
    asserts: tuple[str, ...] = ()           # C++ constant expressions that must hold
    # Programmatic dependent launch: the entry point lets the next kernel launch, then waits for
    # the previous one before the body runs, unless the body calls q38::pdl_wait() itself (after
    # loading only data no kernel of the same graph writes).
    waits: bool = False
    # The kernel family (gemv_q4, gemm_q4, wgmma_q4, wgmma_sk_q4, gdn, attn_prep, attn_tc,
    # rmsnorm, rmsnorm_ld, swiglu, embed, argmax, topk, gather_last, advance, spec_*) and what the
    # manifest's consumers read beside it (e.g. "tiles": the n-tiles of the tile order it writes
    # its output in, 0 for rows): the manifest's typed fields, never parsed from the name.
    family: str = ""
    meta: tuple[tuple[str, object], ...] = ()
    # The body's arguments where they are not the parameters in order (e.g. a nullptr for an
    # optional pointer the entry does not take, before one it does).
    call_args: tuple[str, ...] = ()

    def render(self, trace_kid: int | None = None) -> str:
        """The entry point's source; trace_kid: in the trace variant of a program (trace.cuh), the
        body runs inside a TraceScope that records this entry's index."""
        sig = ", ".join(f"{t} {n}" for t, n in self.params)
        args = ", ".join(self.call_args or [n for _, n in self.params])
        pre = "q38::pdl_launch_dependents(); " + ("" if self.waits else "q38::pdl_wait(); ")
        if trace_kid is not None:
            pre = f"q38::TraceScope q38_trace_scope({trace_kid}); " + pre
        checks = "".join(f'static_assert({a}, "{self.name}: launch shape out of date");\n'
                         for a in self.asserts)
        cl = f" __cluster_dims__({self.cluster}, 1, 1)" if self.cluster > 1 else ""
        lb = f"{self.threads}, {self.min_blocks}" if self.min_blocks else f"{self.threads}"
        return (f"{checks}"
                f'extern "C" __global__ void __launch_bounds__({lb}){cl}\n'
                f"{self.name}({sig}) {{ {pre}{self.call}({args}); }}\n")

    def manifest(self) -> dict:
        m = {"block": [self.threads, 1, 1], "smem": self.smem, "cluster": self.cluster,
             "params": [list(p) for p in self.params], "call": self.call}
        if self.resident:
            m["resident"] = self.resident
        if self.family:
            m["family"] = self.family
        m.update((k, dict(v) if isinstance(v, dict) else v) for k, v in self.meta)
        return m


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def pad16(n: int) -> int:
    return cdiv(n, 16) * 16

@dataclass
class Plan:
    headers: list[str] = field(default_factory=list)
    constants: list[tuple[str, object]] = field(default_factory=list)
    entries: list[Entry] = field(default_factory=list)
    buffers: dict = field(default_factory=dict)
    weights: dict = field(default_factory=dict)
    tensors: dict = field(default_factory=dict)
    schedule: dict = field(default_factory=dict)

    def entry(self, e: Entry) -> Entry:
        """Add e unless an entry of its name is there; an instance launched where it must keep
        more blocks per SM resident keeps the larger requirement."""
        for i, x in enumerate(self.entries):
            if x.name == e.name:
                if e.resident > x.resident:
                    self.entries[i] = dataclasses.replace(x, resident=e.resident)
                return e
        self.entries.append(e)
        return e


def fused_weights(cfg: ModelConfig, mtp: bool = False) -> dict:
    """The int4 weights as the GEMVs read them: parts concatenated along rows, each part padded
    to a multiple of 16 rows. name -> {"k", "rows", "parts": [[hf name, row offset, rows]]}.
    mtp: also the MTP layer's (M.fc over [embedding | hidden], K = 2H; M.in, M.out, M.gate_up,
    M.down as a full-attention layer's)."""
    def fuse(parts: list[str]) -> dict:
        shapes = cfg.tensor_shapes()
        off, out = 0, []
        k = shapes[parts[0]][1]
        for p in parts:
            n, kk = shapes[p]
            assert kk == k, p
            out.append([p, off, n])
            off += pad16(n)
        return {"k": k, "rows": off, "parts": out}

    w = {}
    for i in range(cfg.num_hidden_layers):
        p = f"model.language_model.layers.{i}."
        if i in cfg.linear_layers:
            la = p + "linear_attn."
            w[f"L{i}.in"] = fuse([la + "in_proj_qkv.weight", la + "in_proj_z.weight",
                                  la + "in_proj_b.weight", la + "in_proj_a.weight"])
            w[f"L{i}.out"] = fuse([la + "out_proj.weight"])
        else:
            sa = p + "self_attn."
            w[f"L{i}.in"] = fuse([sa + "q_proj.weight", sa + "k_proj.weight", sa + "v_proj.weight"])
            w[f"L{i}.out"] = fuse([sa + "o_proj.weight"])
        w[f"L{i}.gate_up"] = fuse([p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"])
        w[f"L{i}.down"] = fuse([p + "mlp.down_proj.weight"])
    w["lm_head"] = fuse(["lm_head.weight"])
    if mtp:
        p = "mtp.layers.0."
        sa = p + "self_attn."
        w["M.fc"] = fuse(["mtp.fc.weight"])
        w["M.in"] = fuse([sa + "q_proj.weight", sa + "k_proj.weight", sa + "v_proj.weight"])
        w["M.out"] = fuse([sa + "o_proj.weight"])
        w["M.gate_up"] = fuse([p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"])
        w["M.down"] = fuse([p + "mlp.down_proj.weight"])
    return w



def weight_role(name: str) -> str:
    """The role of fused weight `name` (tuning.ROLES), what the schedule table is keyed by:
    L{i}.in / .out / .gate_up / .down and the MTP layer's M.* by their last part, lm_head."""
    return name.rpartition(".")[2]


HEADERS = ["common.cuh", "gemv_q4.cuh", "gemm_q4.cuh", "rmsnorm.cuh", "gdn.cuh", "attention.cuh",
           "attention_tc.cuh", "elementwise.cuh", "rows.cuh"]
MTP_HEADERS = ["speculative.cuh"]

# Tensors uploaded as they are (not int4), with the dtype the kernels read them in.
RAW_DTYPES = {"A_log": "float32", "linear_attn.norm.weight": "float32"}


def raw_dtype(name: str) -> str:
    for suffix, dt in RAW_DTYPES.items():
        if name.endswith(suffix):
            return dt
    return "bfloat16"


def buf(name: str, off: int = 0, per_tmax: int = 0) -> list:
    return ["buf", name, off, per_tmax]

