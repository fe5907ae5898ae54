# GPU fuzz on the commit, then the landed FP8 decode's configuration sweep (`fp8_gluon_decode.py sweep`), one device
# call: `bash benchmarks/experiments/fp8_gluon_sweep.sh COMMIT FIRST_SEED`.
export PYTHONUNBUFFERED=1 PYTHONPATH=src FMHA_COMMIT=$1
FMHA_FUZZ_GPU_CASES=32 FMHA_FUZZ_FIRST_SEED=$2 timeout 280 python3 -m pytest -m gpu tests/test_fuzz.py -n 14 -q \
  -p no:cacheprovider > $OUT/fuzz_gpu_$2.txt 2>&1
echo "fuzz rc $?"; tail -2 $OUT/fuzz_gpu_$2.txt | cut -c1-300
cd benchmarks/experiments && PYTHONPATH=../../src:. timeout 200 python3 fp8_gluon_decode.py sweep \
  --out $OUT/fp8_gluon_sweep_h200_$1.json 2>&1 | grep -v Warning | tail -24
