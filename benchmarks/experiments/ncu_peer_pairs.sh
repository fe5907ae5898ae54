#!/bin/bash
# One ncu launch each of ours and FlashMLA's kernel on the same inputs, for each case named: `sparse` (the sparse
# prefill, h_q 128, d 576: SPARSE_PREFILL_CASES[0]) and `dense:S_K:H_Q:S_Q` (the dense MLA split kernel, b 128,
# page 64). Sections for a side by side reading (throughputs, shared-memory wavefronts and bank conflicts,
# instruction mix, warp stalls), and the per-instruction stall page summarised by ncu_source.py. Usage (device,
# .peers carried), e.g. the hundred-and-seventeenth session's first run:
#   PYTHONPATH=src:.peers bash benchmarks/experiments/ncu_peer_pairs.sh OUTDIR sparse dense:4096:128:1
out=${1:?OUTDIR}; shift
S="--section SpeedOfLight --section MemoryWorkloadAnalysis_Tables --section MemoryWorkloadAnalysis_Chart
   --section InstructionStats --section WarpStateStats --section LaunchStats --section Occupancy
   --section SchedulerStats --section ComputeWorkloadAnalysis --section SourceCounters"
run() {  # name, kernel regex, command...
    local name=$1 regex=$2; shift 2
    ncu --kernel-name-base demangled --kernel-name "regex:$regex" --launch-skip 2 --launch-count 1 \
        --clock-control none $S -f -o /tmp/$name "$@" > /tmp/$name.log 2>&1 || tail -5 /tmp/$name.log
    ncu -i /tmp/$name.ncu-rep --print-details all > $out/$name.txt 2>&1
    ncu -i /tmp/$name.ncu-rep --page source --csv --print-source sass > /tmp/$name.csv 2>/dev/null
    python3 benchmarks/ncu_source.py /tmp/$name.csv 30 > $out/${name}_src.txt 2>&1
}
for case in "$@"; do
    if [ "$case" = sparse ]; then
        run sparse_ours mla_decode_sm90 python3 benchmarks/profile_sparse.py --prefill 0 --plain
        run sparse_peer sparse_attn_fwd_kernel python3 benchmarks/profile_sparse.py --prefill 0 --plain --peer
    else
        IFS=: read -r _ sk hq sq <<< "$case"
        run dense_${sk}_${hq}_${sq}_ours mla_decode_sm90 python3 benchmarks/profile_mla.py $sk $hq $sq
        run dense_${sk}_${hq}_${sq}_peer flash_fwd_splitkv_mla python3 benchmarks/profile_mla.py $sk $hq $sq --peer
    fi
done
