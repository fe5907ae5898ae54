"""One prefill call of the Hopper kernel for a profiler: the `fmha bench prefill` shape for head_dim d and length s
(b = 16384 / s, h = 2048 / d, bf16), with two or three consumer warpgroups (`--wgs`; the tiles are the table's
for that count), or with `--peer cudnn|fa2` the same call through SDPA's cuDNN or FlashAttention-2 backend (to
read its launch shape and stalls beside ours). Three calls, the first compiles.

    ncu --kernel-name regex:attn_fwd_sm90 --launch-skip 2 --launch-count 1 --clock-control none \\
        --section SpeedOfLight --section WarpStateStats --section SchedulerStats \\
        python3 benchmarks/profile_prefill.py -d 64 -s 4096 --causal --wgs 3
    ncu --kernel-name regex:"sdpa|fprop|flash_fwd" --launch-skip 2 --launch-count 1 --section LaunchStats \
        python3 benchmarks/profile_prefill.py -d 64 -s 1024 --peer cudnn
"""
import argparse

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from fmha.kernels import forward_sm90

PEERS = {"cudnn": SDPBackend.CUDNN_ATTENTION, "fa2": SDPBackend.FLASH_ATTENTION}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("-d", type=int, default=64)
    p.add_argument("-s", type=int, default=4096)
    p.add_argument("--causal", action="store_true")
    p.add_argument("--wgs", type=int, choices=(2, 3), default=None, help="consumer warpgroups (default: the choice)")
    p.add_argument("--peer", choices=sorted(PEERS), default=None, help="profile this SDPA backend instead")
    args = p.parse_args()
    d, s = args.d, args.s
    b, h = 16384 // s, 2048 // d
    tiles = None
    if args.wgs is not None:
        tiles = forward_sm90._WIDE_TILES[d] if args.wgs == 3 else forward_sm90._TILES[d]
    torch.manual_seed(0)
    q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    out = torch.empty_like(q)
    lse = torch.empty(b, h, s, device="cuda")
    if args.peer:
        qt, kt, vt = (t.transpose(1, 2).contiguous() for t in (q, k, v))
        with sdpa_kernel(PEERS[args.peer]):
            for _ in range(3):
                F.scaled_dot_product_attention(qt, kt, vt, is_causal=args.causal)
        torch.cuda.synchronize()
        return
    for _ in range(3):
        forward_sm90.attention_forward_sm90(q, k, v, out, lse, causal=args.causal, softmax_scale=d ** -0.5,
                                           pingpong=False, tiles=tiles)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
