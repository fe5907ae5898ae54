"""Host time per call of the prefill path, level by level, and where it goes (cProfile).

    PYTHONPATH=src python3 benchmarks/profile_host.py

Eager prefill of short sequences can be host-bound: a call that spends more host time than its kernel runs
leaves the GPU idle. Prints microseconds of host time per call (calls issued back to back, one
synchronisation at the end) for `fmha.attention`, for the Gluon launcher it reaches and for the bare kernel
launch, and the top entries of a profile of the first.
"""
import cProfile
import pstats
import time

import torch

import fmha
from fmha.kernels.forward_sm90 import attention_forward_sm90, attn_fwd_sm90_kernel, launch_args


def host_us(fn, n=300):
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    issue = (time.perf_counter() - t0) / n * 1e6
    torch.cuda.synchronize()
    return issue, (time.perf_counter() - t0) / n * 1e6


def main():
    b, s, h, d = 16, 1024, 8, 256
    q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    out = torch.empty_like(q)
    lse = torch.empty(b, h, s, device="cuda")
    grid, args, meta = launch_args(q, k, v, out, lse, causal=True, softmax_scale=d ** -0.5)
    levels = {
        "fmha.attention": lambda: fmha.attention(q, k, v, causal=True),
        "attention_forward_sm90": lambda: attention_forward_sm90(q, k, v, out, lse, causal=True,
                                                                 softmax_scale=d ** -0.5),
        "kernel launch only": lambda: attn_fwd_sm90_kernel[grid](*args, **meta),
    }
    for name, fn in levels.items():
        issue, total = host_us(fn)
        print(f"{name:24s} issue {issue:7.1f} us/call   issue + run {total:7.1f} us/call", flush=True)
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(200):
        levels["fmha.attention"]()
    prof.disable()
    torch.cuda.synchronize()
    pstats.Stats(prof).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
