#!/usr/bin/env bash
# Version 25 on the GPU machine (carry .gpu, .cache/q38 and .ab/ride with its .cache):
#   before: .ab/ride (dcb4b1f, chunks of B*pt rows) bench --serve, decoders waiting (the engine of
#           version 24) and riding;
#   after:  main (packed chunks): the engine and serve-lock GPU tests, check --batch 3, memcheck of
#           one_step.py 3 refill, bench --serve with decoders riding in packed chunks.
# Tiny preset, workloads short and long, B = 7, 16, 64, pt 16.
set -uo pipefail
OUT=${OUT:-/tmp/v25}; mkdir -p "$OUT"; LOG=$OUT/v25.log
python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpu/*.whl || exit 3
export PYTHONUNBUFFERED=1 OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 COLUMNS=200
ROOT=$PWD
serve() {  # DIR SCHEDULE TAG
  for w in short long; do
    echo "==== [$3] bench --serve $w --schedule $2"
    (cd "$1" && PYTHONPATH=/tmp/site:$PWD QWEN38_CACHE=$PWD/.cache/q38 timeout 200 python3 -m cli \
      bench --model tiny --serve "$w" --batch 7,16,64 --schedule "$2" --json "$OUT/serve-$3-$w.json" 2>&1)
  done
}
if [ "${PART:-tiny}" = 27b ]; then   # the 27B through bench --serve (PART=27b, a call of its own)
  export PYTHONPATH=/tmp/site:$ROOT QWEN38_CACHE=$ROOT/.cache/q38
  { echo "commit $(cat .gpu/COMMIT)"; nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
    timeout 500 python3 -m cli bench --model qwen3.8-27b --serve realistic --requests ${N27:-64} \
      --batch 16,64 --json "$OUT/serve-27b-realistic.json" 2>&1; } | tee "$OUT/v25-27b.log"
  exit 0
fi
{
  echo "commit $(cat .gpu/COMMIT)"; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  export PYTHONPATH=/tmp/site:$ROOT QWEN38_CACHE=$ROOT/.cache/q38
  if [ "${SKIP_TESTS:-0}" = 0 ]; then
  echo "==== pytest tests/gpu/test_engine.py tests/gpu/test_serve_lock.py"
  timeout 240 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_engine.py tests/gpu/test_serve_lock.py 2>&1 | tail -6
  for b in 1 3 64; do
    echo "==== check --model tiny --batch $b"
    timeout 120 python3 -m cli check --model tiny --batch $b 2>&1 | tail -4
  done
  fi
  serve "$ROOT" ride after
  serve "$ROOT/.ab/ride" wait before
  echo "==== compute-sanitizer memcheck scripts/one_step.py 3 refill"
  timeout 240 compute-sanitizer --tool memcheck python3 scripts/one_step.py 3 refill 2>&1 | tail -4
} 2>&1 | tee "$LOG"
