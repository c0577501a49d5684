"""Compile the programs a device run needs into the gate's cache (QWEN38_CACHE) on the CPU
machine, so the GPU machine loads them instead of running nvcc (carry the cache folder).

  QWEN38_CACHE=.cache/q38 python3 scripts/precompile.py MODEL:B[:mtp|:t] ...
  e.g. qwen3.8-27b:1 qwen3.8-27b:16 tiny:64 tiny:16:1   (pt: `qwen38gen bench` uses 1 for the
  27B; check uses QWEN38_PT or 16); MODEL:B:t is the trace variant (`bench --trace`)
"""

from __future__ import annotations

import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from qwen38gen.check import build  # noqa: E402
from qwen38gen.config import PRESETS  # noqa: E402
from qwen38gen.lanes import Lanes  # noqa: E402


def one(spec: str) -> str:
    model, b, *rest = spec.split(":")
    trace = rest == ["t"]
    mtp = int(rest[0]) if rest and not trace else 0
    lanes = Lanes.make(int(b), pt=1 if model == "qwen3.8-27b" and not mtp else None, mtp=mtp)
    cubin, _ = build(PRESETS[model], lanes, trace=trace)
    return f"{spec}: {cubin}"


if __name__ == "__main__":
    with ThreadPoolExecutor(2) as ex:
        for line in ex.map(one, sys.argv[1:]):
            print(line, flush=True)
