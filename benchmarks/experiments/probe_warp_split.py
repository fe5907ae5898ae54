"""One process: cuDNN on the contiguous cache, `fmha.attention_with_kvcache` (the package's tiles) and the
warp-split experiment's variants (W, BN, M, warps, stages) on the same paged / contiguous caches, CUDA graphs.

    PYTHONPATH=src python3 benchmarks/experiments/probe_warp_split.py [--variants 4,16,16,4,5 ...] [--out f.json]
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import warp_split  # noqa: E402
import fmha  # noqa: E402
from fmha.bench import bench_gpu_graph, paged_copy, save_sweep  # noqa: E402
from probe_decode import _case  # noqa: E402

CASES = [(64, 32, 8, 4096, 16), (64, 32, 8, 4096, 64), (64, 32, 8, 4096, None), (132, 32, 8, 4096, 64)]
VARIANTS = ["4,32,16,4,3", "4,16,16,4,5", "4,16,16,4,4", "4,16,16,4,6", "2,32,16,2,4", "2,16,16,2,6",
            "8,16,16,8,3"]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--variants", nargs="*", default=VARIANTS)
    p.add_argument("--cases", type=int, nargs="*", default=None, help="indices into CASES")
    p.add_argument("--fp8", action="store_true", help="e4m3 caches (descales 1); GB/s of the FP8 bytes, and the "
                   "package's FP8 output as the reference")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    variants = [tuple(int(x) for x in v.split(",")) for v in args.variants]
    rows = []
    for i, (b, hq, hk, sk, page) in enumerate(CASES):
        if args.cases is not None and i not in args.cases:
            continue
        q, k, v, lens, nbytes, cudnn, ref, row = _case(b, hq, hk, sk, page)
        if args.fp8:
            k, v = k.to(torch.float8_e4m3fn), v.to(torch.float8_e4m3fn)
            nbytes //= 2
        kc, vc, table = (k, v, None) if page is None else paged_copy(page, k, v)
        if args.fp8:
            ref = fmha.attention_with_kvcache(q, kc, vc, lens, block_table=table).float()
            row["cudnn_gbps"] = []                     # cuDNN ran on the bf16 cache: not this row's bytes
        calls = {"ours": lambda: fmha.attention_with_kvcache(q, kc, vc, lens, block_table=table)}
        for W, BN, M, warps, stages in variants:
            calls["x".join(map(str, (W, BN, M, warps, stages)))] = (
                lambda W=W, BN=BN, M=M, warps=warps, stages=stages: warp_split.launch(
                    q, kc, vc, lens, table, W=W, BN=BN, M=M, num_warps=warps, num_stages=stages))
        for r in range(args.rounds):
            for name, call in calls.items():
                try:
                    if r == 0:
                        row[f"{name}_maxdiff"] = (call().float() - ref).abs().max().item()
                    row.setdefault(f"{name}_gbps", []).append(nbytes / bench_gpu_graph(call) / 1e9)
                except Exception as e:  # noqa: BLE001 (a variant that does not fit)
                    row[f"{name}_error"] = str(e).splitlines()[0][:200]
                    row.setdefault(f"{name}_gbps", []).append(0.0)
        row["cudnn_gbps"].append(nbytes / bench_gpu_graph(cudnn) / 1e9)
        rows.append(row)
        best = max(row["ours_gbps"]) if args.fp8 else max(row["cudnn_gbps"])
        cells = "  ".join(f"{n} {max(row[f'{n}_gbps']) / best:.3f}({row.get(f'{n}_maxdiff', -1):.0e})"
                          for n in calls)
        print(f"b={b} hq={hq} hk={hk} sk={sk} page={page or '-'} | base {best:.0f} GB/s | / {'ours' if args.fp8 else 'cuDNN'}: {cells}",
              flush=True)
        del q, k, v, kc, vc
        torch.cuda.empty_cache()
    if args.out:
        save_sweep(args.out, rows)


if __name__ == "__main__":
    main()
