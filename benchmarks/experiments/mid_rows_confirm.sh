# The 17-32-row decode tables of afbef6a in a second process (`bash benchmarks/experiments/mid_rows_confirm.sh
# COMMIT`), each against the tile it replaced: bf16 d = 64 (32 rows of one token, b = 64 and b = 4 at 131k keys;
# 8 causal tokens a GQA group of 4; MHA with 32 tokens), FP8 d = 64 paged, FP8 d = 128 paged at 64 rows; and, to
# explore, bf16 d = 64 at 64 rows (cases 16 / 17). The last two were left for device time (commented out).
export PYTHONUNBUFFERED=1 PYTHONPATH=src FMHA_COMMIT=$1
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 170 python3 benchmarks/probe_fp8_decode.py --head-dim 64 --cases 5 8 14 15 --rounds 2 \
  --bf16-tiles 64,64,4,3 --fp8-tiles 32,64,2,6 --out $OUT/probe_mid_d64_confirm_h200_$1.json 2>&1 \
  | grep -v Warning | tail -4
timeout 130 python3 benchmarks/probe_decode.py --head-dim 64 --seqlen-q 8 --rounds 2 --causal 0 1 \
  --cases 64,32,8,4096,16 64,32,8,4096,64 64,32,8,4096,- 4,32,8,131072,64 --variants default 64,64,4,3 64,64,4,7 \
  --out $OUT/probe_mid_d64_spec8_h200_$1.json 2>&1 | grep -v Warning | tail -4
timeout 110 python3 benchmarks/probe_fp8_decode.py --head-dim 128 --cases 16 18 --rounds 2 \
  --fp8-tiles 64,64,4,5 --out $OUT/probe_fp8_64rows_confirm_h200_$1.json 2>&1 | grep -v Warning | tail -2
# timeout 60 python3 benchmarks/probe_decode.py --head-dim 64 --seqlen-q 32 --rounds 2 \
#   --cases 32,32,32,8192,64 32,32,32,8192,- --variants default 64,64,4,3 \
#   --out $OUT/probe_mid_d64_mha32_h200_$1.json 2>&1 | grep -v Warning | tail -2
# timeout 100 python3 benchmarks/probe_fp8_decode.py --head-dim 64 --cases 16 17 --rounds 2 \
#   --bf16-tiles 64,128,4,3 64,64,4,5 32,64,2,6 --out $OUT/probe_bf16_64rows_d64_h200_$1.json 2>&1 \
#   | grep -v Warning | tail -2
