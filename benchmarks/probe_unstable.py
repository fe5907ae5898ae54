"""The prefill row that swings between processes: d = 256, 1k, causal has read 228-397 TFLOP/s in the records with an
unchanged kernel (`benchmarks/NOTES.md`, fifth, sixth, thirteenth and thirty-ninth sessions). Within one process,
allocate the same-shaped inputs again and again at other addresses (a spacer of another size kept alive before
each set) and time the Hopper kernel with ping-pong on (the launcher's choice at d = 256) and off, and cuDNN, on
each set: if the speed follows the addresses, some sets are slow here too. `api`: the same call through
`fmha.attention` (its host work per call included). `--host`: also run do_bench's own loop (clear L2, event, call,
event) for the direct call, the API call and cuDNN, and record per iteration the host's issue time (no
synchronisation inside the loop) beside the GPU's time for the clear and for the call: where the host's time exceeds
the two together, the GPU waits on the host and the timing measures the host.

    PYTHONPATH=src python3 benchmarks/probe_unstable.py [--trials 12] [--dims 256] [--seqs 1024] [--host]
        [--out probe.json]
"""
import argparse
import statistics
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import triton

import fmha
from fmha.bench import attention_flops, bench_gpu, save_sweep
from fmha.kernels.forward_sm90 import attention_forward_sm90


def host_and_gpu_us(fn, n=200):
    """do_bench's timed loop, n iterations: (host us an iteration, GPU us of the L2 clear, GPU us of the call),
    medians of the events for the GPU."""
    driver = triton.runtime.driver.active
    cache = driver.get_empty_cache_for_benchmark()
    marks = [[torch.cuda.Event(enable_timing=True) for _ in range(3)] for _ in range(n)]
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for before, start, end in marks:
        before.record()
        driver.clear_cache(cache)
        start.record()
        fn()
        end.record()
    host = (time.perf_counter() - t0) / n * 1e6
    torch.cuda.synchronize()
    clear = statistics.median(b.elapsed_time(s) for b, s, _ in marks) * 1e3
    call = statistics.median(s.elapsed_time(e) for _, s, e in marks) * 1e3
    return host, clear, call


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--trials", type=int, default=12)
    p.add_argument("--dims", type=int, nargs="*", default=[256])
    p.add_argument("--seqs", type=int, nargs="*", default=[1024])
    p.add_argument("--host", action="store_true", help="host and GPU time an iteration of do_bench's loop")
    p.add_argument("--out")
    args = p.parse_args()
    rows = []
    keep = []                     # every trial's spacer and inputs stay allocated, so the next set lands elsewhere
    gen = torch.Generator().manual_seed(0)
    for d in args.dims:
        for s in args.seqs:
            b, h = 16384 // s, 2048 // d
            flops = attention_flops(b, s, s, h, d, d, causal=True)
            for trial in range(args.trials):
                spacer = torch.empty(int(torch.randint(1, 64, (1,), generator=gen)) << 20, dtype=torch.uint8,
                                     device="cuda")
                q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
                out = torch.empty_like(q)
                lse = torch.empty(b, h, s, device="cuda")
                keep += [spacer, q, k, v, out, lse]
                qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    ref = F.scaled_dot_product_attention(qt, kt, vt, is_causal=True).transpose(1, 2)
                row = dict(d=d, s=s, trial=trial, q_mod_2m=q.data_ptr() % (2 << 20), k_mod_2m=k.data_ptr() % (2 << 20))

                def direct(pingpong):
                    return lambda: attention_forward_sm90(q, k, v, out, lse, causal=True, softmax_scale=d ** -0.5,
                                                          pingpong=pingpong)
                for name, pingpong in (("pingpong", True), ("no_pingpong", False)):
                    run = direct(pingpong)
                    run()
                    err = (out.float() - ref.float()).abs().max().item()
                    if not err < 0.05:
                        raise RuntimeError(f"{name}: disagrees with cuDNN by {err}")
                    row[name] = flops / bench_gpu(run) / 1e12
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    row["cudnn"] = flops / bench_gpu(lambda: F.scaled_dot_product_attention(qt, kt, vt,
                                                                                              is_causal=True)) / 1e12
                # the public call (allocates out / lse, checks, builds the descriptors: host time per call)
                row["api"] = flops / bench_gpu(lambda: fmha.attention(q, k, v, causal=True)) / 1e12
                # the first variant again: a slow set stays slow, a slow moment does not
                row["pingpong_again"] = flops / bench_gpu(direct(True)) / 1e12
                if args.host:
                    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                        cudnn_us = host_and_gpu_us(lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=True))
                    for name, us in (("direct", host_and_gpu_us(direct(True))), ("cudnn", cudnn_us),
                                     ("api", host_and_gpu_us(lambda: fmha.attention(q, k, v, causal=True)))):
                        row.update({f"{name}_{part}_us": x for part, x in zip(("host", "clear", "call"), us)})
                rows.append(row)
                print(" ".join(f"{key} {val:.1f}" if isinstance(val, float) else f"{key} {val}"
                               for key, val in row.items()), flush=True)
    if args.out:
        save_sweep(args.out, rows)


if __name__ == "__main__":
    main()
