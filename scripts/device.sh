#!/usr/bin/env bash
# On the GPU machine: install PyCUDA from the wheels in .gpu/ (copied from shared/device by
# `make device-prep` on the CPU side), run the GPU tests, gate the emitted default program
# with the cubin loaded, and print a short table last.
#   usage (from the repo root, on the device): bash scripts/device.sh
set -uo pipefail
OUT=${OUT:-/tmp/qwen38-out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpu/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv,noheader

python3 -m pytest -q -s -p no:cacheprovider tests/gpu -o junit_family=xunit2 \
  --junitxml="$OUT/gpu-junit.xml" 2>&1 | tee "$OUT/gpu.log"
rc=${PIPESTATUS[0]}

python3 - "$OUT/gpu-junit.xml" <<'PY'
import sys, xml.etree.ElementTree as ET
root = ET.parse(sys.argv[1]).getroot()
rows = []
for tc in root.iter("testcase"):
    st = "pass"
    if tc.find("failure") is not None or tc.find("error") is not None: st = "FAIL"
    elif tc.find("skipped") is not None: st = "skip"
    rows.append((tc.get("classname").split(".")[-1], tc.get("name"), st, float(tc.get("time", 0))))
print(f"\n{'module':<24} {'test':<56} {'status':<6} {'s':>6}")
for m, n, s, t in rows:
    print(f"{m:<24} {n[:56]:<56} {s:<6} {t:6.1f}")
print(f"{sum(r[2]=='pass' for r in rows)} passed, {sum(r[2]=='FAIL' for r in rows)} failed, "
      f"{sum(r[2]=='skip' for r in rows)} skipped")
PY
exit $rc
