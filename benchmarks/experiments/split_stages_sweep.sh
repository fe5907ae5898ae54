# Do split launches of the decode tiles want deeper pipelines, as paged d = 64 and contiguous d = 32 did
# (`forward._GPU_SPLIT_TILES`)? Split cases only (b = 4 / 1 at 131k keys, planned splits), the tables' tiles against
# more stages, one process a head dim and row count; the variants run their own stages split (probe_decode clears the
# rule for them). 8 rows: speculative decodes (the 64-row tables); 1 row at d = 128: the 16-row table.
#   sweep (eighty-eighth session, on 55cf5c8): 4-6 stages; paged d = 256 gained (5 stages in the rule since 8cfc8c7).
#   deep (the same session, on 7bb95f1): pipelines that fill an SM's shared memory. Compiled for sm_90, split
#   (split_compile.py): paged d = 64 (64, 64, 4, 3 / 5 / 7 / 9) 42 / 58 / 75 / 91 KB; paged d = 128 8 rows
#   (64, 64, 4, 5) 116 KB, one an SM already, 6 stages the same 116 KB; the one-row d = 128 table (16, 128, 4, 3)
#   74 KB, 5 stages 139 KB (one an SM). (The contiguous 1-row forms of these variants are over the shared memory.)
#   narrow (eighty-ninth session): the one-row 16-row tables at d = 64 and d = 256, split, against deeper pipelines
#   (the variants go in both tables: each case reports every variant, the table's own labelled default).
# Usage: bash split_stages_sweep.sh COMMIT [sweep|deep|narrow]  (default: sweep)
export PYTHONUNBUFFERED=1 PYTHONPATH=src FMHA_COMMIT=$1
long="4,32,8,131072,64 1,32,8,131072,64 4,32,8,131072,- 1,32,8,131072,-"
run() { name=$1; shift; python3 benchmarks/probe_decode.py --cases $long --rounds 2 --out $OUT/split_$name.json "$@" 2>&1 | grep -v Warning; }
if [ "${2:-sweep}" = sweep ]; then
  run stages_d128_s8 --head-dim 128 --seqlen-q 8 --variants default 64,64,4,4 64,64,4,5 64,64,4,6
  run stages_d64_s8 --head-dim 64 --seqlen-q 8 --variants default 64,64,4,4 64,64,4,5
  run stages_d256_s8 --head-dim 256 --seqlen-q 8 --variants default 64,32,4,5 64,32,4,6
elif [ "$2" = narrow ]; then
  run narrow_d64_s1 --head-dim 64 --variants default 16,128,2,4 16,128,2,5 16,64,4,6 16,64,4,8
  run narrow_d256_s1 --head-dim 256 --variants default 16,64,4,5 16,32,4,6 16,32,4,8
else
  run deep_d64_s8 --head-dim 64 --seqlen-q 8 --variants default 64,64,4,7 64,64,4,9
  run deep_d128_s1 --head-dim 128 --variants default 16,128,4,5 16,64,4,8
fi
