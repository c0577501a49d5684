#!/usr/bin/env bash
# Version 25, second device call (carry .gpu and .cache/q38): the engine's GPU tests after the host
# side was trimmed (sampling parameters uploaded once before the sample phase that needs them, a
# slot's state zeroed by one 2D memset per buffer) and bench --prefill's pass fixed for prompts
# ending in different chunks; memcheck of one_step.py 3 refill; bench --serve short and long on
# tiny at B = 7, 16, 64 (decoders riding, packed chunks); the 27B's time to first token at pt 16,
# 64 and 80 (B = 1: 1 024 and 8 192 tokens; B = 16: 1 024).
set -uo pipefail
OUT=${OUT:-/tmp/v25b}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpu/*.whl 2>/dev/null || exit 3
export PYTHONUNBUFFERED=1 OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 COLUMNS=200
export PYTHONPATH=/tmp/site:$PWD QWEN38_CACHE=$PWD/.cache/q38
{
  echo "commit $(cat .gpu/COMMIT)"; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  echo "==== pytest tests/gpu/test_engine.py tests/gpu/test_serve_lock.py"
  timeout 120 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_engine.py tests/gpu/test_serve_lock.py 2>&1 | tail -8
  echo "==== compute-sanitizer memcheck scripts/one_step.py 3 refill"
  timeout 60 compute-sanitizer --tool memcheck python3 scripts/one_step.py 3 refill 2>&1 | tail -3
  for w in short long; do
    echo "==== bench --serve $w (tiny, B = 7, 16, 64)"
    timeout 60 python3 -m cli bench --model tiny --serve $w --batch 7,16,64 --json "$OUT/serve-after2-$w.json" 2>&1 | grep -v "^WARNING"
  done
  echo "==== bench --prefill (27B)"
  timeout 60 python3 -m cli bench --model qwen3.8-27b --prefill 1024,8192 --batch 1 --pt 16,64,80 \
    --json "$OUT/prefill-27b-b1.json" 2>&1 | tail -12
  timeout 50 python3 -m cli bench --model qwen3.8-27b --prefill 1024 --batch 16 --pt 16,64,80 \
    --json "$OUT/prefill-27b-b16.json" 2>&1 | tail -12
} 2>&1 | tee "$OUT/v25b.log"
