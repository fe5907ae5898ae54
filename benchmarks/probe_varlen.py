"""Packed (varlen) prefill against the same sequences padded, in one process.

    PYTHONPATH=src python3 benchmarks/probe_varlen.py [--dims 64 128 192 256] [--versions A.py ..] [--fp8]
        [--graph] [--group 4] [--layouts mixed ragged] [--out varlen.json]

Engines call prefill through varlen entry points (`flash_attn_varlen_func`), so `attention_varlen` is what they
reach. For each head dim, sequence length (1k, 4k) and mask (`--group`: GQA, that many query heads a KV head): 16k
tokens as b equal sequences, timed as `fmha.attention` on (b, s, h, d), as `fmha.attention_varlen` on the same rows
packed, and as the portable kernel on the packed rows (`backend="triton"`, what varlen calls ran before they
reached the Gluon kernel); then a mixed batch of unequal lengths and 48 short ones of 65-599 rows (`ragged`), packed
(no padded peer). TFLOP/s count each sequence's own visible pairs. Each packed output is checked against the
padded one (or, for the mixed and ragged batches, against the portable kernel's).
`--versions` adds other copies of `kernels/forward_sm90.py` (e.g. from an earlier commit) on the same packed rows,
as "varlen@<file>"; then every entry is timed twice, in the order A B .. B A, and the two averaged, so that a
drift of the clocks within the process weighs on all alike. `--fp8`: q, k and v in e4m3 (the same values in bf16
give the reference, our bf16 path, within the FP8 bound of `fmha bench prefill --dtype fp8`), no portable entry.
`--graph`: each call replayed from a CUDA graph (`bench_gpu_graph`), the host's time per call left out; without
it, eager calls as `fmha bench` times them, where a call that spends more host time than its kernels shows.
"""
import argparse
import os

import torch

import fmha
from fmha.bench import (PREFILL_VALUE_DIMS, add_probe_row, attention_flops, bench_gpu, bench_gpu_graph,
                         load_module_copy, save_sweep)
from fmha.kernels.forward import attention_forward


def portable(q, k, v, cu_q, cu_k, max_q, max_k, causal):
    out = q.new_empty((*q.shape[:2], v.shape[-1]))
    lse = torch.empty(q.shape[1], q.shape[0], dtype=torch.float32, device=q.device)

    def call():
        attention_forward(q, k, v, out, lse, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=max_q,
                          max_seqlen_k=max_k, softmax_scale=None, window=(-1, 0 if causal else -1), softcap=0.0,
                          alibi_slopes=None, sinks=None, backend="triton")
        return out
    return call


def version_call(module, q, k, v, cu, max_len, causal):
    fp8 = q.dtype == torch.float8_e4m3fn                # FP8 inputs give a bf16 output
    out = q.new_empty((*q.shape[:2], v.shape[-1]), dtype=torch.bfloat16 if fp8 else q.dtype)
    lse = torch.empty(q.shape[1], q.shape[0], dtype=torch.float32, device=q.device)

    def call():
        module.attention_forward_sm90(q, k, v, out, lse, causal=causal, softmax_scale=q.shape[-1] ** -0.5,
                                      varlen=(cu, cu, max_len, max_len))
        return out
    return call


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dims", type=int, nargs="*", default=[64, 128, 192, 256])
    p.add_argument("--versions", nargs="*", default=[])
    p.add_argument("--fp8", action="store_true")
    p.add_argument("--graph", action="store_true")
    p.add_argument("--group", type=int, default=1, help="query heads a KV head (GQA; 1: MHA)")
    p.add_argument("--layouts", nargs="*", default=None, help="layouts to run (all by default): 16x1024 4x4096 "
                   "mixed ragged")
    p.add_argument("--out", default=None)
    a = p.parse_args()
    versions = [(os.path.basename(path), load_module_copy(path)) for path in a.versions]
    rows = []
    for d in a.dims:
        dv = PREFILL_VALUE_DIMS.get(d, d)
        h = 2048 // d
        layouts = [(f"{16384 // s}x{s}", [s] * (16384 // s)) for s in (1024, 4096)]
        layouts.append(("mixed", [3000, 512, 1700, 64, 4096, 900, 2300, 128, 1500, 2184]))
        # many short sequences, most of them ending in a row block of at most 64 rows
        ragged = torch.randint(65, 600, (48,), generator=torch.Generator().manual_seed(1))
        layouts.append(("ragged", ragged.tolist()))
        for name, lens in layouts:
            if a.layouts is not None and name not in a.layouts:
                continue
            torch.manual_seed(0)
            total = sum(lens)
            q = torch.randn(total, h, d, device="cuda", dtype=torch.bfloat16)
            k = torch.randn(total, h // a.group, d, device="cuda", dtype=torch.bfloat16)
            v = torch.randn(total, h // a.group, dv, device="cuda", dtype=torch.bfloat16)
            if a.fp8:
                q8, k8, v8 = (t.to(torch.float8_e4m3fn) for t in (q, k, v))
                q, k, v = (t.to(torch.bfloat16) for t in (q8, k8, v8))
            cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
            for causal in (False, True):
                flops = sum(attention_flops(1, n, n, h, d, dv, causal=causal) for n in lens)
                if a.fp8:
                    impls = {"varlen": lambda: fmha.attention_varlen(q8, k8, v8, cu, cu, max(lens), max(lens),
                                                                     causal=causal),
                             "varlen-bf16": lambda: fmha.attention_varlen(q, k, v, cu, cu, max(lens), max(lens),
                                                                          causal=causal)}
                    for vname, module in versions:
                        impls[f"varlen@{vname}"] = version_call(module, q8, k8, v8, cu, max(lens), causal)
                    reference, tol = "varlen-bf16", 0.05 + 2.0 ** -3 * v.abs().max().item()
                else:
                    impls = {"varlen": lambda: fmha.attention_varlen(q, k, v, cu, cu, max(lens), max(lens),
                                                                     causal=causal),
                             "varlen-triton": portable(q, k, v, cu, cu, max(lens), max(lens), causal)}
                    reference, tol = "varlen-triton", 0.05
                    for vname, module in versions:
                        impls[f"varlen@{vname}"] = version_call(module, q, k, v, cu, max(lens), causal)
                if name not in ("mixed", "ragged") and not a.fp8:
                    b, s = len(lens), lens[0]
                    qb, kb, vb = (t.view(b, s, *t.shape[1:]) for t in (q, k, v))
                    impls["padded"] = lambda: fmha.attention(qb, kb, vb, causal=causal).view(total, h, dv)
                    reference = "padded"
                ref = impls[reference]().float()
                err = max((impls[n]().float() - ref).abs().max().item() for n in impls if n.startswith("varlen"))
                if not err < tol:
                    raise RuntimeError(f"d={d} {name} causal={causal}: varlen disagrees (max abs diff {err})")
                row = dict(d=d, dv=dv, layout=name, causal=causal, h=h, hk=h // a.group, max_err=err, graph=a.graph)
                order = list(impls) + (list(impls)[::-1] if versions else [])
                times = {}
                for impl in order:
                    times.setdefault(impl, []).append((bench_gpu_graph if a.graph else bench_gpu)(impls[impl]))
                for impl, ts in times.items():
                    row[f"{impl}_tflops"] = flops / (sum(ts) / len(ts)) / 1e12
                add_probe_row(rows, row, "varlen", impls)
                if a.out:             # after every row: a run cut by the device call's limit keeps what it timed
                    save_sweep(a.out, rows)


if __name__ == "__main__":
    main()
