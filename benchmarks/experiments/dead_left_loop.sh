# Next step 1 of the eighty-sixth session: `dead_left_loop.patch` (the masked left-window key loop that never runs
# without MASK_LEFT, taken out; exact) against the package's kernel, in one process, on the tables' own tiles:
# issue 3's decode cases (1 query row) at d = 128 and 64, and speculative decodes of 8 rows (the 64-row tiles).
export PYTHONUNBUFFERED=1 PYTHONPATH=src FMHA_COMMIT=$1
copy=$(mktemp -d)/forward.py
cp src/fmha/kernels/forward.py $copy && patch -s $copy < benchmarks/experiments/dead_left_loop.patch || exit 1
for args in "--head-dim 128" "--head-dim 64" "--head-dim 128 --seqlen-q 8"; do
  name=$(echo $args | tr -d ' -')
  python3 benchmarks/probe_decode.py $args --rounds 3 --variants default --kernel-copy $copy \
    --out $OUT/dead_left_loop_$name.json 2>&1 | grep -v Warning
done
