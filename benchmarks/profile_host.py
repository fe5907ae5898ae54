"""Host time per call of the prefill path, level by level, and where it goes (cProfile).

    PYTHONPATH=src python3 benchmarks/profile_host.py [--shape B S H D]

Eager prefill of short sequences can be host-bound: a call that spends more host time than its kernel runs
leaves the GPU idle (the d = 256 and d = 128 1k causal rows of `fmha bench prefill` swung by a third between runs
that way: NOTES.md, thirty-ninth session). Prints microseconds of host time per call (calls issued back to back,
one synchronisation at the end) for `fmha.attention`, for the Gluon launcher it reaches, for building the launch
arguments alone and for the JIT's own launch of the kernel with them, causal and not, then the top entries of a
profile of the first. (The JIT launch is timed without a mask only: a causal launch's work counter is zeroed by
`launch_args`, so repeating one launch would find its items already taken.)
"""
import argparse
import cProfile
import pstats
import time

import torch

import fmha
from fmha.kernels.forward_sm90 import attention_forward_sm90, attn_fwd_sm90_kernel, launch_args


def host_us(fn, n=1000):
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    issue = (time.perf_counter() - t0) / n * 1e6
    torch.cuda.synchronize()
    return issue, (time.perf_counter() - t0) / n * 1e6


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--shape", type=int, nargs=4, default=[1, 128, 8, 256], metavar=("B", "S", "H", "D"),
                   help="a small call by default, so that the GPU is never what the host waits for")
    b, s, h, d = p.parse_args().shape
    q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    out = torch.empty_like(q)
    lse = torch.empty(b, h, s, device="cuda")
    for causal in (False, True):
        levels = {
            "fmha.attention": lambda: fmha.attention(q, k, v, causal=causal),
            "attention_forward_sm90": lambda: attention_forward_sm90(q, k, v, out, lse, causal=causal,
                                                                     softmax_scale=d ** -0.5),
            "launch_args alone": lambda: launch_args(q, k, v, out, lse, causal=causal, softmax_scale=d ** -0.5),
        }
        if not causal:
            grid, args, meta = launch_args(q, k, v, out, lse, causal=False, softmax_scale=d ** -0.5)
            levels["the JIT's launch alone"] = lambda: attn_fwd_sm90_kernel[grid](*args, **meta)
        for name, fn in levels.items():
            issue, total = host_us(fn)
            print(f"{'causal' if causal else 'full  '} {name:24s} issue {issue:7.1f} us/call   "
                  f"issue + run {total:7.1f} us/call", flush=True)
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(200):
        fmha.attention(q, k, v, causal=True)
    prof.disable()
    torch.cuda.synchronize()
    pstats.Stats(prof).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
