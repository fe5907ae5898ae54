"""Sweep the split count of attention_with_kvcache on the GPU (decode, d=128, page 64), CUDA-graph timing.

    PYTHONPATH=src python3 benchmarks/sweep_splits.py [--out sweep_splits.json]

GB/s counts K + V read once + Q + O; compare with the copy bandwidth `fmha bench decode` measures.
"""
import argparse

import torch

import fmha
from fmha.bench import bench_gpu_graph, save_sweep

CASES = [(1, 32, 8, 131072, 64), (4, 32, 8, 131072, 64), (64, 32, 8, 4096, 64), (32, 32, 32, 8192, 64)]
SPLITS = [0, 1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=None)
    args = p.parse_args()
    rows, d = [], 128
    for b, hq, hk, sk, page in CASES:
        q = torch.randn(b, 1, hq, d, device="cuda", dtype=torch.bfloat16)
        kc = torch.randn(b * sk // page, page, hk, d, device="cuda", dtype=torch.bfloat16)
        vc = torch.randn_like(kc)
        table = torch.randperm(b * sk // page, device="cuda").view(b, -1).to(torch.int32)
        lens = torch.full((b,), sk, dtype=torch.int32, device="cuda")
        out = torch.empty_like(q)
        nbytes = (2 * kc.numel() + 2 * q.numel()) * 2
        for splits in SPLITS:
            if splits * 64 > sk:
                continue
            t = bench_gpu_graph(lambda: fmha.attention_with_kvcache(q, kc, vc, lens, block_table=table,
                                                                    num_splits=splits, out=out))
            rows.append(dict(b=b, hq=hq, hk=hk, sk=sk, page=page, splits=splits, gbps=nbytes / t / 1e9))
            print(f"b={b:<3} hq={hq} hk={hk} sk={sk:<6} splits={splits:<3} ({'auto' if splits == 0 else 'forced'}): "
                  f"{rows[-1]['gbps']:7.1f} GB/s", flush=True)
        del kc, vc
        torch.cuda.empty_cache()
    if args.out:
        save_sweep(args.out, rows)


if __name__ == "__main__":
    main()
