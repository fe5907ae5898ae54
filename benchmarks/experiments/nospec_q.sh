# One-process A/B (ninety-second session): attn_fwd_kernel with seqlen_q left unspecialised (a copy of forward.py
# made below, `@triton.jit(do_not_specialize=["seqlen_q"])`) against the package's, where Triton
# specialises a seqlen_q of 1 (every one-token decode). Compiled for sm_90 (split_compile.py with seqlen_q=1 as a
# constexpr), the specialisation costs registers: paged d = 64 (64, 64, 4, 3) 127 -> 142 (four programs an SM ->
# three), paged d = 16 (64, 64, 4, 5) 90 -> 98 (five -> four); issue 3's d = 128 16-row form 190 -> 194 (two
# either way). `bash benchmarks/experiments/nospec_q.sh COMMIT`
export PYTHONUNBUFFERED=1 PYTHONPATH=src FMHA_COMMIT=$1
# (Run on e8f795b, before `forward._forward_kernel` took the twin for one-token 64-row launches; since then the
# package's 64-row one-token launches already run unspecialised.)
K=/tmp/forward_nospec_q.py
python3 -c "import sys; s = open('src/fmha/kernels/forward.py').read(); old = '@triton.jit\ndef attn_fwd_kernel('; \
assert s.count(old) == 1; open(sys.argv[1], 'w').write(s.replace(old, '@triton.jit(do_not_specialize=[\"seqlen_q\"])\n' \
'def attn_fwd_kernel('))" $K
timeout 150 python3 benchmarks/probe_decode.py --head-dim 128 --rounds 2 --variants default --kernel-copy $K \
  --out $OUT/probe_nospec_d128_h200_$1.json 2>&1 | grep -v Warning | tail -6
timeout 120 python3 benchmarks/probe_decode.py --head-dim 64 --rounds 2 --variants default --kernel-copy $K \
  --cases 64,512,8,4096,64 64,512,8,4096,- 64,32,8,4096,16 64,32,8,4096,- 4,32,8,131072,64 \
  --out $OUT/probe_nospec_d64_h200_$1.json 2>&1 | grep -v Warning | tail -5
timeout 80 python3 benchmarks/probe_decode.py --head-dim 16 --rounds 2 --variants default --kernel-copy $K \
  --cases 64,32,8,4096,16 64,32,8,4096,64 --out $OUT/probe_nospec_d16_h200_$1.json 2>&1 | grep -v Warning | tail -2
timeout 80 python3 benchmarks/probe_decode.py --head-dim 256 --rounds 2 --variants default --kernel-copy $K \
  --cases 64,32,8,4096,16 64,32,8,4096,64 64,32,8,4096,- --out $OUT/probe_nospec_d256_h200_$1.json 2>&1 \
  | grep -v Warning | tail -3
