#!/usr/bin/env bash
# The serving and speculative-step runs prepared in version 28 (docs/PERFORMANCE.md, "Prepared for
# the next device session"), at version 29's defaults (sample_split=1, the 32-row multi tile), after
# `VERIFY=all BENCH_B=` on the same tree (which runs the GPU tests of --tune spec_sample=1). CPU
# machine first (clean tree): make device-prep, then
#   QWEN38_CACHE=.cache/q38 python scripts/precompile.py qwen3.8-27b:16:1:pt64 \
#     qwen3.8-27b:16:1:pt64:spec_sample=1 qwen3.8-27b:64:1:pt64:spec_sample=1 qwen3.8-27b:1 qwen3.8-27b:16 qwen3.8-27b:1:1:pt2 \
#     qwen3.8-27b:16:1:pt2 qwen3.8-27b:1:1:pt2:multi_tile=0 qwen3.8-27b:16:1:pt2:multi_tile=0
# then on the device, carry [".gpu", ".cache"]: PART=mtp bash bench/ab/v29-device.sh (~550 s);
# PART=step (~150 s): the speculative step against the plain one at B = 1 and 16, at the table's
# 32-row multi tile and with multi_tile=0 (the lane's tile; Performance II item 3: 1.10 / 1.77 ×
# on the H100 at 4d3e5cc; the B = 16 verify pass is 32 rows, two weight passes at the lane's
# 16-row tile, one at 32). Logs in $OUT (v29-PART.log and the json).
set -uo pipefail
OUT=${OUT:-/tmp/v29}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpu/*.whl 2>/dev/null || exit 3
export PYTHONUNBUFFERED=1 OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 COLUMNS=200
export PYTHONPATH=/tmp/site:$PWD QWEN38_CACHE=$PWD/.cache/q38
Q="python3 -m cli"
PART=${PART:-mtp}
{
  echo "commit $(cat .gpu/COMMIT)"; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  if [ "$PART" = mtp ]; then   # Serving II item 4: the 27B with --mtp 1, sampled slots on the device
    for s in "--tune spec_sample=1" ""; do
      echo "==== bench --serve realistic --requests 16 --batch 16 --pt 64 --mtp 1 (27B) $s"
      timeout 200 $Q bench --model qwen3.8-27b --serve realistic --requests 16 --batch 16 --pt 64 \
        --mtp 1 $s --json "$OUT/serve-27b-b16-mtp1${s:+-spec}.json" 2>&1 | grep -v '^\s*$' | tail -12
    done
    echo "==== bench --serve realistic --requests 64 --batch 64 --pt 64 --mtp 1 (27B) --tune spec_sample=1"
    timeout 240 $Q bench --model qwen3.8-27b --serve realistic --requests 64 --batch 64 --pt 64 \
      --mtp 1 --tune spec_sample=1 --json "$OUT/serve-27b-b64-mtp1-spec.json" 2>&1 | grep -v '^\s*$' | tail -12
  elif [ "$PART" = step ]; then
    for t in "" "--tune multi_tile=0"; do
      echo "==== bench --mtp 1 --batch 1,16 (27B) ${t:-(the table 32-row multi tile)}"
      timeout 120 $Q bench --mtp 1 --batch 1,16 $t --json "$OUT/bench-mtp1${t:+-mt0}.json" 2>&1 | tail -12
    done
  fi
} 2>&1 | tee "$OUT/v29-$PART.log"
