#!/usr/bin/env bash
# cuDNN's prefill kernels beside ours, one ncu launch each (LaunchStats and the kernel's duration), for the
# `fmha bench prefill` shapes of head dim D (b = 16384 / s, h = 2048 / d, bf16): which kernel, tile and launch cuDNN
# picks where ours trails it (d = 256 causal: 0.965x in results/prefill_h200.json). Ours through fmha.attention (the
# package's own choices, ping-pong included).
#   bash benchmarks/experiments/prefill_launch_shapes.sh OUTDIR [D ...]
set -u
out=$1; shift
export PYTHONPATH=$PWD/src:$PWD/benchmarks
cat > /tmp/one_prefill.py <<'PY'
import sys
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
import fmha
who, d, s, causal = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1"
b, h = 16384 // s, 2048 // d
torch.manual_seed(0)
q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
for _ in range(3):
    if who == "cudnn":
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            F.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v)), is_causal=causal)
    else:
        fmha.attention(q, k, v, causal=causal)
torch.cuda.synchronize()
PY
for d in "${@:-256}"; do
  for s in 1024 4096 16384; do
    for c in 0 1; do
      for who in cudnn ours; do
        name='regex:sdpa|fprop'; [ $who = ours ] && name='regex:attn_fwd'
        echo "=== d=$d s=$s causal=$c $who"
        timeout 120 ncu --clock-control none --kernel-name "$name" --launch-skip 2 --launch-count 1 \
          --section LaunchStats --section Occupancy --metrics gpu__time_duration.sum \
          python3 /tmp/one_prefill.py $who $d $s $c 2>&1 | grep -E "^  [a-zA-Z_]|gpu__time|Grid Size|Block Size|Registers Per|Shared Memory Per Block|Theoretical Occ|Waves"
      done
    done
  done
done > "$out/prefill_launch_shapes.txt"
