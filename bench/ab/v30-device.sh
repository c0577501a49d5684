#!/usr/bin/env bash
# Version 29's prepared device runs (docs/PERFORMANCE.md, "Prepared for the next device session"):
# Tuning.chunk_btg = 64 (prefill chunks of 64 rows or more at the B = 64 lane's GEMV kernels)
# against the default, after `VERIFY=all BENCH_B=` on the same tree (its GPU tests include
# tests/gpu/test_serve_lock.py::test_serve_lock_with_wide_chunk_tiles_on_the_gpu). CPU machine
# first (clean tree): make device-prep, then
#   QWEN38_CACHE=.cache/q38 python scripts/precompile.py qwen3.8-27b:1:pt64 qwen3.8-27b:16:pt64 \
#     qwen3.8-27b:1:pt64:chunk_btg=64 qwen3.8-27b:16:pt64:chunk_btg=64
#   QWEN38_CACHE=.cache/q38 python scripts/precompile.py tiny:7:pt16 tiny:16:pt16 tiny:64:pt16
#   QWEN38_CACHE=.cache/q38 python scripts/precompile.py qwen3.8-27b:1:1:pt2 qwen3.8-27b:16:1:pt2 \
#     qwen3.8-27b:1:1:pt2:t qwen3.8-27b:16:1:pt2:t qwen3.8-27b:1:t qwen3.8-27b:16:t
# PART=trace (~150 s): bench --mtp 1 --batch 1,16 --trace, where the speculative step goes.
# PART=rate (~60 s): scripts/wgmma_rate.py's table with the conversion in flight (GEMV_MAINLOOP.md
# step 0); build its cubin first: python scripts/wgmma_rate.py build .cache/rate.cubin
# PART=stream: scripts/stream_bench.py's stand-ins (PERSISTENT.md step 0); build .cache/stream.cubin
# first: python scripts/stream_bench.py build .cache/stream.cubin
# PART=spec (~60 s): check --serve --mtp 1 at B = 3 and 16, the program judging sampled drafts
# (spec_sample's table choice since version 31; precompile tiny:16:1).
# gemv_cv (GEMV_MAINLOOP.md §6): GEMV_SWEEP=cv python3 scripts/gemv_sweep.py build .cache/cv.cubin here,
# then GEMV_SWEEP=cv python3 scripts/gemv_sweep.py run .cache/cv.cubin on the device.
# PARTS="a b ...": several parts in one call, in order. PREFILL=1024: PART=ttft at 1 024 tokens only.
# then on the device, carry [".gpu", ".cache"]: PART=ttft bash bench/ab/v30-device.sh (~300 s),
# PART=serve (~200 s), PART=tiny (~120 s: the tiny model's serving at version 29's defaults,
# whose chunks now run 32-row tiles, against multi_tile=0, version 28's).
# Logs in $OUT (v30-PART.log and the json).
set -uo pipefail
OUT=${OUT:-/tmp/v30}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpu/*.whl 2>/dev/null || exit 3
export PYTHONUNBUFFERED=1 OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 COLUMNS=200
export PYTHONPATH=/tmp/site:$PWD QWEN38_CACHE=$PWD/.cache/q38
Q="python3 -m cli"
if [ -n "${PARTS:-}" ]; then
  for p in $PARTS; do PART=$p PARTS= bash "$0"; done
  exit 0
fi
PART=${PART:-ttft}
{
  echo "commit $(cat .gpu/COMMIT)"; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  if [ "$PART" = trace ]; then   # Performance II item 3: the speculative step, launch by launch
    echo "==== bench --mtp 1 --batch 1,16 --trace"
    timeout 200 $Q bench --mtp 1 --batch 1,16 --trace --json "$OUT/bench-mtp1-trace.json" 2>&1 | tail -120
    exit 0
  fi
  if [ "$PART" = spec ]; then     # the serve lock with the program judging sampled drafts
    for b in 3 16; do
      echo "==== check --serve --mtp 1 --batch $b"
      timeout 120 $Q check --serve --mtp 1 --batch $b 2>&1 | tail -4
      echo "rc ${PIPESTATUS[0]}"
    done
    exit 0
  fi
  if [ "$PART" = rate ]; then     # Performance II item 2, step 0: the conversion in flight
    echo "==== scripts/wgmma_rate.py run"
    timeout 240 python3 scripts/wgmma_rate.py run .cache/rate.cubin 2>&1
    exit 0
  fi
  if [ "$PART" = stream ]; then   # Performance II item 1, step 0: what the memory allows
    echo "==== scripts/stream_bench.py run"
    timeout 100 python3 scripts/stream_bench.py run .cache/stream.cubin 2>&1 | tail -30
    exit 0
  fi
  if [ "$PART" = tiny ]; then
    for w in short long; do
      for t in "" "--tune multi_tile=0"; do
        echo "==== bench --serve $w --batch 7,16,64 (tiny) ${t:-(the defaults)}"
        timeout 60 $Q bench --model tiny --serve $w --batch 7,16,64 $t \
          --json "$OUT/serve-tiny-$w${t:+-mt0}.json" 2>&1 | grep -E '^serve|GPU'
      done
    done
  fi
  for t in "" "--tune chunk_btg=64"; do
    if [ "$PART" = tiny ]; then
      break
    elif [ "$PART" = ttft ]; then   # Performance II item 4: time to first token
      echo "==== bench --prefill ${PREFILL:-1024,8192} --batch 1,16 --pt 64 ${t:-(the lane tile)}"
      timeout 150 $Q bench --model qwen3.8-27b --prefill ${PREFILL:-1024,8192} --batch 1,16 --pt 64 $t \
        --json "$OUT/prefill${t:+-c64}.json" 2>&1 | tail -10
    else                          # the 27B's serving, where chunks are ~70 % of the GPU's time
      echo "==== bench --serve realistic --requests 32 --batch 16 --pt 64 ${t:-(the lane tile)}"
      timeout 100 $Q bench --model qwen3.8-27b --serve realistic --requests 32 --batch 16 --pt 64 \
        $t --json "$OUT/serve-27b-b16${t:+-c64}.json" 2>&1 | grep -v '^\s*$' | tail -6
    fi
  done
} 2>&1 | tee "$OUT/v30-$PART.log"
