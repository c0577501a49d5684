#!/usr/bin/env bash
# Version 28's device runs, after `VERIFY=all BENCH_B=` and v27-device.sh PART=short in the first
# call (the lane choices' correctness, the sampler A/B, TTFT with multi_tile=32). CPU machine
# first (clean tree): make device-prep, v27-device.sh's precompiles, then
#   QWEN38_CACHE=.cache/q38 python scripts/precompile.py tiny:64:pt16:btg16 tiny:64:pt16:btg32 \
#     tiny:7:t tiny:64:t tiny:64:btg16 tiny:64:btg16:t
#   QWEN38_CACHE=.cache/q38 python scripts/precompile.py --tune sample_split=1 --tune multi_tile=32 \
#     qwen3.8-27b:16:pt64 qwen3.8-27b:64:pt64 qwen3.8-27b:16:1:pt64
# then on the device, carry [".gpu", ".cache"]:
#   PART=tiny bash bench/ab/v28-device.sh   (~380 s: where the tiny B = 64 step goes, and whether
#                                            a narrower GEMV tile serves it faster; the 27B at
#                                            B = 16 with both lane choices against the table)
#   PART=big  bash bench/ab/v28-device.sh   (~400 s: the 27B at B = 64, and --mtp 1 at B = 16)
# Logs in $OUT (v28-PART.log and the json/png).
set -uo pipefail
OUT=${OUT:-/tmp/v28}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpu/*.whl 2>/dev/null || exit 3
export PYTHONUNBUFFERED=1 OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 COLUMNS=200
export PYTHONPATH=/tmp/site:$PWD QWEN38_CACHE=$PWD/.cache/q38
Q="python3 -m cli"
T="--tune sample_split=1 --tune multi_tile=32"
PART=${PART:-tiny}
{
  echo "commit $(cat .gpu/COMMIT)"; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  if [ "$PART" = tiny ]; then
    for t in "" "--btg 16"; do
      echo "==== bench --model tiny --batch 7,64 --trace $t"
      timeout 50 $Q bench --model tiny --batch 7,64 --trace $t \
        --json "$OUT/bench-tiny-trace${t:+-btg16}.json" 2>&1 | tail -45
    done
    for t in "" "--tune wgmma_sk=off" "--btg 16" "--btg 32"; do
      echo "==== bench --serve short --batch 64 (tiny) ${t:-(the table)}"
      timeout 40 $Q bench --model tiny --serve short --batch 64 $t 2>&1 | grep -E '^serve|GPU'
    done
    for t in "" "$T"; do
      echo "==== bench --serve realistic --requests 32 --batch 16 --pt 64 (27B) ${t:-(the table)}"
      timeout 110 $Q bench --model qwen3.8-27b --serve realistic --requests 32 --batch 16 --pt 64 $t \
        --json "$OUT/serve-27b-b16${t:+-tuned}.json" 2>&1 | grep -E '^serve|GPU' | tail -4
    done
  else
    echo "==== bench --serve realistic --requests 64 --batch 64 --pt 64 (27B) $T"
    timeout 250 $Q bench --model qwen3.8-27b --serve realistic --requests 64 --batch 64 --pt 64 $T \
      --json "$OUT/serve-27b-b64-tuned.json" 2>&1 | grep -v '^\s*$' | tail -12
    echo "==== bench --serve realistic --requests 32 --batch 16 --pt 64 --mtp 1 (27B) $T"
    timeout 150 $Q bench --model qwen3.8-27b --serve realistic --requests 32 --batch 16 --pt 64 --mtp 1 $T \
      --json "$OUT/serve-27b-b16-mtp1-tuned.json" 2>&1 | grep -v '^\s*$' | tail -14
  fi
} 2>&1 | tee "$OUT/v28-$PART.log"
