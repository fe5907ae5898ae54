# Second SHORT_ALONE sweep: the packed rows a sequence on average (group x mean rows) against 128, and d = 256's
# wide form (the short launch's 64-row M blocks, (64, 64, 4, 2) from the decode table) against other 4-warp forms.
export PYTHONUNBUFFERED=1 PYTHONPATH=src FMHA_COMMIT=$1
P="python3 benchmarks/probe_varlen_paged.py --short --short-alone"
nvidia-smi --query-gpu=name --format=csv,noheader
$P --out $OUT/g4.json --case 16x64,16x32@4096 32x1,32x48@4096 16x1,16x64@4096 2>&1 | tail -3
$P --out $OUT/g8.json --heads 64 8 --case 32x1,32x32@4096 16x16,16x8@4096 48x1,16x32@4096 16x1,16x32@4096 2>&1 | tail -4
$P --out $OUT/d256.json --head-dim 256 --wide 64,32,4,2 64,32,4,3 32,64,4,2 32,32,4,4 32,32,4,3 \
  --case 32x1,32x20@4096 64x1,2x48@4096 32x1,32x48@4096 2>&1 | tail -3
