"""A quantized checkpoint folder of random int4 weights, written fast, for timing `run`'s cold
start from a folder (Serving II item 3) where no real checkpoint can be had (the device machine
reaches nothing outside it).

    python scripts/synthetic_quantized.py write OUT --model qwen3.8-27b   # ~14 GB at the 27B
    python scripts/synthetic_quantized.py drop OUT     # its pages out of the page cache

The folder is what `qwen38gen quantize` writes (FORMAT.md "Files": NAME.qweight / .scales /
.shape per linear weight, the other tensors as they are, quantization.json, config.json), with
values that make no sense as a model: codes are random bits repeated from a 16 MiB block,
scales 0.005–0.015, the other tensors small random values. `load_quantized` accepts it and the
program runs it; only timing is meaningful. `write` ends with the shards synced to disk and
dropped from the page cache (posix_fadvise DONTNEED), so the next `run` reads them from the disk.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from qwen38gen.config import load_config  # noqa: E402
from qwen38gen.quantize import QUANT_JSON, QUANT_META, _base  # noqa: E402
from qwen38gen.checkpoint import ShardWriter, atomic_dir  # noqa: E402
from qwen38gen.weights import BF16  # noqa: E402

BLOCK = 16 << 20   # bytes of random data repeated through the big tensors


def filled(shape, dtype, block: np.ndarray) -> np.ndarray:
    """An array of this shape and dtype whose bytes repeat ``block`` (bytes)."""
    n = int(np.prod(shape)) * np.dtype(dtype).itemsize
    out = np.empty(n, np.uint8)
    for o in range(0, n, block.size):
        m = min(block.size, n - o)
        out[o:o + m] = block[:m]
    return out.view(dtype).reshape(shape)


def write(out: Path, model: str, overwrite: bool) -> None:
    cfg = load_config(model)
    rng = np.random.default_rng(0)
    bits = rng.integers(0, 256, BLOCK, dtype=np.uint8)
    scales = rng.uniform(0.005, 0.015, BLOCK // 2).astype(BF16).view(np.uint8)
    small = (rng.standard_normal(BLOCK // 2) * 0.02).astype(BF16).view(np.uint8)
    t0, nbytes = time.perf_counter(), 0
    with atomic_dir(out, overwrite=overwrite) as tmp:
        w = ShardWriter(tmp)
        for n, shape in cfg.tensor_shapes(mtp=bool(cfg.mtp_num_hidden_layers)).items():
            if cfg.is_int4(n, shape):
                N, K = shape
                tiles = -(-N // 16)
                q = filled((tiles, K // 64, 32, 4), np.uint32, bits)
                s = filled((tiles, K // 128, 16), BF16, scales)
                w.add({_base(n) + ".qweight": q, _base(n) + ".scales": s,
                       _base(n) + ".shape": np.array(shape, np.int64)})
                nbytes += q.nbytes + s.nbytes
            else:
                dt = np.float32 if n.endswith(("A_log", "linear_attn.norm.weight")) else BF16
                a = (filled(shape, BF16, small).astype(np.float32) if dt == np.float32
                     else filled(shape, BF16, small))
                w.add({n: a})
                nbytes += a.nbytes
        w.close()
        (tmp / "config.json").write_text(json.dumps(cfg.to_hf_dict(), indent=2) + "\n")
        (tmp / QUANT_JSON).write_text(json.dumps(QUANT_META, indent=2, sort_keys=True) + "\n")
    drop(out)
    print(f"{out}: {cfg.name}, {nbytes / 1e9:.2f} GB of tensors in "
          f"{time.perf_counter() - t0:.1f} s (synced, out of the page cache)")


def drop(folder: Path) -> None:
    """Every file of the folder synced and its pages dropped from the page cache."""
    for f in sorted(Path(folder).iterdir()):
        fd = os.open(f, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("write")
    a.add_argument("out", type=Path)
    a.add_argument("--model", default="qwen3.8-27b")
    a.add_argument("--overwrite", action="store_true")
    d = sub.add_parser("drop")
    d.add_argument("folder", type=Path)
    args = ap.parse_args(argv)
    if args.cmd == "write":
        write(args.out, args.model, args.overwrite)
    else:
        drop(args.folder)
    return 0


if __name__ == "__main__":
    sys.exit(main())
