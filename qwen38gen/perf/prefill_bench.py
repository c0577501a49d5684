"""`qwen38gen bench --prefill P,...`: time to first token for B prompts of P tokens each, all
arriving together, at each prefill chunk width pt (docs/PERFORMANCE.md).

Per (pt, B): emit and build the program, make the int4 weights on the GPU (DeviceFill, as `bench`
does), then per prompt length P: zero the state, feed the B prompts in chunks of pt tokens per
sequence (each chunk a graph replay of the packed schedule, the tokens uploaded between chunks as
`run` uploads them) and read the first token. The clock runs from before the first chunk's upload
to the first token on the host: what a user waits for once the program is loaded. One untimed
chunk first captures the graphs; the median of ``reps`` timed passes is reported (fewer where
they add up to ``LONG_S``: a pass of seconds is its own average over hundreds of chunks).

Beside it, two floors for the same work (neither counts the other): every chunk reads the int4
weights once (``chunks · W / copy bandwidth``), and every prompt token costs the linear layers'
``2 · params`` flops plus causal attention's, at the tensor cores' nominal dense bf16 rate
(``TENSOR_PEAK``: the program dequantizes int4 into bf16 MMAs).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass

import numpy as np

from ..build import build
from ..config import ModelConfig
from ..inputs import put_chunk
from ..lanes import Lanes, capped_btg
from ..runtime import DeviceFill, Runtime
from ..tuning import Tuning
from .bench import copy_bandwidth_alone

__all__ = ["TENSOR_PEAK", "PrefillRow", "prefill_flops", "prefill_floor", "prefill_bench",
           "to_json"]

TENSOR_PEAK = 989e12   # H100 / H200 SXM, dense bf16 (nominal, not measured)
LONG_S = 3.0           # once the timed passes add up to this, no more are run


@dataclass
class PrefillRow:
    batch: int
    pt: int
    prompt: int
    chunks: int
    ttft_ms: float
    ttft_ms_spread: tuple[float, float]   # (min, max) of the timed passes
    passes: int
    tok_s: float                          # prompt tokens of all B sequences per second
    floor_bytes_ms: float                 # chunks · W / copy bandwidth
    floor_flops_ms: float                 # flops / TENSOR_PEAK
    tflops: float                         # flops / ttft


def prefill_flops(cfg: ModelConfig, batch: int, prompt: int) -> float:
    """Flops of prefilling B prompts of P tokens: 2 · linear params per token (lm_head counted
    once per sequence: only the last row is projected) and causal attention (QKᵀ and PV over the
    positions up to each token: 4 · heads · head_dim · (P + 1) / 2 per token and layer)."""
    lm = cfg.vocab_size * cfg.hidden_size
    linear = 2.0 * ((cfg.linear_params - lm) * prompt + lm)
    attn = (4.0 * cfg.num_attention_heads * cfg.head_dim * len(cfg.full_layers)
            * prompt * (prompt + 1) / 2)
    return batch * (linear + attn)


def prefill_floor(cfg: ModelConfig, batch: int, prompt: int, pt: int,
                  bandwidth: float) -> tuple[float, float, int]:
    """(bytes floor s, flops floor s, chunks) of one prefill pass."""
    chunks = -(-prompt // pt)
    return (chunks * cfg.int4_weight_bytes() / bandwidth,
            prefill_flops(cfg, batch, prompt) / TENSOR_PEAK, chunks)


def ttft_once(rt: Runtime, prompts: list[list[int]]) -> tuple[float, list[int]]:
    """Seconds from the first chunk's upload to the first token of every sequence on the host,
    and those tokens (each read after its prompt's last chunk, as `run` reads them)."""
    pt, sched = rt.pt, rt.manifest["schedule"]
    ends = [-(-len(p) // pt) for p in prompts]
    first = [0] * len(prompts)
    rt.reset()
    rt.stream.synchronize()
    t0 = time.perf_counter()
    for c in range(max(ends)):
        rt.run_phase(put_chunk(rt.put, sched, [p[c * pt:(c + 1) * pt] for p in prompts]))
        if c + 1 in ends:
            nxt = rt.get("next")    # synchronizes: these first tokens are on the host
            for b, e in enumerate(ends):
                if e == c + 1:
                    first[b] = int(nxt[b])
    return time.perf_counter() - t0, first


def prefill_bench(cfg: ModelConfig, batches: list[int], prompts: list[int], pts: list[int],
                  reps: int = 3, progress=None, tuning: Tuning = Tuning(),
                  on_row=None, btg: int | None = None) -> tuple[float, list[PrefillRow]]:
    """``on_row(row)`` as each row is measured (a run cut short keeps what it printed)."""
    bw = copy_bandwidth_alone()
    rng = np.random.default_rng(0)
    rows = []
    for pt in pts:
        for B in batches:
            lanes = Lanes.make(B, btg=capped_btg(B, btg), pt=pt, tuning=tuning, model=cfg)
            if progress:
                progress(f"pt={pt} B={B}: emit + nvcc")
            cubin, man = build(cfg, lanes)
            if progress:
                progress(f"pt={pt} B={B}: weights on the GPU")
            with Runtime(cubin, man, cfg, DeviceFill(seed=0), tmax=max(prompts) + 1) as rt:
                for P in prompts:
                    seqs = [rng.integers(0, cfg.vocab_size, P).tolist() for _ in range(B)]
                    ttft_once(rt, [s[:pt] for s in seqs])          # captures the graphs
                    if progress:
                        progress(f"pt={pt} B={B}: {reps} prefills of {P} tokens")
                    t = [ttft_once(rt, seqs)[0]]
                    while len(t) < reps and sum(t) < LONG_S:    # a long pass is timed once
                        t.append(ttft_once(rt, seqs)[0])
                    fb, ff, chunks = prefill_floor(cfg, B, P, pt, bw)
                    s = statistics.median(t)
                    rows.append(PrefillRow(
                        batch=B, pt=pt, prompt=P, chunks=chunks, ttft_ms=s * 1e3,
                        ttft_ms_spread=(min(t) * 1e3, max(t) * 1e3), passes=len(t), tok_s=B * P / s,
                        floor_bytes_ms=fb * 1e3, floor_flops_ms=ff * 1e3,
                        tflops=prefill_flops(cfg, B, P) / s / 1e12))
                    if on_row:
                        on_row(rows[-1])
    return bw, rows


def to_json(cfg: ModelConfig, bw: float, rows: list[PrefillRow], device: str) -> dict:
    return {"model": cfg.name, "kind": "prefill", "copy_bandwidth": bw,
            "tensor_peak": TENSOR_PEAK, "device": device, "rows": [asdict(r) for r in rows]}
