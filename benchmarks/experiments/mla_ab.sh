#!/bin/bash
# Kernel A/Bs prepared without a GPU (hundred-and-seventeenth session): each patch of benchmarks/experiments/mla_ab/
# is applied to a copy of src/fmha/kernels/mla_decode_sm90.py, and probe_mla.py --versions times the copies beside
# the package's kernel in one process (every output of the call checked against it first). The rows: `prefill`
# (bench sparse's three prefill rows), `sparse` (its b=64 decode rows and two prefill rows) or `dense` (probe_mla's
# VERSION_CASES).
#   split_pdl.patch       the split kernel launched as a programmatic dependent (launch_pdl), waiting for the kernel
#                         before it as it starts (issue 4: a call's launch overlapping the previous call's tail).
#                         Level on the six dense rows (hundred-and-eighteenth session); kept for a try together with
#                         an early launch_dependents in the combine.
# Measured and dropped (NOTES.md, hundred-and-eighteenth session): lazy_gather (LAZY in the gather forms: its +1-2%
# came with a stale max_logits; with the true max kept it lost 1.6-1.9% on two prefill rows) and unsigned_bound
# (one unsigned index compare: level).
# Usage (device): PYTHONPATH=src bash benchmarks/experiments/mla_ab.sh OUTDIR prefill|sparse|dense PATCH...
out=${1:?OUTDIR}; rows=${2:?prefill|sparse|dense}; shift 2
copies=()
for p in "$@"; do
    name=$(basename "$p" .patch)
    patch -s -o "/tmp/$name.py" src/fmha/kernels/mla_decode_sm90.py < "benchmarks/experiments/mla_ab/$name.patch" || exit 1
    copies+=("/tmp/$name.py")
done
flag=(); [ "$rows" = prefill ] && flag=(--prefill); [ "$rows" = sparse ] && flag=(--sparse)
python3 benchmarks/probe_mla.py --versions "${copies[@]}" "${flag[@]}" --rounds 5 --out "$out/mla_ab_$rows.json"
