# The 64-row decode tables' entries on the H200 (tuned on the H100, or not at all for d = 256 contiguous):
# speculative decodes of 8 / 16 rows a sequence, GQA 4 (32 / 64 packed rows), b = 64 at 4k keys on pages of 16 / 64
# and a contiguous cache, b = 4 at 131k keys on pages of 64. Each variant goes in every decode table holding the
# head dim (`probe_decode.py`), so the paged and contiguous cases share one variant list; the first is each
# table's own entry.  Usage: decode_tiles_64rows_h200.sh <commit> <head dim> <variant>...
export PYTHONUNBUFFERED=1 PYTHONPATH=src FMHA_COMMIT=$1
d=$2; shift 2
for s in 8 16; do
  python3 benchmarks/probe_decode.py --head-dim $d --seqlen-q $s --rounds 2 --variants "$@" \
    --cases 64,32,8,4096,16 64,32,8,4096,64 64,32,8,4096,- 4,32,8,131072,64 \
    --out $OUT/decode_64rows_d${d}_s$s.json 2>&1 | grep -v Warning
done
