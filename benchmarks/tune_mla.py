"""Sweep the MLA decode kernel's tiles (BLOCK_M, BLOCK_N, num_warps, num_stages) on the GPU, FlashMLA's shapes.

    PYTHONPATH=src python3 benchmarks/tune_mla.py [--out tune_mla.json]

TFLOP/s = 2 * s_q * s_k * h_q * (576 + 512) per batch; GB/s = the cache read once + Q + O.
"""
import argparse

import torch

import fmha.mla as flash_mla
from fmha.bench import bench_gpu_graph, save_sweep
from fmha.kernels.mla_decode import mla_decode_forward

CASES = [(128, 8192, 128, 1), (128, 8192, 16, 1), (128, 8192, 32, 1), (128, 8192, 64, 1)]
# (BLOCK_M, BLOCK_N, num_warps, num_stages, transposed), tried where BLOCK_M fits the case's packed rows.
CONFIGS = [(64, 64, 8, 2, False), (64, 32, 8, 3, False), (32, 64, 4, 2, True), (32, 32, 4, 3, True),
           (16, 64, 4, 2, True), (16, 64, 4, 3, True), (16, 32, 4, 3, True)]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=None)
    p.add_argument("--configs", default=None, help="e.g. '64,64,8,2,0;16,64,4,2,1'")
    args = p.parse_args()
    configs = CONFIGS
    if args.configs:
        configs = [(*map(int, c.split(",")[:4]), bool(int(c.split(",")[4]))) for c in args.configs.split(";")]
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
            if tiles[0] > max(16, sq * hq) or (tiles[0] < 32 and sq * hq > 32):
                continue
            def run():
                return mla_decode_forward(q[..., :512], q[..., 512:], cache[..., :512], cache[..., 512:], table, lens, meta,
                                   splits, out, lse, softmax_scale=576 ** -0.5, causal=sq > 1, tiles=tiles)
            try:
                kernel = run()
                regs, spills = kernel.n_regs, kernel.n_spills
                t = bench_gpu_graph(run)
            except Exception as e:
                print(f"sk={sk} hq={hq} sq={sq} tiles={tiles}: FAILED {type(e).__name__}: {str(e)[:200]}", flush=True)
                continue
            rows.append(dict(b=b, sk=sk, hq=hq, sq=sq, tiles=tiles, tflops=flops / t / 1e12, gbps=nbytes / t / 1e9,
                             regs=regs, spills=spills))
            print(f"sk={sk} hq={hq:<3} sq={sq} tiles={tiles}: {rows[-1]['tflops']:6.1f} TFLOP/s "
                  f"{rows[-1]['gbps']:6.0f} GB/s  regs {regs} spills {spills}", flush=True)
    if args.out:
        save_sweep(args.out, rows)


if __name__ == "__main__":
    main()
