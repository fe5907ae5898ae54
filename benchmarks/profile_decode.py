"""One decode call for a profiler: b=64, hq=32, hk=8, sk=4096, d=128, bf16, through `fmha.attention_with_kvcache`;
three calls, the first compiles. `--page 0` is the contiguous cache; otherwise pages of that size laid out as
`probe_decode.py --placement` does (`--placement in-order` is the contiguous cache's bytes, paged).
`--stages` puts that pipeline depth in the decode tile tables. `--fp8` makes the cache float8_e4m3fn with
per-(batch, KV head) descales (`fmha.bench.quantize_fp8`, as `probe_fp8_decode.py`); `--hq` packs more query
heads a KV head (`--hq 256`: 32 rows, the FP8 32-row tables). `--peer cudnn` runs the same call through SDPA's
cuDNN backend on the contiguous cache instead (as `fmha bench decode` times it), to profile the peer.

    ncu --kernel-name regex:attn_fwd_kernel --launch-skip 2 --launch-count 1 --clock-control none \\
        --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \\
        python3 benchmarks/profile_decode.py --page 64 --placement in-order
    ncu --kernel-name regex:sdpa --launch-skip 2 --launch-count 1 ... python3 benchmarks/profile_decode.py --peer cudnn
"""
import argparse

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import fmha
from fmha.bench import quantize_fp8
from fmha.kernels import forward
from probe_decode import D, placed_copy


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--page", type=int, default=64, help="page size; 0 = contiguous cache")
    p.add_argument("--placement", default="shuffled", choices=("in-order", "2MB-runs", "shuffled"))
    p.add_argument("--stages", type=int, default=None, help="num_stages of the decode tiles (default: the table's)")
    p.add_argument("--fp8", action="store_true", help="an FP8 (e4m3) cache with k / v descales")
    p.add_argument("--hq", type=int, default=32, help="query heads (over 8 KV heads)")
    p.add_argument("--peer", choices=("cudnn",), default=None,
                   help="profile SDPA's cuDNN backend on the contiguous cache instead")
    args = p.parse_args()
    if args.stages is not None:
        for table in forward._GPU_DECODE_TABLES:
            table[D] = (*table[D][:3], args.stages)
    torch.manual_seed(0)
    b, hq, hk, sk = 64, args.hq, 8, 4096
    q = torch.randn(b, 1, hq, D, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(b, sk, hk, D, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(b, sk, hk, D, device="cuda", dtype=torch.bfloat16)
    lens = torch.full((b,), sk, dtype=torch.int32, device="cuda")
    if args.peer:
        qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            for _ in range(3):
                F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=hq != hk)
        torch.cuda.synchronize()
        return
    descales = {}
    if args.fp8:
        (k, descales["k_descale"]), (v, descales["v_descale"]) = quantize_fp8(k, hk), quantize_fp8(v, hk)
    table = None
    if args.page:
        k, v, table = placed_copy(args.page, args.placement, k, v)
    for _ in range(3):
        fmha.attention_with_kvcache(q, k, v, lens, block_table=table, **descales)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
