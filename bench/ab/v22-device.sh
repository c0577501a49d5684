#!/usr/bin/env bash
# Version 22's pending device work (docs/PERFORMANCE.md, "Version 22", Next), written while no
# device was lent. Up to four device calls of under ten minutes each, from the repo root:
#
#   bash bench/ab/v22-device.sh prep      # CPU machine first: trees, programs, cubins
#   device: bash bench/ab/v22-device.sh speed        carry [".gpu", ".ab", ".cache/ab"]
#   device: bash bench/ab/v22-device.sh sweeps       (the same carry; each call < 10 min)
#   device: bash bench/ab/v22-device.sh locks-sk     (only if an sk variant won)
#   device: bash bench/ab/v22-device.sh locks-store  (only if the gemv_store patch is to land)
#
# speed:  the narrow wgmma rates (scripts/wgmma_rate.py); the four-consumer A/B at B = 64, the
#         gemv_store A/B at B = 1 and 16, gate_up at CW 3, PP 1 at B = 24 and 32, and the 16-
#         and 8-row GEMVs on wgmma_sk_q4 (tune ROLE.sk16 at B = 16, ROLE.sk8 at B = 1)
#         (scripts/ab_step.py). ~9 min.
# sweeps: the B = 1 weight stream's stand-ins with the persistent warp-specialized variant
#         (scripts/stream_bench.py, wsp), and an ncu of the one-row gdn.in; in the four-consumer tree, GEMV_SWEEP=sk4 (64 rows) and
#         sk16 (16 to 32 rows, with CW 3 and CW 4 at PP 1 that ptxas no longer serializes), then
#         ncu of the 16-row gate_up on wgmma_sk_q4 (CW 4; CW 3 at PP 1) against gemv_q4 (stall
#         reasons, per-instruction). ~6 min.
# locks-sk: in the tree with both sk patches, the wgmma_sk GPU tests (four consumers, PP 1 at
#         16 rows, SwiGLU in tile order and in rows) and check B = 16, 9 with gate_up's SwiGLU in
#         rows; check B = 16, 9 with every 16-row GEMV of the tiny model on wgmma_sk_q4.
# locks-store: in the gemv_store tree, the gemv_q4 GPU tests, check B = 1, 16, 64, --mtp 1
#         B = 16, and memcheck and racecheck at B = 3.
# Everything lands in one tar and a summary (the device returns at most 8 files).
set -uo pipefail
ROOT=$PWD
C=.cache/ab
# The tiny model's sk16 locks: every role's 16-row tiles on wgmma_sk_q4 (ROWS: down reads rows).
# precompile.py takes them as --tune; device.sh's `check` as the QWEN38_SK16 variable, which the
# CLI maps to the same settings (long: down and fc, narrow: out), so both name the same programs.
SK16_ALL=gate_up=3:6:1,in=3:6:1,lm_head=3:6:1,long=3:6:1,narrow=3:6:1
SK16_ROWS=gate_up=3:6:1,in=3:6:1,lm_head=3:6:1,narrow=3:6:1
tunes() { local r; for r in "$@"; do printf -- '--tune %s.sk16=3:6:1 ' "$r"; done; }
SK16_ALL_TUNE=$(tunes gate_up in lm_head down fc out)
SK16_ROWS_TUNE=$(tunes gate_up in lm_head out)
case "${1:-}" in
prep)
  PY=${PY:-$ROOT/.venv/bin/python}
  rm -rf .ab $C   # only what these runs need travels (the device takes 64 MiB in all)
  make device-prep
  $PY scripts/ab_step.py prep bench/ab/v22-four-consumers.txt --batch 64 || exit 1
  $PY scripts/ab_step.py prep bench/ab/v22-gemv-store.txt --batch 1,16 || exit 1
  $PY scripts/ab_step.py prep bench/ab/v22-pp1-24-32.txt --batch 24,32 || exit 1
  $PY scripts/ab_step.py prep bench/ab/v22-sk16.txt --batch 16 || exit 1
  $PY scripts/ab_step.py prep bench/ab/v22-sk8.txt --batch 1 || exit 1
  # the SK16 lock: check on the tiny model with every 16-row GEMV on wgmma_sk_q4
  QWEN38_CACHE=$ROOT/$C $PY scripts/precompile.py $SK16_ALL_TUNE tiny:16 tiny:9 || exit 1
  (cd .ab/rows-cw3 && QWEN38_CACHE=$ROOT/$C $PY scripts/precompile.py $SK16_ROWS_TUNE tiny:16 tiny:9) || exit 1
  $PY scripts/wgmma_rate.py build $C/rate.cubin || exit 1
  $PY scripts/stream_bench.py build $C/sb.cubin || exit 1
  GEMV_SWEEP=g1 $PY scripts/gemv_sweep.py build $C/g1.cubin || exit 1
  (cd .ab/four-gu && GEMV_SWEEP=sk16 $PY scripts/gemv_sweep.py build $ROOT/$C/sk16.cubin &&
   GEMV_SWEEP=sk4 $PY scripts/gemv_sweep.py build $ROOT/$C/sk4.cubin) || exit 1
  # the locks' tiny programs in the gemv_store tree (check at B = 1, 16, 64 and --mtp 1 at 16)
  (cd .ab/store && QWEN38_CACHE=$ROOT/$C $PY scripts/precompile.py tiny:1 tiny:16 tiny:64 tiny:16:1) || exit 1
  du -sh .ab $C .gpu
  exit 0 ;;
speed | sweeps | locks-sk | locks-store) ;;
*) echo "usage: bash bench/ab/v22-device.sh prep|speed|sweeps|locks-sk|locks-store" >&2; exit 2 ;;
esac

OUT=${OUT:-/tmp/qwen38-out}
VERB=$1
W=/tmp/v22 && rm -rf $W && mkdir -p $W
export PYTHONUNBUFFERED=1 OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpu/*.whl || exit 3
export PYTHONPATH=/tmp/site:$ROOT
declare -a S
# After every step the tar and the summary are written again, so a call cut off by its time
# limit still returns what it finished.
pack() { printf '%s\n' "${S[@]}" > $W/summary.txt
         tar czf "$OUT/v22-$VERB.tgz" -C /tmp v22 && cp $W/summary.txt "$OUT/summary.txt"; }
step() { local name=$1; shift; echo "==== $name"; "$@" > "$W/$name.txt" 2>&1; local rc=$?
         S+=("$(printf '%-22s rc=%s' "$name" "$rc")"); tail -n 40 "$W/$name.txt"; pack; }
# device.sh from a tree: its own OUT folder, the checkout's wheels, none of its default checks
dev() { local tree=$1 name=$2; shift 2
        (cd "$tree" && env WHEELS=$ROOT/.gpu OUT=$W/$name QWEN38_CACHE=$ROOT/$C TESTS=0 BASIC=0 CHECK_B= \
           MTP_CHECK_B= SANITIZE=0 "$@" bash scripts/device.sh) > "$W/$name.txt" 2>&1
        S+=("$(printf '%-22s' "$name")" "$(sed -n '/==== summary ====/,$p' "$W/$name.txt" | tail -n +2)")
        pack; }

if [ "$1" = speed ]; then
  step rate python3 scripts/wgmma_rate.py run $C/rate.cubin
  dev . ab64 AB=bench/ab/v22-four-consumers.txt AB_B=64
  dev . ab1-16 AB=bench/ab/v22-gemv-store.txt AB_B=1,16
  dev . ab24-32 AB=bench/ab/v22-pp1-24-32.txt AB_B=24,32
  dev . ab16-sk AB=bench/ab/v22-sk16.txt AB_B=16
  dev . ab1-sk AB=bench/ab/v22-sk8.txt AB_B=1
elif [ "$1" = sweeps ]; then
  step stream python3 scripts/stream_bench.py run $C/sb.cubin
  # where the one-row GEMV's warps stall today (gdn.in at the program's config; version 5's ncu
  # is many versions old)
  step ncu1 env GEMV_SWEEP=g1 GEMV_PROFILE="gdn.in:1:b,1,2,0,0" bash scripts/ncu_stalls.sh $C/g1.cubin $W/ncu1
  cd .ab/four-gu || exit 1
  export PYTHONPATH=/tmp/site:$PWD
  step sk4 env GEMV_SWEEP=sk4 python3 scripts/gemv_sweep.py run $ROOT/$C/sk4.cubin $W/sk4.json
  step sk16 env GEMV_SWEEP=sk16 GEMV_SHAPES=gate_up,gdn.in,attn.in,lm_head \
    python3 scripts/gemv_sweep.py run $ROOT/$C/sk16.cubin $W/sk16.json
  step ncu16 env GEMV_SWEEP=sk16 GEMV_PROFILE="gate_up:2:s,4,4,0;gate_up:2:s,3,6,0,1;gate_up:2:b,2,2,0,0" \
    bash scripts/ncu_stalls.sh $ROOT/$C/sk16.cubin $W/ncu16
  cd "$ROOT"
elif [ "$1" = locks-sk ]; then
  # the rows tree holds both patches: the wgmma_sk GPU tests there cover the four-consumer
  # configs, PP 1 at 16 rows and the SwiGLU epilogue in tile order and in rows
  dev .ab/rows-cw3 rows-locks TESTS=1 JOBS=16 PYTEST_FILES=tests/gpu/test_gemv_q4.py \
    PYTEST_K=wgmma_sk CHECK_B="16 9" QWEN38_SK16=$SK16_ROWS
  dev . sk16-check CHECK_B="16 9" QWEN38_SK16=$SK16_ALL
else
  dev .ab/store store-locks TESTS=1 JOBS=16 PYTEST_FILES=tests/gpu/test_gemv_q4.py \
    CHECK_B="1 16 64" MTP_CHECK_B=16 SANITIZE=1 SAN_B=3
fi
pack
echo "==== summary"; cat $W/summary.txt
