#!/usr/bin/env bash
# On the GPU machine, from the repo root (or from a patched tree under .ab/ with
# WHEELS=../../.gpu): install PyCUDA from the wheels in .gpu/ (copied from WHEELS_FROM by
# `make device-prep`), run the GPU tests (TESTS=1; JOBS=16 runs one pytest per test, 16 at a
# time), regenerate the golden runs (GOLDEN=1), gate one program with its cubin loaded, run
# `qwen38gen check` at several B, run compute-sanitizer memcheck and racecheck on one prefill
# chunk + one decode step, A/B whole steps of prepared variants (AB=SPEC, from
# `python3 scripts/ab_step.py prep SPEC` on the CPU machine; carry .ab and .cache/ab), and print
# a summary table last. Logs go to $OUT/device.log; a regenerated golden file is copied to $OUT.
#
# VERIFY=tests|rest|all (everything on the device in two calls of under ten minutes;
# `make device-prep` first on the CPU machine, carry [".gpu", ".cache"]):
#   tests: the GPU tests (JOBS=16), check at B in CHECK_B (1 3 16 64) and check --mtp 1 at B in
#          MTP_CHECK_B (1 16, own and forced drafts);
#   rest:  the continuous-batching and sampling lock (run --backend gpu on a requests file at
#          --batch 3 against --batch 1), the speculative serve lock (check --serve --mtp 1 --batch 3,
#          SPEC_LOCK=0 skips it), check --reference qwen3.5-0.8b (synthetic int4 weights
#          against the numpy reference), bench --batch 1,16,64 --peers (json, png and text under
#          $OUT), compute-sanitizer memcheck and racecheck on one prefill chunk, one decode step
#          and one continuous-batching refill at B = 3 (scripts/one_step.py 3 refill);
#   all:   both, one log.
# The log, $OUT/verify-$VERIFY.log, starts with `commit <hash>` (.gpu/COMMIT from device-prep)
# and whether the tree matched it, and ends with a summary table; the exit code is 1 if a step
# failed. Each step is cut at the part's time budget (VERIFY_BUDGET, 570 s) so that the log and
# its table come back. `make device-commit OUT=...` files them under bench/ on the CPU machine.
# Hooks for the stubbed plumbing test (tests/test_device_script.py): PY (python3), Q (the CLI),
# SANITIZER (compute-sanitizer).
set -uo pipefail
OUT=${OUT:-/tmp/qwen38-out}
mkdir -p "$OUT"
LOG="$OUT/device.log"
PY=${PY:-python3}
SANITIZER=${SANITIZER:-compute-sanitizer}
$PY -m pip install -q --no-index --no-deps --target /tmp/site "${WHEELS:-.gpu}"/*.whl || exit 3
# bench --peers' Triton peers (make device-prep's .gpu/peers), last on the path: they must not
# shadow what the machine's torch brings
if ls "${WHEELS:-.gpu}"/peers/*.whl >/dev/null 2>&1; then
  $PY -m pip install -q --no-index --no-deps --target /tmp/site-peers "${WHEELS:-.gpu}"/peers/*.whl \
    || echo "note: the peer wheels did not install; bench --peers will say so for them"
fi
export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}:/tmp/site-peers
# VERIFY loads the programs `make device-prep` compiled into the carried .cache (no nvcc here).
[ -n "${VERIFY:-}" ] && QWEN38_CACHE=${QWEN38_CACHE:-$PWD/.cache/q38}
export PYTHONUNBUFFERED=1 QWEN38_CACHE=${QWEN38_CACHE:-/tmp/q38cache} OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
Q=${Q:-$PY -m cli}
declare -a SUMMARY
note() { SUMMARY+=("$(printf '%-44s %s' "$1" "$2")"); }
section() { echo; echo "==== $* ===="; }
# The GPU tests; sets rc and TESTS_LINE (what the summary says of them).
gpu_tests() {
  if [ "${JOBS:-1}" -gt 1 ]; then
    # One pytest per test id, JOBS at a time: each test builds its kernels with nvcc, so on the
    # 16 cores the 30 wgmma/gemm GEMV tests take 2.5 min this way against ~20 in one process.
    $PY -m pytest -q --collect-only -p no:cacheprovider ${PYTEST_FILES:-tests/gpu} \
      ${PYTEST_K:+-k "$PYTEST_K"} 2>/dev/null | grep '::' > /tmp/ids.txt
    rm -rf /tmp/pt && mkdir -p /tmp/pt
    nl -nln /tmp/ids.txt | PY=$PY xargs -P "$JOBS" -L 1 sh -c \
      '$PY -m pytest -q -s -p no:cacheprovider "$1" > /tmp/pt/$0.log 2>&1; echo "rc=$?" >> /tmp/pt/$0.log'
    n=$(wc -l < /tmp/ids.txt); bad=$(grep -L '^rc=0$' /tmp/pt/*.log 2>/dev/null | wc -l)
    cat /tmp/pt/*.log > /tmp/t.log 2>/dev/null; grep -h -E '^(FAILED|ERROR)' /tmp/t.log
    # what tests report for the record (the HF end-to-end check's figures)
    grep -h -E '^(HF end to end|negative control)' /tmp/t.log
    skipped=$(grep -l -E '[0-9]+ skipped' /tmp/pt/*.log 2>/dev/null | wc -l)
    rc=$([ "$n" -gt 0 ] && [ "$bad" = 0 ] && echo 0 || echo 1)
    TESTS_LINE="$((n - bad)) of $n test ids passed or skipped ($skipped skipped)"
  else
    $PY -m pytest -q -s -p no:cacheprovider ${PYTEST_FILES:-tests/gpu} ${PYTEST_K:+-k "$PYTEST_K"} > /tmp/t.log 2>&1
    rc=$?; cat /tmp/t.log
    TESTS_LINE=$(tail -1 /tmp/t.log)
  fi
}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader

if [ -n "${VERIFY:-}" ]; then
  . "$(dirname "$0")/device_verify.sh"
  exit $?
fi

{
if [ "${TESTS:-1}" = 1 ]; then
  section "pytest tests/gpu"
  gpu_tests
  note "pytest tests/gpu$([ "${JOBS:-1}" -gt 1 ] && echo " (JOBS=$JOBS)")" "rc=$rc: $TESTS_LINE"
fi

if [ "${GOLDEN:-0}" = 1 ]; then
  section "golden --update"
  $Q golden --update --candidate "$OUT/golden-candidate.json"; rc=$?
  cp golden/*.json "$OUT/" 2>/dev/null
  note "golden --update" "rc=$rc"
fi

if [ -n "${SWEEP:-}" ]; then
  section "gemv sweep ($SWEEP)"
  python3 scripts/gemv_sweep.py run "$SWEEP" "$OUT/sweep.json" > /tmp/sw.log 2>&1; rc=$?
  cat /tmp/sw.log; cp /tmp/sw.log "$OUT/sweep.txt"
  note "gemv sweep" "rc=$rc"
fi

if [ -n "${ATTN_SWEEP:-}" ]; then  # cubin from `python3 scripts/attn_sweep.py build` (CPU machine)
  section "attn sweep ($ATTN_SWEEP)"
  python3 scripts/attn_sweep.py run "$ATTN_SWEEP" "$OUT/attn_sweep.json" > /tmp/asw.log 2>&1; rc=$?
  cat /tmp/asw.log; cp /tmp/asw.log "$OUT/attn_sweep.txt"
  note "attn sweep" "rc=$rc"
fi

if [ -n "${PROFILE:-}" ]; then
  section "ncu gemv ($PROFILE)"
  ncu --section SpeedOfLight --section ComputeWorkloadAnalysis --section Occupancy \
    --section WarpStateStats --section SchedulerStats \
    --metrics sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_tensor_op_hmma.avg.pct_of_peak_sustained_active,smsp__average_warp_latency_issue_stalled_math_pipe_throttle.ratio \
    python3 scripts/gemv_sweep.py profile "$PROFILE" > "$OUT/ncu.txt" 2>&1; rc=$?
  tail -n 400 "$OUT/ncu.txt"
  # the instruction mix of the profiled functions (cuobjdump ships with the toolkit beside ncu)
  for f in ${SASS_FUN:-}; do cuobjdump -sass -fun "$f" "$PROFILE" > "$OUT/$f.sass" 2>&1; done
  note "ncu gemv" "rc=$rc"
fi

if [ -n "${AB:-}" ]; then
  section "A/B step ($AB, B=${AB_B:-64}, ${AB_ROUNDS:-2} rounds)"
  python3 scripts/ab_step.py run "$AB" --batch "${AB_B:-64}" --rounds "${AB_ROUNDS:-2}" \
    --json "$OUT/ab.json" > "$OUT/ab.txt" 2>&1; rc=$?
  cat "$OUT/ab.txt"
  note "A/B step $AB" "rc=$rc"
  while IFS= read -r l; do SUMMARY+=("  $l"); done < <(grep -A 99 '^  B variant' "$OUT/ab.txt")
fi

if [ "${BASIC:-1}" = 1 ]; then  # BASIC=0: skip the gate and run smoke checks (A/B, locks only)
  section "gate"
  $Q emit --batch 16 -o /tmp/q38/tiny-b16.cu && $Q gate -q /tmp/q38/tiny-b16.cu
  note "gate tiny b16 (cubin loaded)" "rc=$?"

  section "run"
  printf '%s\n' '{"prompt_ids": [1, 2, 3], "max_tokens": 8}' '{"prompt_ids": [7], "max_tokens": 8}' \
    '{"prompt_ids": [5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21], "max_tokens": 8}' \
    > /tmp/prompts.jsonl
  $Q run --prompts /tmp/prompts.jsonl --batch 2 --json "$OUT/run.json"
  note "run --batch 2 (3 requests, 2 slots)" "rc=$?"

fi

for B in ${CHECK_B-1 2 3 16 17 64}; do
  section "check --batch $B"
  $Q check --batch "$B" > /tmp/c.log 2>&1; rc=$?; cat /tmp/c.log
  note "check --batch $B" "rc=$rc: $(grep -E 'PASS|FAIL|error' /tmp/c.log | tail -1)"
done

# The mtp lane's lock: speculative streams equal the golden greedy streams (own + forced drafts).
for B in ${MTP_CHECK_B-1 16}; do
  section "check --mtp ${MTP_K:-1} --batch $B"
  $Q check --mtp "${MTP_K:-1}" --batch "$B" > /tmp/c.log 2>&1; rc=$?; cat /tmp/c.log
  note "check --mtp ${MTP_K:-1} --batch $B" "rc=$rc: $(grep -E 'PASS|FAIL|error' /tmp/c.log | tail -1)"
done

if [ "${BENCH:-0}" = 1 ]; then
  section "bench"
  $Q bench --model qwen3.8-27b --batch "${BENCH_B:-1,2,4,8,16,32,64}" --ctx 1024 \
    --json "$OUT/bench.json" --plot "$OUT/bench.png" ${PEERS:+--peers}
  note "bench 27B" "rc=$?"
  if [ -n "${NOPDL_B:-}" ]; then  # the same step without programmatic dependent launch (A/B)
    QWEN38_PDL=0 $Q bench --model qwen3.8-27b --batch "$NOPDL_B" --ctx 1024 --json "$OUT/bench-nopdl.json"
    note "bench 27B, QWEN38_PDL=0" "rc=$?"
  fi
  if [ -n "${BENCH_MTP_B-1,16,64}" ]; then
    $Q bench --model qwen3.8-27b --mtp "${MTP_K:-1}" --batch "${BENCH_MTP_B-1,16,64}" --ctx 1024 \
      --json "$OUT/bench-mtp.json"
    note "bench --mtp ${MTP_K:-1} 27B" "rc=$?"
  fi
fi

if [ "${SANITIZE:-1}" = 1 ]; then
  # B = 3: gemv_q4 (btg 8); B = 64: wgmma_q4 too (btg 64), split over blocks on tiny's down and out
  for B in ${SAN_B:-3 64}; do
    for tool in memcheck racecheck; do
      section "compute-sanitizer $tool, B=$B"
      compute-sanitizer --tool $tool --error-exitcode 9 python3 scripts/one_step.py "$B" > /tmp/s.log 2>&1
      rc=$?; tail -5 /tmp/s.log
      note "compute-sanitizer $tool B=$B (prefill+decode)" "rc=$rc: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' /tmp/s.log | tail -1)"
    done
  done
fi
} > "$LOG" 2>&1

echo; echo "==== summary ===="
printf '%s\n' "${SUMMARY[@]}" | tee -a "$LOG"
