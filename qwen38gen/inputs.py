"""What the host hands an emitted program, shared by the PyCUDA runtime (runtime.py) and the numpy
emulator of its schedule (emu/): the weights packed as the manifest lays them out
(``pack_weights``, ``fused_arrays``) and the token rows of a prefill chunk (``prompt_chunk``).
Plain numpy: importing it needs no GPU.
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


def fused_arrays(spec: dict, packed: dict) -> tuple[np.ndarray, np.ndarray]:
    """Concatenate the packed parts of one fused weight along the row-tile axis.

    ``packed[name] = (qweight, scales_tiled)`` per HF tensor; each part is already padded to a
    multiple of 16 rows, which is what the manifest's row offsets assume.
    """
    qs, ss = [], []
    for name, off, rows in spec["parts"]:
        q, s = packed[name]
        assert q.shape[0] * 16 == -(-rows // 16) * 16, name
        qs.append(q)
        ss.append(s)
    q, s = np.concatenate(qs), np.concatenate(ss)
    assert q.shape[0] * 16 == spec["rows"]
    return q, s


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
