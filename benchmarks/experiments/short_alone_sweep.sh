export PYTHONUNBUFFERED=1 PYTHONPATH=src FMHA_COMMIT=$1
P="python3 benchmarks/probe_varlen_paged.py --short --short-alone"
nvidia-smi --query-gpu=name --format=csv,noheader
$P --out $OUT/mean.json --case 16x48,16x10@4096 16x48,16x20@4096 16x32,16x16@4096 24x48,8x24@4096 8x1,24x32@4096 16x1,16x32@4096 2>&1 | grep -v Warn | tail -8
$P --out $OUT/g8.json --heads 64 8 --case 64x1,2x24@4096 32x1,32x12@4096 32x24@4096 16x32,16x16@4096 2>&1 | tail -5
$P --out $OUT/p64.json --page 64 --case 64x1,2x48@4096 32x1,32x20@4096 32x32@4096 2>&1 | tail -4
for d in 64 256; do $P --out $OUT/d$d.json --head-dim $d --case 64x1,2x48@4096 32x1,32x20@4096 32x32@4096 2>&1 | tail -4; done
