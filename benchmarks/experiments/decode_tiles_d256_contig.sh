# Next step 1 of the eighty-fifth session: d = 256's contiguous 64-row decode tiles ((64, 64, 4, 2)) against the
# paged table's new (64, 32, 4, 3), on speculative decodes of 8 / 16 rows a sequence (32 / 64 packed rows, GQA 4).
export PYTHONUNBUFFERED=1 PYTHONPATH=src FMHA_COMMIT=$1
for s in 8 16; do
  python3 benchmarks/probe_decode.py --head-dim 256 --seqlen-q $s --contiguous --rounds 2 \
    --variants 64,64,4,2 64,32,4,3 64,32,4,2 --out $OUT/decode_d256_contig_s$s.json 2>&1 | grep "^b="
done
