#!/usr/bin/env bash
# The first device call after the sixty-fourth session (NOTES.md, its next step 1): `fp8_v_words.patch` applied to
# the device's copy of the tree, then the GPU tests that cover it and the FP8 decode probe with the V-read modes and
# the tile variants the patch may favour, in one call.
#
#   FMHA_COMMIT=<hash> bash benchmarks/experiments/fp8_v_words_check.sh OUTDIR [tests|probe|both]
#
# tests: `gpu_shards.sh 16 0 15` with -k "fp8 or planner or fit_per_sm" (the asm path's first run: its correctness
# check); probe: `probe_fp8_decode.py --v-words 0 1` (mode 2, the patch's default, is the plain "ours_fp8" column)
# and three tile variants, on the default cases and the 32-row ones (5, 8). Both fit one 600 s call on a warm H200
# only if the tests stay near 200 s; on a cold machine run them as two calls.
set -u
out=$1 what=${2:-both}
git apply benchmarks/experiments/fp8_v_words.patch || { echo "the patch does not apply"; exit 1; }
export PYTHONUNBUFFERED=1 PYTHONPATH=src
if [ "$what" != probe ]; then
    SHARD_TIMEOUT=${SHARD_TIMEOUT:-280} bash tests/gpu_shards.sh 16 0 15 "$out" -k "fp8 or planner or fit_per_sm" \
        > /dev/null 2>&1
    head -20 "$out/summary.txt" | cut -c1-120
    grep -o '[0-9]* passed' "$out/summary.txt" | awk '{s += $1} END {print "passed in all:", s}'
fi
if [ "$what" != tests ]; then
    timeout -s KILL "${PROBE_TIMEOUT:-280}" python3 benchmarks/probe_fp8_decode.py --rounds 2 --v-words 0 1 \
        --fp8-tiles 16,128,4,3 16,128,2,3 16,64,4,6 --cases 0 1 2 3 4 5 8 \
        --out "$out/probe_fp8_v_words_h200.json" 2>&1 | grep -v Warning | tail -10
fi
