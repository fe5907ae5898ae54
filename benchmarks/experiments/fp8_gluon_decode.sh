# First GPU run of `fp8_gluon_decode.py` (`bash benchmarks/experiments/fp8_gluon_decode.sh COMMIT`, one device call,
# ~5-8 min with compiles): the oracle check, then the timing against the package, then ncu of the default
# configuration on case 16 (page 64) if the timing ran. Every step under a timeout: a wrong barrier phase hangs.
export PYTHONUNBUFFERED=1 PYTHONPATH=src FMHA_COMMIT=$1
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 200 python3 benchmarks/experiments/fp8_gluon_decode.py check > $OUT/fp8_gluon_check.txt 2>&1
echo "check rc $?"; tail -4 $OUT/fp8_gluon_check.txt | cut -c1-300
timeout 260 python3 benchmarks/experiments/fp8_gluon_decode.py time --out $OUT/fp8_gluon_decode_h200_$1.json \
  2>&1 | grep -v Warning | tail -24
if [ -s $OUT/fp8_gluon_decode_h200_$1.json ]; then
  # the fastest configuration on case 16 (page 64, one token of 512 heads)
  BEST=$(python3 -c "import json, sys; rows = [r for r in json.load(open(sys.argv[1]))['rows'] if r.get('gbps')
    and r['name'].startswith('gluon') and r['page'] == 64 and r['b'] == 64 and r['s_q'] == 1]
print(max(rows, key=lambda r: r['gbps'])['name'].split()[1].replace(',', ' ') if rows else '')" \
    $OUT/fp8_gluon_decode_h200_$1.json)
  echo "ncu of: ${BEST:-the default}"
  NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
  timeout 100 $NCU --kernel-name regex:fp8_decode --launch-skip 2 --launch-count 1 --clock-control none --set full \
    --import-source yes -o /tmp/g python3 benchmarks/experiments/fp8_gluon_decode.py profile 64 $BEST \
    > /dev/null 2>&1
  $NCU -i /tmp/g.ncu-rep --page details > $OUT/ncu_fp8_gluon_decode_p64_details_h200_$1.txt 2>&1
  $NCU -i /tmp/g.ncu-rep --page source --csv --print-source sass > /tmp/g.csv 2>&1
  python3 benchmarks/ncu_source.py /tmp/g.csv 50 > $OUT/ncu_src_fp8_gluon_decode_p64_h200_$1.txt 2>&1
  grep -E "Duration|DRAM Throughput|Issued Ipc|No Eligible" $OUT/ncu_fp8_gluon_decode_p64_details_h200_$1.txt
fi
