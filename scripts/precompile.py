"""Compile the programs a device run needs into the gate's cache (QWEN38_CACHE) on the CPU
machine, so the GPU machine loads them instead of running nvcc (carry the cache folder).

  QWEN38_CACHE=.cache/q38 python3 scripts/precompile.py [--tune KEY=VALUE ...] MODEL:B[:mtp|:t] ...
  e.g. qwen3.8-27b:1 qwen3.8-27b:16 tiny:64 tiny:16:1   (pt: `qwen38gen bench` uses 1 for the
  27B; check uses QWEN38_PT or 16); MODEL:B:t is the trace variant (`bench --trace`). The
  tuning is the CLI's: the QWEN38_* A/B variables, then each --tune (`qwen38gen lanes`).
"""

from __future__ import annotations

import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from qwen38gen.check import build  # noqa: E402
from qwen38gen.config import PRESETS  # noqa: E402
from qwen38gen.lanes import Lanes  # noqa: E402
from qwen38gen.tuning import Tuning, tuning_from_env  # noqa: E402

TUNING = Tuning()


def one(spec: str) -> str:
    model, b, *rest = spec.split(":")
    trace = rest == ["t"]
    mtp = int(rest[0]) if rest and not trace else 0
    lanes = Lanes.make(int(b), pt=1 if model == "qwen3.8-27b" and not mtp else None, mtp=mtp,
                       tuning=TUNING)
    cubin, _ = build(PRESETS[model], lanes, trace=trace)
    return f"{spec}: {cubin}"


def split_args(argv: list[str]) -> tuple[list[str], list[str]]:
    """(--tune settings, program specs) of the command line."""
    tune, specs, it = [], [], iter(argv)
    for a in it:
        if a == "--tune":
            tune.append(next(it, ""))
        else:
            specs.append(a)
    return tune, specs


if __name__ == "__main__":
    tune, specs = split_args(sys.argv[1:])
    TUNING = Tuning.parse(tuning_from_env() + tune)
    with ThreadPoolExecutor(2) as ex:
        for line in ex.map(one, specs):
            print(line, flush=True)
