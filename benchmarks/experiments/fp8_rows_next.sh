# Next FP8 decode measurements (after the ninetieth session; `bash benchmarks/experiments/fp8_rows_next.sh COMMIT`):
# 1. d = 64 paged, 32 packed rows: the table's (32, 64, 2, 6) against (32, 128, 2, 4), which led by 1.4% at b = 64
#    and 7% at b = 4 with 131k keys (split) in b7b5c5b's confirm run; a third process decides.
# 2. 33-64 packed rows (8 tokens a GQA group of 8) on an FP8 cache, d = 128: the 64-row wgmma form (the default;
#    at 32 rows it read 0.45 of the cache) against two 32-row blocks a KV head (the 32-row tables' tiles) and
#    2-warp 64-row mma.sync tiles (V read byte by byte: `v_words_mode` gives 64-row tiles 0; compiled for sm_90,
#    (64, 64, 2, 6) is mma.sync at 255 registers, 57 KB: split_compile.py ... False 6 TILES=64,64,2).
# 3. bf16 caches at d = 64 with 32 packed rows: the 64-row tiles read 2659 GB/s paged (page 64) and 3625 contiguous
#    against the cache's read 4573 / 4609 (0.58 / 0.79; d = 256 0.85 / 0.94) in b7b5c5b's confirm run; 32-row tiles
#    lost to them at d = 128 only (history/probe_bf16_32rows_h200.json), d = 64 was never swept.
# The three probes can take ~10 min together (compiles): over 2 device calls, comment out the one to leave.
export PYTHONUNBUFFERED=1 PYTHONPATH=src FMHA_COMMIT=$1
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 200 python3 benchmarks/probe_fp8_decode.py --head-dim 64 --cases 5 14 --rounds 3 \
  --fp8-tiles 32,128,2,4 32,64,2,6 --out $OUT/probe_fp8_32rows_d64_p_h200_$1.json 2>&1 | grep -v Warning | tail -3
timeout 250 python3 benchmarks/probe_fp8_decode.py --head-dim 128 --cases 16 17 --rounds 2 \
  --fp8-tiles 32,64,2,6 32,128,4,3 64,64,2,6 64,128,4,3 --out $OUT/probe_fp8_64rows_h200_$1.json 2>&1 \
  | grep -v Warning | tail -3
timeout 200 python3 benchmarks/probe_fp8_decode.py --head-dim 64 --cases 5 8 --rounds 2 \
  --bf16-tiles 32,64,2,6 32,128,4,3 32,64,4,4 64,128,4,3 64,64,4,5 --out $OUT/probe_bf16_32rows_d64_h200_$1.json 2>&1 \
  | grep -v Warning | tail -3
