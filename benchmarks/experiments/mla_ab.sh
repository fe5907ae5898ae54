#!/bin/bash
# Kernel A/Bs prepared without a GPU (hundred-and-seventeenth session): each patch of benchmarks/experiments/mla_ab/
# is applied to a copy of src/fmha/kernels/mla_decode_sm90.py, and probe_mla.py --versions times the copies beside
# the package's kernel in one process (outputs checked against it first). The rows: `prefill` (bench sparse's three
# prefill rows), `sparse` (its b=64 decode rows and two prefill rows) or `dense` (probe_mla's VERSION_CASES).
#   lazy_gather.patch     the gather forms skip warpgroup 0's rescales while no row max moves (LAZY), as the TMA
#                         forms do (prefill form: 48 / 53 spill stores / loads against 40 / 46, local compile)
#   unsigned_bound.patch  `_key_rows`: index >= 0 and < bound in one unsigned compare (16 fewer SASS instructions)
#   split_pdl.patch       the split kernel launched as a programmatic dependent (launch_pdl), waiting for the kernel
#                         before it as it starts (issue 4: a call's launch overlapping the previous call's tail)
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
