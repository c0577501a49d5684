#!/usr/bin/env bash
# This session's measurements (docs/PERFORMANCE.md, "Prepared for the next device session"), in
# two calls of under ten minutes each, after `VERIFY=all` on the same tree. CPU machine first
# (clean tree):
#   make device-prep
#   QWEN38_CACHE=.cache/q38 python scripts/precompile.py tiny:7:pt16 tiny:16:pt16 tiny:64:pt16 \
#     qwen3.8-27b:1:pt16 qwen3.8-27b:1:pt64 qwen3.8-27b:1:pt80 qwen3.8-27b:16:pt16 \
#     qwen3.8-27b:16:pt64 qwen3.8-27b:16:pt80
#   python scripts/stream_bench.py build .cache/stream.cubin
# then on the device, carry [".gpu", ".cache"]:
#   PART=serve bash bench/ab/v27-device.sh   (Serving II: tiny serving with the step's phases,
#                                             cold start from a 27B folder, 27B serving)
#   PART=perf  bash bench/ab/v27-device.sh   (Performance II: stream stand-ins, TTFT, long context)
# Logs in $OUT (v27-PART.log and the json/png).
set -uo pipefail
OUT=${OUT:-/tmp/v27}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpu/*.whl 2>/dev/null || exit 3
export PYTHONUNBUFFERED=1 OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 COLUMNS=200
export PYTHONPATH=/tmp/site:$PWD QWEN38_CACHE=$PWD/.cache/q38
Q="python3 -m cli"
PART=${PART:-serve}
{
  echo "commit $(cat .gpu/COMMIT)"; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  if [ "$PART" = serve ]; then
    for w in short long; do   # Serving II item 1: after the host trim, and where a step goes
      echo "==== bench --serve $w (tiny, B = 7, 16, 64)"
      timeout 90 $Q bench --model tiny --serve $w --batch 7,16,64 --json "$OUT/serve-tiny-$w.json" \
        2>&1 | grep -v '^\s*$' | tail -24
    done
    echo "==== cold start from a 27B quantized folder (Serving II item 3)"
    df -h /tmp | tail -1
    timeout 150 python3 scripts/synthetic_quantized.py write /tmp/q27 --model qwen3.8-27b 2>&1 | tail -2
    python3 -c "import json; print(json.dumps({'id': 'p4096', 'prompt_ids': [(7 * i) % 151000 for i in range(4096)], 'max_tokens': 8}))" > /tmp/p4096.jsonl
    for pass in cold warm; do
      echo "== $pass page cache: run --model /tmp/q27 --batch 1 --pt 64, one 4 096-token prompt"
      timeout 90 $Q run --model /tmp/q27 --batch 1 --pt 64 --prompts /tmp/p4096.jsonl \
        --output /tmp/run-q27.jsonl --json "$OUT/run-q27-$pass.json" 2>&1 | tail -2
    done
    rm -rf /tmp/q27
    echo "==== cold start, synthetic weights made on the GPU"
    timeout 60 $Q run --model qwen3.8-27b --batch 1 --pt 64 --prompts /tmp/p4096.jsonl \
      --output /tmp/run-27b.jsonl --json "$OUT/run-27b-device-fill.json" 2>&1 | tail -2
    echo "==== bench --serve realistic --requests 32 --batch 16 --pt 64 (27B)"
    timeout 200 $Q bench --model qwen3.8-27b --serve realistic --requests 32 --batch 16 --pt 64 \
      --json "$OUT/serve-27b-realistic.json" --plot "$OUT/serve-27b-realistic.png" 2>&1 | tail -8
  elif [ "$PART" = short ]; then   # what PART=sample decides first, in under four minutes
    echo "==== sample_ab: the sampler's SPLIT 1 sums (32-bit atomics + carry, new) against SPLIT 0 (64-bit, old)"
    timeout 50 python3 scripts/sample_ab.py run .cache/sample_ab.cubin 2>&1 | tail -12
    for t in "" "--tune multi_tile=32"; do
      echo "==== bench --prefill 1024 --batch 1,16 --pt 64 ${t:-(table tile)}"
      timeout 60 $Q bench --model qwen3.8-27b --prefill 1024 --batch 1,16 --pt 64 $t \
        --json "$OUT/prefill-27b${t:+-mt32}.json" 2>&1 | grep -E '^prefill:'
    done
  elif [ "$PART" = sample ]; then   # after PART=short: the rest of what the lane choices decide
    for t in "" "--tune sample_split=1"; do
      echo "==== bench --serve realistic --requests 32 --batch 16 --pt 64 (27B) ${t:-(table)}"
      timeout 100 $Q bench --model qwen3.8-27b --serve realistic --requests 32 --batch 16 --pt 64 $t \
        --json "$OUT/serve-27b-realistic${t:+-split}.json" 2>&1 | grep -E '^serve|GPU' | tail -4
    done
    echo "==== bench --model tiny --batch 7,64 --trace (where the tiny B = 64 step's fixed cost goes)"
    timeout 40 $Q bench --model tiny --batch 7,64 --trace --json "$OUT/bench-tiny-trace.json" 2>&1 | tail -60
    for t in "" "--tune wgmma_sk=off"; do
      echo "==== bench --serve short --batch 64 (tiny) ${t:-(the table)}"
      timeout 30 $Q bench --model tiny --serve short --batch 64 $t 2>&1 | grep -E '^serve|GPU'
    done
  else
    echo "==== stream_bench (the persistent design's step 0: wsp r24 is one block per SM)"
    timeout 100 python3 scripts/stream_bench.py run .cache/stream.cubin 2>&1 | tail -30
    echo "==== bench --prefill (27B time to first token)"
    timeout 110 $Q bench --model qwen3.8-27b --prefill 1024,8192 --batch 1 --pt 16,64,80 \
      --json "$OUT/prefill-27b-b1.json" 2>&1 | tail -12
    timeout 90 $Q bench --model qwen3.8-27b --prefill 1024 --batch 16 --pt 16,64,80 \
      --json "$OUT/prefill-27b-b16.json" 2>&1 | tail -12
    for t in 8192 32768; do   # Performance II item 4: the step at long context
      echo "==== bench --batch 1,16 --ctx $t"
      timeout 80 $Q bench --batch 1,16 --ctx $t --reps 20 --json "$OUT/bench-ctx$t.json" 2>&1 | head -14
    done
  fi
} 2>&1 | tee "$OUT/v27-$PART.log"
# PART=short, then PART=sample (after VERIFY=tests PYTEST_FILES="tests/gpu/test_sampling.py
# tests/gpu/test_engine.py tests/gpu/test_serve_lock.py" in the same call): the sampler's SPLIT 1
# sums (Tuning.sample_split) against SPLIT 0, and Tuning.multi_tile (prefill chunks' GEMVs in
# 32-row tiles) against the table's tile. CPU first, besides the header's:
#   python scripts/sample_ab.py build .cache/sample_ab.cubin
#   QWEN38_CACHE=.cache/q38 python scripts/precompile.py --tune multi_tile=32 tiny:3:pt8 \
#     qwen3.8-27b:1:pt64 qwen3.8-27b:16:pt64
#   QWEN38_CACHE=.cache/q38 python scripts/precompile.py tiny:7:t tiny:64:t tiny:7 tiny:64
#   QWEN38_CACHE=.cache/q38 python scripts/precompile.py --tune wgmma_sk=off tiny:64:pt16
#   QWEN38_CACHE=.cache/q38 python scripts/precompile.py --tune sample_split=1 qwen3.8-27b:16:pt64
