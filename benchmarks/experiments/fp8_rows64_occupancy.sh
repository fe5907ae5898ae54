# FP8 caches at 33-64 packed rows, d = 128 (`bash benchmarks/experiments/fp8_rows64_occupancy.sh COMMIT`, one device
# call, ~3-4 min with compiles; written in the ninety-seventh session). Run in the ninety-eighth
# (`history/probe_fp8_64rows_occupancy_h200_c327e2e.json`): every form at three programs an SM was slower than the
# package's at two (paged (64, 64, 4, 3) 1675 -> 1404 GB/s capped); NOTES.md has the table.
# The package's 64-row FP8 forms run two programs an SM and read ~0.45 of the cache: (64, 128, 4, 3) paged is 115 KB
# (two by shared memory), contiguous (64, 64, 4, 3) 82 KB and 189 registers (two by both). Their loop is latency-
# bound, not issue-bound: at 2115 GB/s a 128-key tile takes a program ~4 us for ~780-970 instructions a warp (SASS
# compiled here). The 64-key paged form with more stages, (64, 64, 4, 5), was level (2053): still two an SM. Never
# measured: forms at THREE programs an SM, by a register cap of 168 (compiled for sm_90 here, `split_compile.py
# '[128, 64, 64, true, []]' False S TILES=M,N,W MAXNREG=168 [PAGED=False PAGE_TILE=0]`):
#   paged      (64, 64, 4, 3) r168: 65.5 KB, 168 registers, 8 bytes of stack; (64, 64, 4, 2) r168 16 bytes
#   both       (64, 32, 4, 3) r168: 41 KB paged / 49 KB contiguous, 166-167 registers, no stack (uncapped 172: two
#              an SM); at 128 (four an SM) 104 bytes of stack; (64, 32, 4, 6) r168: 49 / 74 KB, no stack
#   contiguous (64, 64, 4, 2) r168: 65.5 KB, 40 bytes of stack ((64, 64, 4, 3) is 82 KB: two an SM by shared memory)
# Cases 16 / 17 of probe_fp8_decode.py: b = 64, one token of 512 query heads over 8 KV heads (64 packed rows), 4k
# keys, page 64 / contiguous. `ours_fp8` is the package's table; each tile spec runs on its own launch plans.
export PYTHONUNBUFFERED=1 PYTHONPATH=src FMHA_COMMIT=$1
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 420 python3 benchmarks/probe_fp8_decode.py --head-dim 128 --cases 16 17 --rounds 3 \
  --fp8-tiles 64,128,4,3 64,64,4,3 64,64,4,3,168 64,64,4,2,168 64,32,4,3 64,32,4,3,168 64,32,4,6,168 \
  --out $OUT/probe_fp8_64rows_occupancy_h200_$1.json 2>&1 | grep -v Warning | tail -6
