"""Compile the programs a device run needs into the gate's cache (QWEN38_CACHE) on the CPU
machine, so the GPU machine loads them instead of running nvcc (carry the cache folder).

  QWEN38_CACHE=.cache/q38 python3 scripts/precompile.py [--tune KEY=VALUE ...] MODEL:B[:K|:t][:ptN][:btgN][:KEY=VALUE] ...
  e.g. qwen3.8-27b:1 qwen3.8-27b:16 tiny:64 tiny:16:1 tiny:3:pt8
  (pt: `qwen38gen bench` uses 1 for the 27B; check uses QWEN38_PT or 16; ptN names it; K: the
  mtp lane's drafts; t: the trace variant of `bench --trace`)

  QWEN38_CACHE=.cache/q38 python3 scripts/precompile.py --verify
  compiles exactly the programs of `VERIFY=... bash scripts/device.sh` (VERIFY_PROGRAMS; the
  cache key holds the nvcc version, so the device's nvcc must be the same release).

  The tuning is the CLI's: the QWEN38_* A/B variables, then each --tune (`qwen38gen lanes`).
"""

from __future__ import annotations

import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from qwen38gen.build import build  # noqa: E402
from qwen38gen.config import PRESETS  # noqa: E402
from qwen38gen.errors import UserError  # noqa: E402
from qwen38gen.lanes import Lanes  # noqa: E402
from qwen38gen.tuning import Tuning, tuning_from_env  # noqa: E402

TUNING = Tuning()
TUNE_ARGS: list[str] = []   # the command line's --tune settings (TUNING), for per-spec additions

# What scripts/device.sh VERIFY runs, program by program (keep the two in step):
VERIFY_PROGRAMS = (
    "tiny:2:pt8", "tiny:3:pt8",                        # tests/gpu/test_engine.py
    "tiny:1:t", "tiny:3:t", "tiny:16:t",               # tests/gpu/test_trace.py (+ tiny:1,3,16)
    "tiny:3:1:pt2", "tiny:3:1:pt2:t",                  # ... the mtp trace variant
    "tiny:1", "tiny:3", "tiny:16", "tiny:64",          # check; one_step.py (sanitizer) at B = 3
    "tiny:1:1", "tiny:16:1",                           # check --mtp 1
    "tiny:2:1",                                        # tests/gpu/test_nan_locks.py (+ tiny:3, tiny:2:pt8)
    "tiny:2:1:pt8", "tiny:3:1:pt8",                    # tests/gpu/test_serve_lock.py, --mtp 1
    "tiny:2:1:pt8:spec_sample=0", "tiny:3:1:pt8:spec_sample=0",   # ... the host path
    "tiny:3:pt32:chunk_btg=64",                        # tests/gpu/test_serve_lock.py, wide chunks
    "tiny:3:1",                                        # check --serve --mtp 1 --batch 3 (+ tiny:3)
    "tiny:1:pt8",                                      # run --batch 3 against --batch 1 (pt 8)
    "qwen3.5-0.8b:3",                                  # check --reference qwen3.5-0.8b --batch 3
    "hf-e2e:2", "hf-e2e:5",                            # tests/gpu/test_hf_end_to_end.py
    "qwen3.5-0.8b:16", "qwen3.5-2b:3", "qwen3.5-2b:16",    # scripts/precision.py (with tiny:3,
    "qwen3.5-4b:3", "qwen3.5-4b:16",                       # tiny:16, qwen3.5-0.8b:3)
    "qwen3.8-27b:1", "qwen3.8-27b:16", "qwen3.8-27b:64",   # bench --batch 1,16,64
)


def models() -> dict:
    """The presets, and the geometry of the HF end-to-end check (hf-e2e: no preset)."""
    from qwen38gen.verify.hf_e2e import e2e_config

    return {**PRESETS, "hf-e2e": e2e_config()}


def lanes_of(spec: str) -> tuple[str, Lanes, bool]:
    """MODEL:B[:K|:t][:ptN][:btgN][:KEY=VALUE…] -> (model, lanes, trace)."""
    model, b, *rest = spec.split(":")
    if model not in models():
        raise SystemExit(f"error: {spec}: unknown preset {model!r}")
    trace, mtp, pt, btg, tune = False, 0, None, None, []
    for item in rest:
        if "=" in item:             # KEY=VALUE: a tuning setting of this program only
            tune.append(item)
        elif item == "t":
            trace = True
        elif item.startswith("pt") and item[2:].isdigit():
            pt = int(item[2:])
        elif item.startswith("btg") and item[3:].isdigit():
            btg = int(item[3:])
        elif item.isdigit():
            mtp = int(item)
        else:
            raise SystemExit(f"error: {spec}: {item!r} is none of K (mtp drafts), t (trace), ptN, "
                             "btgN, KEY=VALUE")
    if pt is None and model == "qwen3.8-27b" and not mtp:
        pt = 1
    try:
        tuning = Tuning.parse(TUNE_ARGS + tune) if tune else TUNING
        lanes = Lanes.make(int(b), btg=btg, pt=pt, mtp=mtp, tuning=tuning, model=models()[model])
    except (UserError, ValueError) as e:
        raise SystemExit(f"error: {spec}: {e}") from None
    return model, lanes, trace


def one(spec: str) -> str:
    model, lanes, trace = lanes_of(spec)
    cubin, _ = build(models()[model], lanes, trace=trace)
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
    TUNE_ARGS = tuning_from_env() + tune
    TUNING = Tuning.parse(TUNE_ARGS)
    if specs == ["--verify"]:
        specs = list(VERIFY_PROGRAMS)
    for s in specs:
        lanes_of(s)   # every spec parses before the first build
    with ThreadPoolExecutor(2) as ex:
        for line in ex.map(one, specs):
            print(line, flush=True)
