# The Gluon FP8 decode (`fmha.kernels.fp8_decode_sm90`) on the GPU in one device call
# (`bash benchmarks/experiments/fp8_gluon_decode.sh COMMIT`, ~4-6 min): its timing against the portable kernel through
# the API (`fp8_gluon_decode.py time`), then an ncu profile of case 16 (page 64). (Until 342f4f2 this script ran the
# experiment's own kernel: check, time with configurations, profile; those modes went with the landing.)
export PYTHONUNBUFFERED=1 FMHA_COMMIT=$1
nvidia-smi --query-gpu=name --format=csv,noheader
cd benchmarks/experiments
PYTHONPATH=../../src:. timeout 300 python3 fp8_gluon_decode.py time --out $OUT/fp8_gluon_decode_landed_h200_$1.json \
  2>&1 | grep -v Warning | tail -20
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
PYTHONPATH=../../src:. timeout 100 $NCU --kernel-name regex:fp8_decode --launch-skip 2 --launch-count 1 \
  --clock-control none --set full --import-source yes -o /tmp/g python3 fp8_gluon_decode.py profile 64 > /dev/null 2>&1
$NCU -i /tmp/g.ncu-rep --page details > $OUT/ncu_fp8_gluon_decode_p64_details_h200_$1.txt 2>&1
$NCU -i /tmp/g.ncu-rep --page source --csv --print-source sass > /tmp/g.csv 2>&1
python3 ../ncu_source.py /tmp/g.csv 50 > $OUT/ncu_src_fp8_gluon_decode_p64_h200_$1.txt 2>&1
grep -E "Duration|DRAM Throughput|Issued Ipc|No Eligible" $OUT/ncu_fp8_gluon_decode_p64_details_h200_$1.txt
