"""Checkpoint tensors as read-only views of their safetensors files (``CheckpointReader.mapped``).

A view is mapped, not read: its pages come from the file, or the page cache, when something
touches them. Run's GPU backend uploads a quantized folder this way (upload.py): the staged
copy reads each weight once, at disk speed, with no Python copy of the model in between.
"""

from __future__ import annotations

import json
from pathlib import Path

import ml_dtypes
import numpy as np

from .errors import UserError

# safetensors dtype strings -> the numpy dtype of a view
DTYPES = {"BF16": np.dtype(ml_dtypes.bfloat16), "F16": np.dtype(np.float16), "F32": np.dtype(np.float32),
          "F64": np.dtype(np.float64), "U8": np.dtype(np.uint8), "I8": np.dtype(np.int8),
          "U16": np.dtype(np.uint16), "I16": np.dtype(np.int16), "U32": np.dtype(np.uint32),
          "I32": np.dtype(np.int32), "U64": np.dtype(np.uint64), "I64": np.dtype(np.int64)}


def safetensors_offsets(path: Path) -> tuple[int, dict[str, tuple[str, tuple[int, ...], int, int]]]:
    """The data section's start in a safetensors file and, per stored name, (dtype string,
    shape, first byte, end byte) relative to it (the format: an 8-byte little-endian header
    length, the JSON header, then the data)."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        head = json.loads(f.read(n))
    out = {k: (v["dtype"], tuple(v["shape"]), *v["data_offsets"])
           for k, v in head.items() if k != "__metadata__"}
    return 8 + n, out


def map_tensor(reader, name: str) -> np.ndarray:
    """Tensor ``name`` of a ``weights.CheckpointReader`` as a read-only view of its shard (the
    reader keeps each shard's mapping and header once mapped)."""
    fp, shape, _, key = reader._entry(name)
    maps = reader.__dict__.setdefault("_maps", {})
    try:
        if fp not in maps:
            base, offs = safetensors_offsets(fp)
            mm = np.memmap(fp, np.uint8, "r") if fp.stat().st_size else np.zeros(0, np.uint8)
            maps[fp] = (mm, base, offs)
        mm, base, offs = maps[fp]
        dt, shp, b, e = offs[key]
        if dt not in DTYPES or tuple(shp) != tuple(shape) or base + e > mm.size:
            raise ValueError(f"header entry {dt} {list(shp)} [{b}, {e}) does not fit")
        return mm[base + b:base + e].view(DTYPES[dt]).reshape(shape)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise UserError(f"cannot map tensor {name!r} from {str(fp)!r}: {e}") from None
