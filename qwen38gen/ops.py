"""The program plan: which kernel instantiations a model and lane choice need, their entry points,
the buffers, the fused weights, and the launch schedule of a decode step and a prefill chunk.

Each kernel header in kernels/ has one builder here that knows its template arguments, its C
signature and its launch rule; nothing else in the package knows a kernel's signature.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .config import ModelConfig
from .lanes import Lanes

# ------------------------------------------------------------------------------------ entries


@dataclass(frozen=True)
class Entry:
    """One extern "C" __global__ entry point wrapping a q38:: kernel body."""

    name: str
    call: str                               # e.g. "q38::gemv_q4<512, 1, 2, 4, 0>"
    params: tuple[tuple[str, str], ...]     # (C type, name), in argument order
    threads: int
    smem: int = 0                           # dynamic shared memory bytes

    def render(self) -> str:
        sig = ", ".join(f"{t} {n}" for t, n in self.params)
        args = ", ".join(n for _, n in self.params)
        return (f'extern "C" __global__ void __launch_bounds__({self.threads})\n'
                f"{self.name}({sig}) {{ {self.call}({args}); }}\n")

    def manifest(self) -> dict:
        return {"block": [self.threads, 1, 1], "smem": self.smem,
                "params": [list(p) for p in self.params], "call": self.call}


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def pad16(n: int) -> int:
    return cdiv(n, 16) * 16


# ------------------------------------------------------------------------------------ GEMV
GEMV_MT = 1    # m-tiles (16 output features) per warp
GEMV_KS = 8    # warps per block splitting K (fewer when K has fewer groups)
GEMV_PARAMS = (("const uint4*", "qweight"), ("const q38::bf16*", "scales"),
               ("const q38::bf16*", "x"), ("int", "ldx"), ("q38::bf16*", "y"), ("int", "ldy"),
               ("int", "N"), ("int", "R"))


def gemv_entry(k: int, btg: int, epi: int) -> Entry:
    ks = min(GEMV_KS, k // 128)
    nt = btg // 8
    return Entry(name=f"q38_gemv_k{k}_m{GEMV_MT}_n{nt}_s{ks}_e{epi}",
                 call=f"q38::gemv_q4<{k}, {GEMV_MT}, {nt}, {ks}, {epi}>",
                 params=GEMV_PARAMS, threads=32 * ks)


# ------------------------------------------------------------------------------------ plan
@dataclass
class Plan:
    headers: list[str] = field(default_factory=list)
    constants: list[tuple[str, object]] = field(default_factory=list)
    entries: list[Entry] = field(default_factory=list)
    buffers: dict = field(default_factory=dict)
    weights: dict = field(default_factory=dict)
    schedule: dict = field(default_factory=dict)

    def entry(self, e: Entry) -> Entry:
        if all(x.name != e.name for x in self.entries):
            self.entries.append(e)
        return e


def fused_weights(cfg: ModelConfig) -> dict:
    """The int4 weights as the GEMVs read them: parts concatenated along rows, each part padded
    to a multiple of 16 rows. name -> {"k", "rows", "parts": [[hf name, row offset, rows]]}."""
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
    return w
