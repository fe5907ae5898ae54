# Next FP8 decode measurements (after the ninetieth session; `bash benchmarks/experiments/fp8_rows_next.sh COMMIT`):
# 1. d = 64 paged, 32 packed rows: the table's (32, 64, 2, 6) against (32, 128, 2, 4), which led by 1.4% at b = 64
#    and 7% at b = 4 with 131k keys (split) in b7b5c5b's confirm run; a third process decides.
# 2. 33-64 packed rows (8 tokens a GQA group of 8) on an FP8 cache, d = 128: the 64-row wgmma form (the default;
#    at 32 rows it read 0.45 of the cache) against two 32-row blocks a KV head (the 32-row tables' tiles) and
#    2-warp 64-row mma.sync tiles (V read byte by byte: `v_words_mode` gives 64-row tiles 0).
export PYTHONUNBUFFERED=1 PYTHONPATH=src FMHA_COMMIT=$1
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 200 python3 benchmarks/probe_fp8_decode.py --head-dim 64 --cases 5 14 --rounds 3 \
  --fp8-tiles 32,128,2,4 32,64,2,6 --out $OUT/probe_fp8_32rows_d64_p_h200_$1.json 2>&1 | grep -v Warning | tail -3
timeout 250 python3 benchmarks/probe_fp8_decode.py --head-dim 128 --cases 16 17 --rounds 2 \
  --fp8-tiles 32,64,2,6 32,128,4,3 64,64,2,6 64,128,4,3 --out $OUT/probe_fp8_64rows_h200_$1.json 2>&1 \
  | grep -v Warning | tail -3
