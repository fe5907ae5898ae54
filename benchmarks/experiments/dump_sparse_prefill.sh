#!/bin/bash
# The compiled sparse prefill kernel (SPARSE_PREFILL_CASES[0]) for reading off the device: Triton's cache files of
# mla_decode_sm90_kernel (cubin, ptx, ttgir, json) tarred, and one ncu launch's per-instruction page (SASS with
# the Python line of each instruction, executed counts, shared-memory wavefronts) gzipped. Usage (device):
#   PYTHONPATH=src bash benchmarks/experiments/dump_sparse_prefill.sh OUTDIR
out=${1:?OUTDIR}
export TRITON_CACHE_DIR=/tmp/tcache_dump
rm -rf $TRITON_CACHE_DIR
python3 benchmarks/profile_sparse.py --prefill 0 --plain
d=$(dirname $(ls $TRITON_CACHE_DIR/*/mla_decode_sm90_kernel.cubin | head -1))
tar czf $out/sparse_prefill_kernel.tgz -C $d .
ncu --kernel-name regex:mla_decode_sm90 --launch-skip 2 --launch-count 1 --clock-control none \
    --section SourceCounters --metrics smsp__sass_inst_executed_op_shared_ld,smsp__sass_inst_executed_op_shared_st \
    --import-source yes -f -o /tmp/sp python3 benchmarks/profile_sparse.py --prefill 0 --plain > /tmp/sp.log 2>&1 \
    || tail -5 /tmp/sp.log
ncu -i /tmp/sp.ncu-rep --page source --csv --print-source sass > /tmp/sp_sass.csv 2>&1
gzip -c /tmp/sp_sass.csv > $out/sp_sass.csv.gz
ls -la $out
