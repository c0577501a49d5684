#!/usr/bin/env bash
# On the GPU machine after scripts/device.sh installed PyCUDA: the warp stall reasons (average
# warps stalled per issued instruction) and the L1/L2 traffic of the gemv_sweep PROFILE launches
# (or of `NCU_SCRIPT profile CUBIN NCU_ARGS`, e.g. NCU_SCRIPT=scripts/attn_sweep.py with ATTN_ONLY;
# NCU_FILTER: more ncu options, e.g. "-k regex:tc_nw2 --launch-skip 3 --launch-count 1").
#   bash scripts/ncu_stalls.sh SWEEP.cubin > stalls.txt
#   bash scripts/ncu_stalls.sh SWEEP.cubin DIR    # also: per-SASS-line stall samples in DIR
# With DIR, a second pass samples warp stalls per instruction (the SourceCounters section) and
# writes DIR/prof.ncu-rep and DIR/source.csv (ncu --page source), to see which instructions of
# the inner loop the warps wait on.
set -uo pipefail
export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}
m=smsp__cycles_active.avg,smsp__inst_executed.sum,sm__warps_active.avg.pct_of_peak_sustained_active
for r in barrier long_scoreboard short_scoreboard wait math_pipe_throttle mio_throttle lg_throttle \
         not_selected selected dispatch_stall no_instruction drain branch_resolving membar sleeping; do
  m="$m,smsp__average_warps_issue_stalled_${r}_per_issue_active.ratio"
done
m="$m,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_bytes.sum"
m="$m,l1tex__t_sector_hit_rate.pct,l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum,lts__t_sector_hit_rate.pct"
m="$m,gpu__time_duration.sum,sm__throughput.avg.pct_of_peak_sustained_elapsed,dram__throughput.avg.pct_of_peak_sustained_elapsed"
cmd=(python3 "${NCU_SCRIPT:-scripts/gemv_sweep.py}" profile "$1" ${NCU_ARGS:-})
ncu ${NCU_FILTER:-} --metrics "$m" "${cmd[@]}"
if [ -n "${2:-}" ]; then
  mkdir -p "$2"
  ncu ${NCU_FILTER:-} --section SourceCounters --section WarpStateStats --import-source no -f -o "$2/prof" \
    "${cmd[@]}" > "$2/ncu-source.log" 2>&1
  ncu --import "$2/prof.ncu-rep" --page source --csv --print-source sass > "$2/source.csv" 2>&1
fi
