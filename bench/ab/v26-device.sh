#!/usr/bin/env bash
# The next device session's measurements in one call of under ten minutes (docs/PERFORMANCE.md,
# "Prepared for the next device session", items 2 to 5), after VERIFY=tests and VERIFY=rest on the
# same tree. CPU machine first (clean tree):
#   make device-prep
#   QWEN38_CACHE=.cache/q38 python scripts/precompile.py tiny:7:pt16 tiny:16:pt16 tiny:64:pt16 \
#     qwen3.8-27b:1:pt16 qwen3.8-27b:1:pt64 qwen3.8-27b:1:pt80 qwen3.8-27b:16:pt16 \
#     qwen3.8-27b:16:pt64 qwen3.8-27b:16:pt80
#   python scripts/stream_bench.py build .cache/stream.cubin
# then on the device, carry [".gpu", ".cache"]: bash bench/ab/v26-device.sh (logs in $OUT).
set -uo pipefail
OUT=${OUT:-/tmp/v26}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpu/*.whl 2>/dev/null || exit 3
export PYTHONUNBUFFERED=1 OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 COLUMNS=200
export PYTHONPATH=/tmp/site:$PWD QWEN38_CACHE=$PWD/.cache/q38
Q="python3 -m cli"
{
  echo "commit $(cat .gpu/COMMIT)"; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  for w in short long; do   # Serving II: tiny after the host trim (version 25's prediction)
    echo "==== bench --serve $w (tiny, B = 7, 16, 64)"
    timeout 60 $Q bench --model tiny --serve $w --batch 7,16,64 --json "$OUT/serve-tiny-$w.json" 2>&1 | grep -v "^\s*$" | tail -24
  done
  echo "==== stream_bench (the persistent design's step 0: wsp r24 is one block per SM)"
  timeout 90 python3 scripts/stream_bench.py run .cache/stream.cubin 2>&1 | tail -30
  echo "==== bench --prefill (27B time to first token)"
  timeout 70 $Q bench --model qwen3.8-27b --prefill 1024,8192 --batch 1 --pt 16,64,80 \
    --json "$OUT/prefill-27b-b1.json" 2>&1 | tail -12
  timeout 60 $Q bench --model qwen3.8-27b --prefill 1024 --batch 16 --pt 16,64,80 \
    --json "$OUT/prefill-27b-b16.json" 2>&1 | tail -12
  for t in 8192 32768; do   # Performance II item 4: the step at long context
    echo "==== bench --batch 1,16 --ctx $t"
    timeout 60 $Q bench --batch 1,16 --ctx $t --reps 20 --json "$OUT/bench-ctx$t.json" 2>&1 | head -14
  done
  echo "==== bench --serve realistic --requests 32 --batch 16 --pt 64 (27B)"
  timeout 120 $Q bench --model qwen3.8-27b --serve realistic --requests 32 --batch 16 --pt 64 \
    --json "$OUT/serve-27b-realistic.json" --plot "$OUT/serve-27b-realistic.png" 2>&1 | tail -8
} 2>&1 | tee "$OUT/v26.log"
