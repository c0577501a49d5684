#!/usr/bin/env bash
# On the GPU machine, from the repo root: install PyCUDA from the wheels in .gpu/ (copied from
# shared/device by `make device-prep`), run the GPU tests, regenerate the golden runs if asked
# (GOLDEN=1), gate one program with its cubin loaded, run `qwen38gen check` at several B, run
# compute-sanitizer on one prefill chunk + one decode step, and print a summary table last.
set -uo pipefail
OUT=${OUT:-/tmp/qwen38-out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpu/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1 QWEN38_CACHE=/tmp/q38cache
Q="python3 -m cli"
declare -a SUMMARY
note() { SUMMARY+=("$(printf '%-44s %s' "$1" "$2")"); }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"

if [ "${TESTS:-1}" = 1 ]; then
  python3 -m pytest -q -s -p no:cacheprovider tests/gpu ${PYTEST_K:+-k "$PYTEST_K"} 2>&1 | tee "$OUT/gpu-tests.log"
  note "pytest tests/gpu" "rc=${PIPESTATUS[0]}: $(tail -1 "$OUT/gpu-tests.log")"
fi

if [ "${GOLDEN:-0}" = 1 ]; then
  $Q golden --update 2>&1 | tee "$OUT/golden.log"; rc=${PIPESTATUS[0]}
  cp golden/*.json "$OUT/" 2>/dev/null
  note "golden --update" "rc=$rc"
fi

$Q emit --batch 16 -o /tmp/q38/tiny-b16.cu >/dev/null && $Q gate -q /tmp/q38/tiny-b16.cu 2>&1 | tail -2 | tee "$OUT/gate.log"
note "gate tiny b16 (cubin loaded)" "rc=${PIPESTATUS[0]}"

for B in ${CHECK_B:-1 2 3 16 17 64}; do
  $Q check --batch "$B" > "$OUT/check-b$B.log" 2>&1; rc=$?
  tail -4 "$OUT/check-b$B.log"
  note "check --batch $B" "rc=$rc: $(grep -E 'PASS|FAIL|error' "$OUT/check-b$B.log" | tail -1)"
done

if [ "${SANITIZE:-1}" = 1 ]; then
  for tool in memcheck racecheck; do
    compute-sanitizer --tool $tool --error-exitcode 9 python3 scripts/one_step.py 3 > "$OUT/sanitize-$tool.log" 2>&1
    rc=$?
    note "compute-sanitizer $tool (prefill+decode)" "rc=$rc: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitize-$tool.log" | tail -1)"
  done
fi

echo; echo "==== summary ===="
printf '%s\n' "${SUMMARY[@]}"
