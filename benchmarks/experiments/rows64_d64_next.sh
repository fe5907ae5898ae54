# Next decode measurements (after the ninety-first session; `bash benchmarks/experiments/rows64_d64_next.sh COMMIT`):
# bf16 d = 64 with 33-64 packed rows, where the 64-row tables' (64, 64, 4, 3) read 2656 GB/s paged (page 64) and
# 3582 contiguous, 0.58 / 0.77 of the cache's read, against (64, 128, 4, 3) 3583 / 4186 in one process
# (history/probe_bf16_64rows_d64_h200_83bbec1.json: 512 query heads over 8, one token, b = 64, 4k keys). The same
# entry is the paged short launch's wide form, and split launches give it 7 stages (`_GPU_SPLIT_TILES`), so:
# 1. 64 rows of one token (cases 16 / 17) and b = 4 at 131k keys (case 18, split), bf16 and FP8 (which has no
#    d = 64 entry at 64 rows: 1837 / 1486 GB/s of FP8 bytes there);
# 2. 16 query tokens a GQA group of 4 (64 rows), causal and not, pages 16 / 64 / contiguous and b = 4 at 131k;
#    (64, 64, 4, 7) is what the split case runs today.
# Compiled for sm_90 (split_compile.py '[64, 64, 64, false, []]' True 3 TILES=64,128,4): 75 KB and 229-231
# registers, two an SM (by registers), where (64, 64, 4, 7) split is 75 KB and 128 registers, three an SM; the FP8
# (64, 128, 4, 3) 57 KB and 206.
# If (64, 128, 4, 3) leads, a second process decides, with the short launch measured (`probe_varlen_paged`).
export PYTHONUNBUFFERED=1 PYTHONPATH=src FMHA_COMMIT=$1
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 200 python3 benchmarks/probe_fp8_decode.py --head-dim 64 --cases 16 17 18 --rounds 2 \
  --bf16-tiles 64,128,4,3 64,128,4,4 64,64,4,5 --fp8-tiles 64,128,4,3 64,64,4,5 \
  --out $OUT/probe_rows64_d64_h200_$1.json 2>&1 | grep -v Warning | tail -3
timeout 220 python3 benchmarks/probe_decode.py --head-dim 64 --seqlen-q 16 --rounds 2 --causal 0 1 \
  --cases 64,32,8,4096,16 64,32,8,4096,64 64,32,8,4096,- 4,32,8,131072,64 \
  --variants default 64,128,4,3 64,64,4,7 --out $OUT/probe_rows64_d64_spec16_h200_$1.json 2>&1 \
  | grep -v Warning | tail -4
# 3. The split case of 8 tokens a group of 4 (32 rows: the 17-32-row table's tiles since afbef6a), whose probe ran
#    past its timeout in mid_rows_confirm.sh: the new tiles (default) against the old 64-row tile (3 stages; 7 split).
timeout 120 python3 benchmarks/probe_decode.py --head-dim 64 --seqlen-q 8 --rounds 2 \
  --cases 4,32,8,131072,64 4,32,8,131072,- --variants default 64,64,4,3 64,64,4,7 \
  --out $OUT/probe_mid_d64_spec8_split_h200_$1.json 2>&1 | grep -v Warning | tail -2
