"""The prefill row that swings between processes: d = 256, 1k, causal has read 228-397 TFLOP/s in the records with an
unchanged kernel (`benchmarks/NOTES.md`, fifth, sixth, thirteenth and thirty-ninth sessions). Within one process,
allocate the same-shaped inputs again and again at other addresses (a spacer of another size kept alive before
each set) and time the Hopper kernel with ping-pong on (the launcher's choice at d = 256) and off, and cuDNN, on
each set: if the speed follows the addresses, some sets are slow here too. `api`: the same call through
`fmha.attention` (its host work per call included).

    PYTHONPATH=src python3 benchmarks/probe_unstable.py [--trials 12] [--dims 256] [--seqs 1024] [--out probe.json]
"""
import argparse

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import fmha
from fmha.bench import attention_flops, bench_gpu, save_sweep
from fmha.kernels.forward_sm90 import attention_forward_sm90


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--trials", type=int, default=12)
    p.add_argument("--dims", type=int, nargs="*", default=[256])
    p.add_argument("--seqs", type=int, nargs="*", default=[1024])
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
                rows.append(row)
                print(" ".join(f"{key} {val:.1f}" if isinstance(val, float) else f"{key} {val}"
                               for key, val in row.items()), flush=True)
    if args.out:
        save_sweep(args.out, rows)


if __name__ == "__main__":
    main()
