"""Sweep the MLA decode kernel's tiles (BLOCK_N, num_warps, num_stages) on the GPU, FlashMLA's shapes.

    PYTHONPATH=src python3 benchmarks/tune_mla.py [--out tune_mla.json]

TFLOP/s = 2 * s_q * s_k * h_q * (576 + 512) per batch; GB/s = the cache read once + Q + O.
"""
import argparse

import torch

import fmha.mla as flash_mla
from fmha.bench import bench_gpu_graph, save_sweep
from fmha.kernels.mla_decode import mla_decode_forward

CASES = [(128, 8192, 128, 1), (128, 8192, 64, 2), (128, 8192, 16, 1)]
CONFIGS = [(32, 8, 2), (32, 8, 3), (64, 8, 1), (64, 8, 2), (16, 8, 3), (32, 4, 2)]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=None)
    p.add_argument("--configs", default=None, help="e.g. '32,8,2;64,8,2'")
    args = p.parse_args()
    configs = [tuple(int(x) for x in c.split(",")) for c in args.configs.split(";")] if args.configs else CONFIGS
    rows = []
    for b, sk, hq, sq in CASES:
        q = torch.randn(b, sq, hq, 576, device="cuda", dtype=torch.bfloat16)
        cache = torch.randn(b * sk // 64, 64, 1, 576, device="cuda", dtype=torch.bfloat16)
        table = torch.randperm(b * sk // 64, device="cuda").view(b, -1).to(torch.int32)
        lens = torch.full((b,), sk, dtype=torch.int32, device="cuda")
        meta, splits = flash_mla.get_mla_metadata(lens, sq * hq, 1)
        out = q.new_empty(b, sq, hq, 512)
        lse = torch.empty(b, hq, sq, device="cuda")
        flops = 2 * b * sq * sk * hq * (576 + 512)
        nbytes = (cache.numel() + q.numel() + out.numel()) * 2
        for tiles in configs:
            def run():
                mla_decode_forward(q[..., :512], q[..., 512:], cache[..., :512], cache[..., 512:], table, lens, meta,
                                   splits, out, lse, softmax_scale=576 ** -0.5, causal=sq > 1, tiles=tiles)
            try:
                t = bench_gpu_graph(run)
            except Exception as e:
                print(f"sk={sk} hq={hq} sq={sq} tiles={tiles}: FAILED {type(e).__name__}: {str(e)[:200]}", flush=True)
                continue
            rows.append(dict(b=b, sk=sk, hq=hq, sq=sq, tiles=tiles, tflops=flops / t / 1e12, gbps=nbytes / t / 1e9))
            print(f"sk={sk} hq={hq:<3} sq={sq} tiles={tiles}: {rows[-1]['tflops']:6.1f} TFLOP/s "
                  f"{rows[-1]['gbps']:6.0f} GB/s", flush=True)
    if args.out:
        save_sweep(args.out, rows)


if __name__ == "__main__":
    main()
