# The landed Gluon FP8 decode (`fmha.kernels.fp8_decode_sm90`) on the GPU, one device call
# (`bash benchmarks/experiments/fp8_gluon_land.sh COMMIT`): its GPU tests and the FP8 cache tests beside them,
# then the timing against the portable kernel through the API (`fp8_gluon_decode.py time`).
export PYTHONUNBUFFERED=1 PYTHONPATH=src FMHA_COMMIT=$1
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 240 python3 -m pytest -m gpu -q -p no:cacheprovider -n 12 tests/test_kvcache.py \
  -k "gluon_decode or 64_rows_d64 or fp8" > $OUT/fp8_gluon_land_tests.txt 2>&1
echo "tests rc $?"; tail -5 $OUT/fp8_gluon_land_tests.txt | cut -c1-300
cd benchmarks/experiments && PYTHONPATH=../../src:. timeout 300 python3 fp8_gluon_decode.py time \
  --out $OUT/fp8_gluon_decode_landed_h200_$1.json 2>&1 | grep -v Warning | tail -20
