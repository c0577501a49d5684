#!/usr/bin/env bash
# Version 25 on the GPU machine (carry .gpu and .cache/q38): the engine test (a row's bits in a
# chunk and in a decode step; the lock with decoders riding in chunks), then bench --serve on the
# tiny preset, both workloads, B = 7, 16, 64, decoders waiting (before) and riding (after).
set -uo pipefail
OUT=${OUT:-/tmp/v25}; mkdir -p "$OUT"; LOG=$OUT/v25.log
python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpu/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 QWEN38_CACHE=$PWD/.cache/q38
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 COLUMNS=200
{
  echo "commit $(cat .gpu/COMMIT)"; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  echo "==== pytest tests/gpu/test_engine.py"
  python3 -m pytest -q -p no:cacheprovider tests/gpu/test_engine.py 2>&1 | tail -5
  for w in ${WORKLOADS:-short long}; do
    echo "==== bench --serve $w"
    python3 -m cli bench --model tiny --serve "$w" --batch ${BATCHES:-7,16,64} --schedule ${SCHED:-both} \
      --json "$OUT/serve-$w.json" 2>&1
  done
} 2>&1 | tee "$LOG"
