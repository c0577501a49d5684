# Sourced by scripts/device.sh when VERIFY is set (its header says what each part runs). Uses
# device.sh's PY, Q, SANITIZER, OUT, section and gpu_tests. Which steps run (defaults: all):
# TESTS (1), CHECK_B ("1 3 16 64"), MTP_CHECK_B ("1 16"), RUN_LOCK (1), REF_MODEL (qwen3.5-0.8b)
# at REF_B (3), BENCH_B (1,16,64), SAN_TOOLS ("memcheck racecheck"); an empty value skips.
case "$VERIFY" in
  1 | all) PARTS="tests rest" TAG=all ;;
  tests | rest) PARTS=$VERIFY TAG=$VERIFY ;;
  *) echo "error: VERIFY=$VERIFY: give VERIFY=tests, VERIFY=rest or VERIFY=all" >&2; return 2 ;;
esac
VLOG="$OUT/verify-$TAG.log"
BUDGET=${VERIFY_BUDGET:-570}   # seconds for the whole call; a step is cut where it would pass it
T0=0   # SECONDS counts from the start of device.sh, the wheel install included
W=${TMPDIR:-/tmp}/q38verify && rm -rf "$W" && mkdir -p "$W"
declare -a ROWS
NFAIL=0
export PY Q JOBS PYTEST_FILES PYTEST_K W
export -f gpu_tests

COMMIT=$(cat .gpu/COMMIT 2>/dev/null)
echo "commit ${COMMIT:-unknown (no .gpu/COMMIT: run make device-prep on the CPU machine)}" > "$VLOG"
TREE=$(python3 scripts/tree_match.py .gpu/FILES 2>&1)
echo "$TREE" >> "$VLOG"
echo "verify $TAG: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1 | head -1);" \
  "$(date -u +%FT%TZ); budget $BUDGET s" >> "$VLOG"

row() { ROWS+=("$(printf '%-9s %-50s %-6s %5s  %s' "$@")"); }

# step GROUP NAME PATTERN CMD...: run CMD cut at the budget, its output into the log; the row
# says PASS when it exits 0 (and did not say a GPU part was NOT run), with the last output line
# matching PATTERN as its detail.
step() {
  local group=$1 name=$2 pat=$3 left rc t detail verdict
  shift 3
  left=$((BUDGET - (SECONDS - T0)))
  if [ "$left" -lt 15 ]; then
    row "$group" "$name" SKIP - "not started: the call's budget of $BUDGET s is spent"
    NFAIL=$((NFAIL + 1)); echo "---- $name: SKIP (budget)"; return
  fi
  section "$name" >> "$VLOG"
  t=$SECONDS
  timeout "$left" "$@" > "$W/step.out" 2>&1
  rc=$?
  cat "$W/step.out" >> "$VLOG"
  detail=$(grep -E -- "$pat" "$W/step.out" | tail -1 | cut -c1-150)
  verdict=PASS
  if [ "$rc" = 124 ]; then
    verdict=FAIL detail="cut at the call's budget of $BUDGET s"
  elif [ "$rc" != 0 ]; then
    verdict=FAIL detail="rc=$rc: ${detail:-$(tail -1 "$W/step.out" | cut -c1-140)}"
  elif grep -q 'NOT run' "$W/step.out"; then
    verdict=FAIL detail="the GPU part did NOT run: $(grep -m1 'NOT run' "$W/step.out" | cut -c1-120)"
  fi
  [ "$verdict" = PASS ] || NFAIL=$((NFAIL + 1))
  row "$group" "$name" "$verdict" "$((SECONDS - t))s" "$detail"
  echo "---- $name: $verdict ($((SECONDS - t)) s) $detail"
}

# The GPU tests as one step (a subshell: timeout needs a command).
tests_step() { gpu_tests > "$W/gpu_tests.out" 2>&1; cat "$W/gpu_tests.out"; echo "tests: $TESTS_LINE"; return "$rc"; }

# The continuous-batching and sampling lock through the CLI: 7 requests (greedy and sampled,
# prompts of 1 to 20 tokens, up to 7 new tokens, a stop id) through 3 slots with slot resets,
# prefill chunks and decode steps with idle slots, must give every request exactly the tokens
# it gets through the batch-1 program (same pt; logits bitwise alike whatever the batch).
run_lock() {
  cat > "$W/requests.jsonl" <<'EOF'
{"id": "g1", "prompt_ids": [17], "max_tokens": 4}
{"id": "s1", "prompt_ids": [3, 1, 4, 1, 5, 9, 2, 6, 5], "max_tokens": 6, "temperature": 0.8, "seed": 11}
{"id": "g2", "prompt_ids": [271, 828, 18], "max_tokens": 7}
{"id": "s2", "prompt_ids": [5, 10, 15, 20, 25, 30, 35, 40, 45, 50, 55, 60, 65, 70, 75, 80, 85], "max_tokens": 5, "temperature": 1.3, "top_k": 40, "seed": 12}
{"id": "s3", "prompt_ids": [999, 1, 998, 2, 997, 3, 996, 4], "max_tokens": 6, "temperature": 0.7, "top_p": 0.9, "min_p": 0.05, "seed": 13}
{"id": "g3", "prompt_ids": [11, 22, 33, 44, 55, 66, 77, 88, 99, 111, 122, 133, 144, 155, 166, 177, 188, 199, 211, 222], "max_tokens": 3}
{"id": "s4", "prompt_ids": [42, 43], "max_tokens": 7, "temperature": 2.0, "top_k": 100, "top_p": 0.95, "seed": 14, "stop_token_ids": [7]}
EOF
  local b
  for b in 3 1; do
    $Q run --backend gpu --prompts "$W/requests.jsonl" --batch "$b" --pt 8 \
      --output "$W/run-b$b.jsonl" --json "$W/run-b$b.json" || return 1
    cat "$W/run-b$b.jsonl" "$W/run-b$b.json"
  done
  if cmp -s <(sort "$W/run-b3.jsonl") <(sort "$W/run-b1.jsonl"); then
    echo "run lock: $(wc -l < "$W/run-b3.jsonl") requests, every line at --batch 3 equal to --batch 1"
  else
    diff <(sort "$W/run-b3.jsonl") <(sort "$W/run-b1.jsonl")
    echo "run lock: the outputs at --batch 3 and --batch 1 differ"; return 1
  fi
}

# bench's figures for the summary: B, step ms, tok/s, % of the floor.
bench_step() {
  $Q bench --model qwen3.8-27b --batch "$BENCH_B" --ctx 1024 --peers \
    --json "$OUT/bench.json" --plot "$OUT/bench.png" > "$OUT/bench.txt" 2>&1
  local rc=$?
  cat "$OUT/bench.txt"
  [ "$rc" = 0 ] && $PY -c 'import json, sys
d = json.load(open(sys.argv[1]))
print("bench: " + "; ".join("B=%d %.2f ms %.0f tok/s %.0f%% of floor" % (
    r["batch"], r["step_ms"], r["tok_s"], 100 / r["ratio"]) for r in d["rows"]))' "$OUT/bench.json"
  return "$rc"
}
export -f tests_step run_lock bench_step

compiled() { ls "$QWEN38_CACHE/gate" 2>/dev/null | grep -c -v '^failed-'; }
N0=$(compiled)
for part in $PARTS; do
  if [ "$part" = tests ]; then
    [ "${TESTS:-1}" = 1 ] && step tests "pytest tests/gpu (JOBS=${JOBS:=16})" '^tests: ' bash -c tests_step
    for B in ${CHECK_B-1 3 16 64}; do
      step lock "check --batch $B" 'PASS|FAIL|error' $Q check --batch "$B"
    done
    for B in ${MTP_CHECK_B-1 16}; do
      step lock "check --mtp 1 --batch $B (own + forced drafts)" 'PASS|FAIL|error' \
        $Q check --mtp 1 --batch "$B"
    done
  else
    [ "${RUN_LOCK:-1}" = 1 ] && step lock "run --backend gpu --batch 3 = --batch 1" '^run lock' \
      bash -c run_lock
    [ "${SPEC_LOCK:-1}" = 1 ] && step lock "check --serve --mtp 1 --batch 3 (run --mtp)" \
      'PASS|FAIL|error' $Q check --serve --mtp 1 --batch 3
    [ -n "${REF_MODEL-qwen3.5-0.8b}" ] && step lock "check --reference ${REF_MODEL-qwen3.5-0.8b} --batch ${REF_B:-3}" \
      'PASS|FAIL|error' $Q check --reference "${REF_MODEL-qwen3.5-0.8b}" --batch "${REF_B:-3}"
    # bench_step runs in a child bash (step's timeout needs a command): export the batch list,
    # or the child sees an empty one (the H100 run at 4d3e5cc: "--batch '' needs positive integers")
    export BENCH_B=${BENCH_B-1,16,64}
    [ -n "$BENCH_B" ] && step bench "bench 27B --batch $BENCH_B --peers" '^bench: ' \
      bash -c bench_step
    for tool in ${SAN_TOOLS-memcheck racecheck}; do
      step sanitizer "$tool B=3: prefill, decode, refill, decode" 'ERROR SUMMARY|RACECHECK SUMMARY' \
        $SANITIZER --tool "$tool" --error-exitcode 9 $PY scripts/one_step.py 3 refill
    done
  fi
done
N1=$(compiled)

{
  echo
  echo "==== summary ===="
  printf '%-9s %-50s %-6s %5s  %s\n' group step result time detail
  printf '%s\n' "${ROWS[@]}"
  row device "programs compiled here (not from .cache)" "$([ "$N1" = "$N0" ] && echo ok || echo note)" - \
    "$((N1 - N0)) (make device-prep compiles them all beforehand)"
  printf '%s\n' "${ROWS[-1]}"
  tree_ok=$([ "${TREE#tree: matches}" != "$TREE" ] && echo ok || echo FAIL)
  row device "tree = commit ${COMMIT:0:12}" "$tree_ok" - "$TREE"
  printf '%s\n' "${ROWS[-1]}"
  [ "$tree_ok" = ok ] || NFAIL=$((NFAIL + 1))
  echo "verify $TAG: ${#ROWS[@]} rows, $NFAIL failed, $((SECONDS - T0)) s"
} > "$W/summary.txt"
cat "$W/summary.txt" >> "$VLOG"
echo; cat "$W/summary.txt"
[ "$NFAIL" = 0 ]
