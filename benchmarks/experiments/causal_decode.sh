# Next step of the eighty-seventh session: do causal decodes (one query row, causal=True: what vLLM and SGLang pass)
# run slower than the same decodes unmasked? At one row a sequence the bottom-right causal mask hides no key, yet the
# call compiles the MASK_RIGHT / REVERSE_M form (sm_90 SASS of the 16-row paged d = 128 form: 2808 instructions and
# 200 registers against 2584 and 196: `benchmarks/experiments/split_compile.py '[128, 16, 4, false, []]' False 3
# MASK_RIGHT=True REVERSE_M=True`, then `cuobjdump -sass` of the cubin it leaves in /tmp).
# `causal_decode.patch` (attention_forward: right = -1 when seqlen_q == 1; exact, CPU tests of test_kvcache,
# test_attention and test_fuzz pass with it) makes causal=True run the unmasked form; land it if /c reads slower
# here. The patch carries its test (`test_causal_decode_plans_unmasked`: fails without the change).
export PYTHONUNBUFFERED=1 PYTHONPATH=src FMHA_COMMIT=$1
for d in 128 64; do
  python3 benchmarks/probe_decode.py --head-dim $d --rounds 3 --variants default --causal 0 1 \
    --out $OUT/causal_decode_d$d.json 2>&1 | grep -v Warning
done
