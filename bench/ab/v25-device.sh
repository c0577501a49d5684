#!/usr/bin/env bash
# Version 25 on the GPU machine (carry .gpu, .cache/q38 and .ab/ride with its .cache):
#   before: .ab/ride (dcb4b1f, chunks of B*pt rows) bench --serve, decoders waiting (the engine of
#           version 24) and riding;
#   after:  main (packed chunks): the engine and serve-lock GPU tests, check --batch 3, memcheck of
#           one_step.py 3 refill, bench --serve with decoders riding in packed chunks.
# PART=27b: the 27B's cold start (run, one 4 096-token prompt), time to first token
#           (bench --prefill) and bench --serve realistic.
# Tiny preset, workloads short and long, B = 7, 16, 64, pt 16.
set -uo pipefail
OUT=${OUT:-/tmp/v25}; mkdir -p "$OUT"; LOG=$OUT/v25.log
python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpu/*.whl || exit 3
export PYTHONUNBUFFERED=1 OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 COLUMNS=200
ROOT=$PWD
serve() {  # DIR SCHEDULE TAG WORKLOAD
  echo "==== [$3] bench --serve $4 --schedule $2"
  (cd "$1" && PYTHONPATH=/tmp/site:$PWD QWEN38_CACHE=$PWD/.cache/q38 timeout 200 python3 -m cli \
    bench --model tiny --serve "$4" --batch 7,16,64 --schedule "$2" --json "$OUT/serve-$3-$4.json" 2>&1)
}
if [ "${PART:-tiny}" = 27b ]; then   # the 27B (PART=27b, a call of its own): serving, prefill, cold start
  export PYTHONPATH=/tmp/site:$ROOT QWEN38_CACHE=$ROOT/.cache/q38
  { echo "commit $(cat .gpu/COMMIT)"; nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
    echo "==== run --model qwen3.8-27b --batch 1 --pt 64: one 4 096-token prompt (cold start)"
    python3 -c "import json; print(json.dumps({'id': 'p4096', 'prompt_ids': [(7 * i) % 151000 for i in range(4096)], 'max_tokens': 8}))" > /tmp/p4096.jsonl
    timeout 150 python3 -m cli run --model qwen3.8-27b --batch 1 --pt 64 --prompts /tmp/p4096.jsonl \
      --output "$OUT/run-27b-4096.jsonl" --json "$OUT/run-27b-4096.json" 2>&1 | tail -3
    echo "==== bench --prefill 1024,8192 --batch 1,16 --pt 16,64,128"
    timeout ${PREFILL_S:-200} python3 -m cli bench --model qwen3.8-27b --prefill 1024,8192 --batch 1,16 \
      --pt 16,64,128 --json "$OUT/prefill-27b.json" 2>&1
    echo "==== bench --serve realistic --requests ${N27:-64} --batch 16,64"
    timeout ${SERVE_S:-220} python3 -m cli bench --model qwen3.8-27b --serve realistic --requests ${N27:-64} \
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
  for w in short long; do   # before and after side by side, workload by workload
    serve "$ROOT" ride after $w
    serve "$ROOT/.ab/ride" wait before $w
  done
  echo "==== compute-sanitizer memcheck scripts/one_step.py 3 refill"
  timeout 240 compute-sanitizer --tool memcheck python3 scripts/one_step.py 3 refill 2>&1 | tail -4
} 2>&1 | tee "$LOG"
