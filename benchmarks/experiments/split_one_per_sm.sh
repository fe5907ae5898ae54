# Next step of the eighty-eighth session: paged d = 256's split launch gained 5-7% at 5 stages, 132 KB of shared
# memory, one program an SM (3 stages, 98 KB, fit two). Do the other split entries gain from a pipeline deep enough to
# hold one program an SM? Split cases only (b = 4 / 1 at 131k keys, planned splits), 8 rows, the tables' tiles
# against deeper pipelines; the variants run their own stages split (probe_decode clears the rule for them). Shared
# memory compiled for sm_90 (split_compile.py, split): paged d = 64 (64, 64, 4, 3 / 5 / 7 / 9) 42 / 58 / 75 / 91 KB
# (the rule's 5 fits three an SM, none of these one); paged d = 128 8 rows (64, 64, 4, 5) 116 KB, one an SM already,
# and 6 stages compile to the same 116 KB (not run); the one-row d = 128 table (16, 128, 4, 3) 74 KB, 5 stages 139 KB
# (one an SM; 4 stages were level with 3 in the eighty-seventh session's split run).
export PYTHONUNBUFFERED=1 PYTHONPATH=src FMHA_COMMIT=$1
long="4,32,8,131072,64 1,32,8,131072,64 4,32,8,131072,- 1,32,8,131072,-"
run() { name=$1; shift; python3 benchmarks/probe_decode.py --cases $long --rounds 2 --out $OUT/split_deep_$name.json "$@" 2>&1 | grep -v Warning; }
run d64_s8 --head-dim 64 --seqlen-q 8 --variants default 64,64,4,7 64,64,4,9
run d128_s1 --head-dim 128 --variants default 16,128,4,5 16,64,4,8
