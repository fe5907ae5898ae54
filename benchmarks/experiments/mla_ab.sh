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
#   early_rows.patch      the gathers' index rows (`kidx`) read into registers before the wait on the product that
#                         precedes each gather, not after it (three sites; the line profile had ~11% of the sparse
#                         prefill's samples on the rows' shared-memory loads and the compares that wait for them).
#                         Same spills and instruction count (local sm_90 compile); the dense form's SASS identical.
#                         Not timed yet (hundred-and-eighteenth session).
#   q_opaque.patch        Q's buffer indexed by PART + (t >> 30), a run-time 0, in `_score_part`: the compiler can
#                         no longer hoist Q's wgmma descriptors out of the loop, and with them gone every spill goes
#                         (`compile_mla_sass.py`, STL / LDL / instructions): sparse prefill 40 / 46 / 5432 -> 0 / 0 /
#                         4816; dense 41 / 46 / 6192 -> 0 / 0 / 5544; V3.2 FP8 loader 99 / 102 / 7464 -> 0 / 0 /
#                         6688; model1 with a second source 69 / 76 / 8008 -> 10 / 10 / 7256. Not timed yet.
#   (q_opaque+early_rows: both, applied in turn; any patches joined by + make one copy.)
#   q_opaque_loader.patch q_opaque with the bf16/fp16 gathers taking the loading warpgroup (`uses_loader`): its
#                         consumers, which spilled 74 / 75 at 224 registers (thirty-fourth session: -1..-3%), compile
#                         with 1 / 2 at 216 and 224.
# Measured and dropped (NOTES.md, hundred-and-eighteenth session): lazy_gather (LAZY in the gather forms: its +1-2%
# came with a stale max_logits; with the true max kept it lost 1.6-1.9% on two prefill rows) and unsigned_bound
# (one unsigned index compare: level).
# Landing q_opaque: `patch -p1 < benchmarks/experiments/mla_ab/q_opaque.patch` and
# `patch -p1 < benchmarks/experiments/q_opaque_test.patch` (the compile test's bound on ptxas's spilled bytes: at most
# 8, 96 for model1's forms; every case fails on today's package, the sparse prefill with 172).
# Usage (device): PYTHONPATH=src bash benchmarks/experiments/mla_ab.sh OUTDIR prefill|sparse|dense PATCH[+PATCH]...
out=${1:?OUTDIR}; rows=${2:?prefill|sparse|dense}; shift 2
copies=()
for arg in "$@"; do
    name=${arg//+/_and_}
    cp src/fmha/kernels/mla_decode_sm90.py "/tmp/$name.py"
    for p in ${arg//+/ }; do
        patch -s "/tmp/$name.py" < "benchmarks/experiments/mla_ab/$p.patch" || exit 1
    done
    copies+=("/tmp/$name.py")
done
flag=(); [ "$rows" = prefill ] && flag=(--prefill); [ "$rows" = sparse ] && flag=(--sparse)
python3 benchmarks/probe_mla.py --versions "${copies[@]}" "${flag[@]}" --rounds 5 --out "$out/mla_ab_$rows.json"
