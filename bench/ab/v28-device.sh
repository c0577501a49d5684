#!/usr/bin/env bash
# Version 28's device runs beyond v27-device.sh's PART=short|sample|perf: the 27B's serving with
# both version 27 lane choices on (sample_split=1, multi_tile=32) at B = 16 and 64, and with
# --mtp 1 at B = 16. CPU machine first (clean tree), besides v27-device.sh's header:
#   QWEN38_CACHE=.cache/q38 python scripts/precompile.py --tune sample_split=1 --tune multi_tile=32 \
#     qwen3.8-27b:16:pt64 qwen3.8-27b:64:pt64 qwen3.8-27b:16:1:pt64
# then on the device, carry [".gpu", ".cache"]: PART=serve27 bash bench/ab/v28-device.sh
# Logs in $OUT (v28-PART.log and the json/png).
set -uo pipefail
OUT=${OUT:-/tmp/v28}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpu/*.whl 2>/dev/null || exit 3
export PYTHONUNBUFFERED=1 OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 COLUMNS=200
export PYTHONPATH=/tmp/site:$PWD QWEN38_CACHE=$PWD/.cache/q38
Q="python3 -m cli"
T="--tune sample_split=1 --tune multi_tile=32"
PART=${PART:-serve27}
{
  echo "commit $(cat .gpu/COMMIT)"; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  if [ "$PART" = serve27 ]; then
    echo "==== bench --serve realistic --requests 64 --batch 16,64 --pt 64 (27B) $T"
    timeout 330 $Q bench --model qwen3.8-27b --serve realistic --requests 64 --batch 16,64 --pt 64 $T \
      --json "$OUT/serve-27b-realistic-b16-64.json" --plot "$OUT/serve-27b-realistic-b16-64.png" \
      2>&1 | grep -v '^\s*$' | tail -20
    echo "==== bench --serve realistic --requests 32 --batch 16 --pt 64 --mtp 1 (27B) $T"
    timeout 200 $Q bench --model qwen3.8-27b --serve realistic --requests 32 --batch 16 --pt 64 --mtp 1 $T \
      --json "$OUT/serve-27b-realistic-mtp1.json" 2>&1 | grep -v '^\s*$' | tail -14
  fi
} 2>&1 | tee "$OUT/v28-$PART.log"
