# d = 256's 64-row decode tiles ((64, 64, 4, 2) in both tables: speculative decodes of 5-16 rows a GQA group of 4,
# and the short launch's wide form) against others, through packed queries over a paged cache.
export PYTHONUNBUFFERED=1 PYTHONPATH=src FMHA_COMMIT=$1
nvidia-smi --query-gpu=name --format=csv,noheader
python3 benchmarks/probe_varlen_paged.py --short --head-dim 256 --out $OUT/d256_tiles.json \
  --decode-tiles 64,32,4,2 64,32,4,3 64,16,4,3 64,64,8,2 \
  --case 32x16@4096 64x8@4096 32x1,32x20@4096 32x1,32x48@4096 2>&1 | tail -4
