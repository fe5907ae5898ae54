# ncu (`--set full`, source page) of one paged decode at 64 packed rows, FP8 and bf16 caches: b = 64, 512 query
# heads over 8, 4k keys, page 64, d = 128 (`profile_decode.py --hq 512`).
# `bash benchmarks/experiments/ncu_rows64_decode.sh COMMIT` on the device (~1 min warm). Why: capped at three programs
# an SM the FP8 64-row forms ran slower than at two (ninety-eighth session). What it found
# (`history/ncu_*_rows64_p64_*_h200_c327e2e.txt`, NOTES.md): FP8 DRAM 44% against bf16's 89% with fewer instructions,
# a serial chain a tile (the wait after the single-buffered FP8 loads 16% of the samples), shared stores at 2.2x the
# ideal wavefronts.
export PYTHONUNBUFFERED=1 PYTHONPATH=src FMHA_COMMIT=$1
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1); echo "ncu: $NCU"
for v in fp8 bf16; do
  flag=""; [ $v = fp8 ] && flag=--fp8
  timeout 200 $NCU --kernel-name regex:attn_fwd_kernel --launch-skip 2 --launch-count 1 --clock-control none \
    --set full --import-source yes -o /tmp/$v \
    python3 benchmarks/profile_decode.py $flag --hq 512 --page 64 > $OUT/ncu_log_$v.txt 2>&1
  tail -3 $OUT/ncu_log_$v.txt
  $NCU -i /tmp/$v.ncu-rep --page details > $OUT/ncu_decode_${v}_rows64_p64_details_h200_$1.txt 2>&1
  $NCU -i /tmp/$v.ncu-rep --page source --csv --print-source sass > /tmp/src_$v.csv 2>&1
  python3 benchmarks/ncu_source.py /tmp/src_$v.csv 50 > $OUT/ncu_src_decode_${v}_rows64_p64_h200_$1.txt 2>&1
done
KEYS="Duration|DRAM Throughput|Registers Per|Achieved Occupancy|Issued Ipc|Shared Memory Configuration Size|Block Limit"
grep -E "$KEYS" \
  $OUT/ncu_decode_*_details_*.txt | cut -c1-150
