"""One process: the package's decode with its own tiles, and the same with Triton's `maxnreg` capped (the
(16, 128, 4, 3) program needs 187-194 registers, which fits two programs an SM; at <= 168 three fit by
registers and by shared memory, 74 KB each), on cuDNN's contiguous cache's keys. CUDA graphs.

    PYTHONPATH=src python3 benchmarks/experiments/probe_maxnreg.py [--caps 168 160] [--out f.json]
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import fmha  # noqa: E402
from fmha.bench import bench_gpu_graph, paged_copy, quantize_fp8, save_sweep  # noqa: E402
from fmha.kernels import forward  # noqa: E402
from probe_decode import _case  # noqa: E402

CASES = [(64, 32, 8, 4096, 16), (64, 32, 8, 4096, 64), (64, 32, 8, 4096, None), (99, 32, 8, 4096, 64),
         (32, 32, 32, 8192, 64), (4, 32, 8, 131072, 64)]
_plan = forward._portable_plan
CAP = [None]


def _capped(*a, **kw):
    plan = _plan(*a, **kw)
    if CAP[0]:
        plan.meta = {**plan.meta, "maxnreg": CAP[0]}
        plan.fixed = (plan.fixed[0], tuple(plan.meta.items())) if plan.fixed else plan.fixed
    return plan


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--caps", type=int, nargs="*", default=[168, 160])
    p.add_argument("--fp8", action="store_true", help="e4m3 caches with descales (FP8 tables: 2-warp programs, "
                   "255 registers, four an SM); GB/s of the FP8 bytes, relative to the package's own")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    forward._portable_plan = _capped
    rows = []
    for b, hq, hk, sk, page in CASES:
        q, k, v, lens, nbytes, cudnn, ref, row = _case(b, hq, hk, sk, page)
        descales = {}
        if args.fp8:
            (k, descales["k_descale"]), (v, descales["v_descale"]) = quantize_fp8(k, hk), quantize_fp8(v, hk)
            nbytes //= 2
        kc, vc, table = (k, v, None) if page is None else paged_copy(page, k, v)
        call = lambda: fmha.attention_with_kvcache(q, kc, vc, lens, block_table=table, **descales)
        if args.fp8:
            ref = call().float()
        for r in range(args.rounds):
            for cap in [None, *args.caps]:
                CAP[0] = cap
                forward._PLANS.clear()
                name = f"cap{cap}" if cap else "ours"
                if r == 0:
                    row[f"{name}_maxdiff"] = (call().float() - ref).abs().max().item()
                row.setdefault(f"{name}_gbps", []).append(nbytes / bench_gpu_graph(call) / 1e9)
        CAP[0] = None
        forward._PLANS.clear()
        row["cudnn_gbps"].append(nbytes / bench_gpu_graph(cudnn) / 1e9)
        rows.append(row)
        best = max(row["ours_gbps"] if args.fp8 else row["cudnn_gbps"])
        cells = "  ".join(f"{n} {max(row[f'{n}_gbps']) / best:.3f}"
                          for n in ["ours", *(f"cap{c}" for c in args.caps)])
        print(f"b={b} hq={hq} hk={hk} sk={sk} page={page or '-'} | base {best:.0f} GB/s | / {'ours' if args.fp8 else 'cuDNN'}: {cells}",
              flush=True)
        del q, k, v, kc, vc
        torch.cuda.empty_cache()
    if args.out:
        save_sweep(args.out, rows)


if __name__ == "__main__":
    main()
