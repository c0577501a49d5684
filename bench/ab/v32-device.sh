#!/usr/bin/env bash
# Version 32's device runs (docs/PERFORMANCE.md, "Prepared for the next device session" of
# version 31), on whichever card comes. CPU machine first (clean tree):
#   make device-prep
#   QWEN38_CACHE=.cache/q38 python scripts/precompile.py qwen3.8-27b:1:1:pt2 qwen3.8-27b:16:1:pt2 \
#     qwen3.8-27b:1:pt1 qwen3.8-27b:16:pt1 qwen3.8-27b:12:1:pt2 qwen3.8-27b:12:1:pt2:verify_btg=0 \
#     qwen3.8-27b:12:pt1 qwen3.8-27b:16:2:pt3 qwen3.8-27b:16:2:pt3:verify_btg=0
#   python scripts/stream_bench.py build .cache/stream.cubin
# then on the device, carry [".gpu", ".cache"]:
#   PARTS="table mtp stream" bash bench/ab/v32-device.sh   (~520 s)
#     table:  bench --batch 1,16,64 --peers (the table: json, png, text)
#     mtp:    bench --mtp 1 --batch 1,16 (the speculative step at the defaults)
#     stream: scripts/stream_bench.py's stand-ins (PERSISTENT.md step 0)
#   PART=vbtg (~200 s): verify_btg beyond B = 16 mtp 1: bench --mtp 1 --batch 12 and
#     --mtp 2 --batch 16, each at the defaults and with --tune verify_btg=0
#   PART=attn (~200 s): attn_tc's third ring stage at long context, where one block per SM
#     streams a kv head's split (B = 1, T = 32 768: 2.07 TB/s on the H100 in version 29):
#     bench --batch 1,16 --ctx 32768 --reps 20 at the defaults and with --tune attn_st=3
#     (precompile qwen3.8-27b:1:attn_st=3 qwen3.8-27b:16:attn_st=3)
#   PART=ws (~200 s; needs the tree of b450597, whose Tuning.gemv_ws left the product when refuted):
#     gemv_ws (Tuning.gemv_ws: gemv_cv's structure with gemv_q4's arithmetic on
#     the 8- and 16-row launches) in the program: its GPU test (the tiny program's tokens and
#     top-k logits bitwise the default's at B = 1, 3, 16), `check --batch 16` with it, and the
#     step: bench --batch 1,16 at the defaults and with --tune gemv_ws=1 (precompile
#     tiny:1:pt8 tiny:16:pt8 and each with :gemv_ws=1, tiny:3:pt8:gemv_ws=1, tiny:16:gemv_ws=1,
#     qwen3.8-27b:1:gemv_ws=1 qwen3.8-27b:16:gemv_ws=1)
#   PART=cv (~300 s): gemv_cv's GPU test (the LB loader's schedules with it; CV_TEST=0 skips it),
#     the cv sweep twice (CV_RUNS; one config's spread between runs is ~7 %) and ncu of gemv_cv
#     beside gemv_q4 at 1 row.
#     CPU machine first: GEMV_SWEEP=cv python3 scripts/gemv_sweep.py build .cache/cv.cubin, and the
#     GPU test's unit into .cache/q38 (QWEN38_CACHE=.cache/q38 python -c "from
#     tests.gpu.test_gemv_cv import source; from qwen38gen.gate import compile_kernels;
#     compile_kernels(source(), 'gemv_cv_test.cu', arch='sm_90a')")
# $OUT gets at most 8 files back: each part writes one log (v32-PART.log) and table its json,
# png and text.
set -uo pipefail
OUT=${OUT:-/tmp/v32}; mkdir -p "$OUT"
if [ -n "${PARTS:-}" ]; then
  for p in $PARTS; do PART=$p PARTS= bash "$0"; done
  exit 0
fi
python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpu/*.whl 2>/dev/null || exit 3
if ls .gpu/peers/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/site-peers .gpu/peers/*.whl 2>/dev/null \
    || echo "note: the peer wheels did not install"
fi
export PYTHONUNBUFFERED=1 OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 COLUMNS=200
export PYTHONPATH=/tmp/site:$PWD:/tmp/site-peers QWEN38_CACHE=$PWD/.cache/q38
Q="python3 -m cli"
PART=${PART:-table}
{
  echo "commit $(cat .gpu/COMMIT)"; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  if [ "$PART" = table ]; then
    echo "==== bench --batch 1,16,64 --peers (T = 1024)"
    timeout 280 $Q bench --model qwen3.8-27b --batch 1,16,64 --ctx 1024 --peers \
      --json "$OUT/bench.json" --plot "$OUT/bench.png" 2>&1 | grep -v '^\s*$' | tee "$OUT/bench.txt"
  elif [ "$PART" = mtp ]; then
    echo "==== bench --mtp 1 --batch 1,16"
    timeout 150 $Q bench --model qwen3.8-27b --mtp 1 --batch 1,16 --json "$OUT/mtp1.json" 2>&1 \
      | grep -v '^\s*$' | tail -30
  elif [ "$PART" = stream ]; then
    echo "==== stream_bench (the persistent design's step 0: wsp r24 is one block per SM)"
    timeout 100 python3 scripts/stream_bench.py run .cache/stream.cubin 2>&1 | tail -30
  elif [ "$PART" = vbtg ]; then
    for a in "1 12" "2 16"; do
      set -- $a
      for t in "" "--tune verify_btg=0"; do
        echo "==== bench --mtp $1 --batch $2 ${t:-(the table: verify at the 32-row tile)}"
        timeout 90 $Q bench --model qwen3.8-27b --mtp "$1" --batch "$2" $t 2>&1 | grep -v '^\s*$' | tail -14
      done
    done
  elif [ "$PART" = attn ]; then
    for t in "" "--tune attn_st=3"; do
      echo "==== bench --batch 1,16 --ctx 32768 ${t:-(the table: attn_st 2)}"
      timeout 100 $Q bench --batch 1,16 --ctx 32768 --reps 20 $t 2>&1 | grep -v '^\s*$' | head -16
    done
  elif [ "$PART" = ws ]; then
    echo "==== pytest tests/gpu/test_gemv_ws_program.py"
    timeout 120 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_gemv_ws_program.py 2>&1 | tail -4
    echo "==== check --batch 16 --tune gemv_ws=1"
    timeout 60 $Q check --batch 16 --tune gemv_ws=1 2>&1 | tail -2
    for t in "" "--tune gemv_ws=1"; do
      echo "==== bench --batch 1,16 ${t:-(the table: gemv_q4)}"
      timeout 100 $Q bench --batch 1,16 $t 2>&1 | grep -v '^\s*$' | head -16
    done
  elif [ "$PART" = cv ]; then
    if [ "${CV_TEST:-1}" = 1 ]; then
      echo "==== pytest tests/gpu/test_gemv_cv.py"
      timeout 200 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_gemv_cv.py 2>&1 | tail -6
    fi
    for i in $(seq "${CV_RUNS:-2}"); do
      echo "==== GEMV_SWEEP=cv run $i"
      GEMV_SWEEP=cv timeout 100 python3 scripts/gemv_sweep.py run .cache/cv.cubin /tmp/cv-$i.json 2>&1 | tail -80
    done
    echo "==== ncu: gemv_cv (LB, LB + AR) beside gemv_q4 at 1 row, lm_head and gate_up"
    GEMV_SWEEP=cv GEMV_PROFILE="lm_head:1:c,4,1,0,0,0;lm_head:1:c,4,1,0,0,0,1,1;lm_head:1:c,4,1,0,0,0,1,1,1;lm_head:1:b,1,2,0,0;gate_up:1:c,4,1,0,2,0,1,1;gate_up:1:c,4,1,0,2,0,1,1,1;gate_up:1:b,1,2,0,0" \
      timeout 150 ncu --section SpeedOfLight --section Occupancy --section WarpStateStats --section SchedulerStats \
      --section MemoryWorkloadAnalysis python3 scripts/gemv_sweep.py profile .cache/cv.cubin > /tmp/ncu.txt 2>&1
    grep -E "sw_k|Duration|Memory Throughput|DRAM Throughput|Achieved Occupancy|Theoretical Occupancy|Issued Ipc|No Eligible|Stall|Registers|Block Limit|Warp Cycles Per Issued|One or More Eligible" /tmp/ncu.txt | head -200
  fi
} 2>&1 | tee "$OUT/v32-$PART.log"
