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
#   qk_first_twice.patch  sensitivity probes, not candidates (UNCHECKED=1: the scores are wrong on purpose): one
#   qk_rope_twice.patch   latent half of Q·Kᵀ (+24% of a tile's tensor-core work) or its RoPE part (+6%) issued
#                         twice. How much the memory-bound rows (h_q * s_q <= 32, 64 padded query rows) slow down says
#                         how far their tensor-core time, not the loads, sets their pace (issue 4).
# Measured and dropped (NOTES.md, hundred-and-eighteenth session): lazy_gather (LAZY in the gather forms: its +1-2%
# came with a stale max_logits; with the true max kept it lost 1.6-1.9% on two prefill rows) and unsigned_bound
# (one unsigned index compare: level). Landed (hundred-and-nineteenth session; results/history/mla_ab_*_q_opaque_*):
# q_opaque (Q's wgmma descriptors no longer hoisted and spilled: every spill gone, +6-7% on the sparse prefill rows,
# +1.5-4% dense) with early_rows (index rows read before the wgmma waits: +1.5-3% more on two prefill rows). Dropped:
# q_opaque_loader (the bf16 gathers on the loading warpgroup, spill-free now: 1.9-3.6% behind q_opaque).
# Usage (device): [UNCHECKED=1] PYTHONPATH=src bash benchmarks/experiments/mla_ab.sh OUTDIR prefill|sparse|dense PATCH[+PATCH]...
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
flag=(); [ -n "$UNCHECKED" ] && flag+=(--unchecked)
[ "$rows" = prefill ] && flag+=(--prefill); [ "$rows" = sparse ] && flag+=(--sparse)
python3 benchmarks/probe_mla.py --versions "${copies[@]}" "${flag[@]}" --rounds 5 --out "$out/mla_ab_$rows.json"
