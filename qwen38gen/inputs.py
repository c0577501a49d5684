"""What the host hands an emitted program, shared by the PyCUDA runtime (runtime.py) and the numpy
emulator of its schedule (emu/): the weights packed as the manifest lays them out
(``pack_weights``, ``fused_arrays``) and the token rows of a prefill chunk (``prompt_chunk``,
B·pt rows; ``packed_chunk`` and ``put_chunk``, packed chunks). Plain numpy:
importing it needs no GPU.
"""

from __future__ import annotations

import numpy as np

from .config import ModelConfig
from .errors import UserError


def prompt_chunk(prompts: list[list[int]], c: int, pt: int) -> tuple[np.ndarray, np.ndarray]:
    """Chunk c of a prefill: token rows [B·pt] (row b·pt + t = token c·pt + t of prompt b, 0
    past its end) and ntok [B] (how many rows of each sequence are real)."""
    B = len(prompts)
    toks = np.zeros(B * pt, np.int32)
    ntok = np.zeros(B, np.int32)
    for b, p in enumerate(prompts):
        piece = p[c * pt:(c + 1) * pt]
        ntok[b] = len(piece)
        toks[b * pt:b * pt + len(piece)] = piece
    return toks, ntok


def packed_chunk(chunks: list[list[int]], pt: int) -> dict[str, np.ndarray]:
    """A packed prefill chunk (docs/KERNELS.md "Packed chunks"): sequence b's ntok[b] =
    len(chunks[b]) ≤ pt tokens are rows row0[b] … row0[b] + ntok[b] − 1, sequences one after
    another (row0 the prefix sums of ntok); rowseq[r] is the sequence of row r, −1 past the
    last. tokens and rowseq have B·pt entries (0 and −1 past the rows)."""
    B = len(chunks)
    ntok = np.fromiter((len(c) for c in chunks), np.int32, B)
    if ntok.size and ntok.max() > pt:
        raise ValueError(f"a prefill chunk holds at most {pt} tokens per sequence")
    row0 = np.zeros(B, np.int32)
    np.cumsum(ntok[:-1], out=row0[1:])
    R = int(ntok.sum())
    tokens = np.zeros(B * pt, np.int32)
    rowseq = np.full(B * pt, -1, np.int32)
    if R:
        tokens[:R] = [t for c in chunks for t in c]
        rowseq[:R] = np.repeat(np.arange(B, dtype=np.int32), ntok)
    return {"tokens": tokens, "ntok": ntok, "row0": row0, "rowseq": rowseq, "rows": R}


def chunk_phase(schedule: dict, rows: int) -> str:
    """The prefill schedule for a packed chunk of ``rows`` rows: the one
    emitted for the fewest rows that hold them ("prefill" holds B·pt)."""
    buckets = schedule["prefill_buckets"]["rows"]
    r = next(r for r in buckets if r >= rows)
    return "prefill" if r == buckets[-1] else f"prefill_r{r}"


def put_chunk(put, schedule: dict, chunks: list[list[int]],
              nexts: list[int | None] | None = None) -> str:
    """Hand a prefill chunk (``chunks[b]``: sequence b's tokens, at most pt) to a program through
    ``put(name, array)``; the phase to run. With pt > 1 a program takes it packed, in the
    schedule of the fewest rows that hold it; with pt = 1 in B rows. An mtp program's chunk
    also takes ``mnext`` (its MTP rows' tokens): for each row the prompt token after it, that is
    the chunk's next token or, on the chunk's last row, ``nexts[b]`` (None where the prompt ends
    in the chunk: −1, the target's own chosen token)."""
    pt = schedule["prefill_pt"]
    if "prefill_buckets" not in schedule:
        toks, ntok = prompt_chunk(chunks, 0, pt)
        row0 = np.arange(len(chunks), dtype=np.int32) * pt
        put("tokens", toks)
        put("ntok", ntok)
        phase = "prefill"
    else:
        pk = packed_chunk(chunks, pt)
        for name in ("tokens", "ntok", "row0", "rowseq"):
            put(name, pk[name])
        row0, phase = pk["row0"], chunk_phase(schedule, max(pk["rows"], 1))
    if nexts is not None:
        mnext = np.zeros(len(chunks) * pt, np.int32)
        for b, c in enumerate(chunks):
            for t in range(len(c)):
                nx = c[t + 1] if t + 1 < len(c) else nexts[b]
                mnext[row0[b] + t] = -1 if nx is None else nx
        put("mnext", mnext)
    return phase


def fused_parts(spec: dict, packed: dict) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """The packed parts of one fused weight, in row-tile order: (qweights, scales).

    ``packed[name] = (qweight, scales_tiled)`` per HF tensor; each part is already padded to a
    multiple of 16 rows, which is what the manifest's row offsets assume.
    """
    qs, ss = [], []
    for name, off, rows in spec["parts"]:
        q, s = packed[name]
        assert q.shape[0] * 16 == -(-rows // 16) * 16, name
        qs.append(q)
        ss.append(s)
    assert sum(q.shape[0] for q in qs) * 16 == spec["rows"]
    return qs, ss


def fused_arrays(spec: dict, packed: dict) -> tuple[np.ndarray, np.ndarray]:
    """One fused weight: its parts concatenated along the row-tile axis (``fused_parts``)."""
    qs, ss = fused_parts(spec, packed)
    return np.concatenate(qs), np.concatenate(ss)


def pack_weights(cfg: ModelConfig, tensors: dict, mtp: bool = False) -> dict:
    """HF-named tensors -> {int4 name: (qweight, scales)} ∪ {other name: array}.

    Accepts float/bf16 arrays (quantized here) or `quantize.QuantizedTensor`s (used as they are).
    mtp: the MTP layer's tensors (``mtp.*``) too, which an mtp-lane program needs.
    """
    from .quantize import QuantizedTensor
    from .weights import quantize_pack

    shapes = cfg.tensor_shapes(mtp=mtp)
    out = {}
    for n, shape in shapes.items():
        if n not in tensors:
            raise UserError(f"weights are missing tensor {n!r}"
                            + ("; an mtp-lane program needs the MTP layer's mtp.* tensors"
                               if n.startswith("mtp.") else ""))
        v = tensors[n]
        if cfg.is_int4(n, shape):
            if isinstance(v, QuantizedTensor):
                out[n] = (v.qweight, v.scales)
            else:
                out[n] = quantize_pack(np.asarray(v, dtype=np.float32), n)
        else:
            out[n] = np.asarray(v)
    return out
