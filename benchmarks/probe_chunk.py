"""Causal head-chunk probe for the Gluon prefill kernel: each forced chunk size, timed two ways.

    PYTHONPATH=src python3 benchmarks/probe_chunk.py [--out probe.json]

`do_bench` (L2 flushed between calls, median) against 200 calls issued back to back (one synchronisation),
which is how consecutive layers run. `(auto)` marks the chunk `_head_chunk` picks.
"""
import argparse
import time

import torch
import triton.testing

from fmha.bench import save_sweep
from fmha.kernels.forward_sm90 import attention_forward_sm90, launch_args


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=None)
    p.add_argument("--seqs", type=int, nargs="*", default=[1024])
    p.add_argument("--dims", type=int, nargs="*", default=[256, 128])
    args = p.parse_args()
    rows = []
    for s, d in [(s, d) for s in args.seqs for d in args.dims]:
        b, h = 16384 // s, 2048 // d
        q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        out = torch.empty_like(q)
        lse = torch.empty(b, h, s, device="cuda")
        flops = 4 * b * h * s * s * d / 2
        auto = launch_args(q, k, v, out, lse, causal=True, softmax_scale=0.1)[1][10]
        for chunk in sorted({c for c in (1, 2, 3, 4, 6, 8, 16, 24, 48) if c < b * h} | {b * h}):
            def fn():
                attention_forward_sm90(q, k, v, out, lse, causal=True, softmax_scale=0.1, chunk=chunk)
            t_bench = triton.testing.do_bench(fn, warmup=20, rep=100, return_mode="median") / 1e3
            for _ in range(10):
                fn()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(200):
                fn()
            torch.cuda.synchronize()
            t_b2b = (time.perf_counter() - t0) / 200
            row = dict(b=b, s=s, h=h, d=d, chunk=chunk, auto=chunk == auto, do_bench_tflops=flops / t_bench / 1e12,
                       back_to_back_tflops=flops / t_b2b / 1e12)
            rows.append(row)
            print(f"d={d} h={h} chunk={chunk:<4}{'(auto)' if chunk == auto else '      '} "
                  f"do_bench {row['do_bench_tflops']:6.1f} TFLOP/s  back-to-back {row['back_to_back_tflops']:6.1f}",
                  flush=True)
    if args.out:
        save_sweep(args.out, rows)


if __name__ == "__main__":
    main()
