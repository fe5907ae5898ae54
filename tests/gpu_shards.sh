#!/usr/bin/env bash
# The GPU suite (`pytest -m gpu`) in parallel shards on the device, with one summary file to bring back (a device call
# returns at most 8 files, so per-shard logs get lost).
#
#   tests/gpu_shards.sh N FIRST LAST OUTDIR [pytest arguments...]
#
# Runs shards FIRST..LAST of N (`--shard i/N`, conftest.py: every N-th collected test) at once, one process each (the
# kernels' compiles are CPU-bound: about one process a core), each killed after SHARD_TIMEOUT seconds (default 540),
# then writes OUTDIR/summary.txt: each shard's last line (a killed shard's passed count and the test it was in),
# every FAILED / ERROR line (a finished shard's twice: its verbose line and pytest's summary), and the slowest tests.
# The whole suite in one device call of 16 processes: `SHARD_TIMEOUT=470 tests/gpu_shards.sh 16 0 15 $OUT` (on the
# H200, 2026-11-28: shards 309-406 s, and test_cli's 75 s after them fit the same call; 2026-11-29: 322-357 s, one
# shard past 400 s; 1751f1e with 12 paired-tails cases of ~20 s, since cut to 6: 384-394 s, and SHARD_TIMEOUT=400 cut
# 8 shards), or in two calls of 13: FIRST..LAST = 0..12, then 13..25 of 26. Keep 470: the call's 600 s fit it.
# SHARD_TESTS (default `tests`) names the files to shard: a file given among the pytest arguments is collected
# besides `tests`, not instead (SHARD_TESTS=tests/test_fuzz.py for the fuzz alone).
set -u
n=$1 first=$2 last=$3 out=$4
shift 4
logs=$(mktemp -d)
# Each process's torch would start a thread a core for the oracles' CPU work: 13 processes on 16 cores oversubscribe.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
for i in $(seq "$first" "$last"); do
    timeout -s KILL "${SHARD_TIMEOUT:-540}" python -m pytest ${SHARD_TESTS:-tests} -m gpu -v -p no:cacheprovider \
        --durations=8 --shard "$i/$n" "$@" > "$logs/$i.log" 2>&1 &
done
wait
{
    for i in $(seq "$first" "$last"); do
        end=$(grep -E "^=+ .*(passed|failed|error|skipped|deselected).* in [0-9.]+s" "$logs/$i.log" | tail -1)
        passed=$(grep -c -E '::.* PASSED' "$logs/$i.log")
        last_test=$(grep -E '::' "$logs/$i.log" | tail -1)
        echo "shard $i/$n: ${end:-KILLED or crashed after $passed passed; last line: $last_test}"
    done
    echo "--- failures"
    # pytest's closing summary, and the verbose per-test lines (all a killed shard leaves)
    grep -h -E "^(FAILED|ERROR) |::.* (FAILED|ERROR)" "$logs"/*.log
    echo "--- slowest"
    grep -h -E "^[0-9.]+s (call|setup|teardown) " "$logs"/*.log | sort -rn | head -25
} > "$out/summary.txt"
cat "$out/summary.txt"
