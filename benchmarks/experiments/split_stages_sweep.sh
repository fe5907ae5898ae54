# Next step of the eighty-seventh session: do split launches of the other decode tiles want deeper pipelines too, as
# paged d = 64 and contiguous d = 32 did (`forward._GPU_SPLIT_STAGES`)? Split cases only (b = 4 / 1 at 131k keys,
# planned splits), the tables' tiles against more stages, one process a head dim and row count; the variants run
# their own stages split (probe_decode clears the rule for them). 8 rows: speculative decodes (the 64-row tables).
# (1 row at d = 128, the 16-row tables, ran in the eighty-seventh session: no gain; NOTES.md.)
export PYTHONUNBUFFERED=1 PYTHONPATH=src FMHA_COMMIT=$1
long="4,32,8,131072,64 1,32,8,131072,64 4,32,8,131072,- 1,32,8,131072,-"
run() { name=$1; shift; python3 benchmarks/probe_decode.py --cases $long --rounds 2 --out $OUT/split_stages_$name.json "$@" 2>&1 | grep -v Warning; }
run d128_s8 --head-dim 128 --seqlen-q 8 --variants default 64,64,4,4 64,64,4,5 64,64,4,6
run d64_s8 --head-dim 64 --seqlen-q 8 --variants default 64,64,4,4 64,64,4,5
run d256_s8 --head-dim 256 --seqlen-q 8 --variants default 64,32,4,5 64,32,4,6
