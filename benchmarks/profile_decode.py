"""One decode call for a profiler: b=64, hq=32, hk=8, sk=4096, d=128, bf16, through `fmha.attention_with_kvcache`;
three calls, the first compiles. `--page 0` is the contiguous cache; otherwise pages of that size laid out as
`probe_decode.py --placement` does (`--placement in-order` is the contiguous cache's bytes, paged).
`--stages` puts that pipeline depth in the decode tile tables.

    ncu --kernel-name regex:attn_fwd_kernel --launch-skip 2 --launch-count 1 --clock-control none \\
        --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \\
        python3 benchmarks/profile_decode.py --page 64 --placement in-order
"""
import argparse

import torch

import fmha
from fmha.kernels import forward
from probe_decode import D, placed_copy


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--page", type=int, default=64, help="page size; 0 = contiguous cache")
    p.add_argument("--placement", default="shuffled", choices=("in-order", "2MB-runs", "shuffled"))
    p.add_argument("--stages", type=int, default=None, help="num_stages of the decode tiles (default: the table's)")
    args = p.parse_args()
    if args.stages is not None:
        for table in forward._GPU_DECODE_TABLES:
            table[D] = (*table[D][:3], args.stages)
    torch.manual_seed(0)
    b, hq, hk, sk = 64, 32, 8, 4096
    q = torch.randn(b, 1, hq, D, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(b, sk, hk, D, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(b, sk, hk, D, device="cuda", dtype=torch.bfloat16)
    lens = torch.full((b,), sk, dtype=torch.int32, device="cuda")
    table = None
    if args.page:
        k, v, table = placed_copy(args.page, args.placement, k, v)
    for _ in range(3):
        fmha.attention_with_kvcache(q, k, v, lens, block_table=table)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
