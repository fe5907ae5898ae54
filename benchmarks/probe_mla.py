"""Quick A/B of the MLA decode paths on a few shapes (one process, same inputs): the Gluon kernel (`fmha.mla`)
against the portable `triton.language` one. For tuning; `fmha bench mla` is the record.

    PYTHONPATH=src python3 benchmarks/probe_mla.py [N] [--out probe.json]     # the first N cases
"""
import argparse

import torch

import fmha.mla as ours_mla
from fmha.bench import _portable_mla, attention_flops, bench_gpu_graph, paged_copy, save_sweep

CASES = [(128, 8192, 128, 1), (128, 8192, 32, 1), (128, 8192, 16, 2), (128, 8192, 16, 1)]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("n", nargs="?", type=int, default=len(CASES))
    p.add_argument("--out", default=None, help="also write the rows as JSON (GPU, date, commit recorded)")
    args = p.parse_args()
    rows = []
    for b, sk, hq, sq in CASES[: args.n]:
        torch.manual_seed(0)
        q = torch.randn(b, sq, hq, 576, device="cuda", dtype=torch.bfloat16)
        kv = torch.randn(b, sk, 1, 576, device="cuda", dtype=torch.bfloat16)
        cache, table = paged_copy(64, kv)
        lens = torch.full((b,), sk, dtype=torch.int32, device="cuda")
        meta, splits = ours_mla.get_mla_metadata(lens, sq * hq, 1)
        gluon = lambda: ours_mla.flash_mla_with_kvcache(q, cache, table, lens, 512, meta, splits, causal=sq > 1)
        triton_ = _portable_mla(q, cache, table, lens, meta, splits, causal=sq > 1)
        err = (gluon()[0].float() - triton_().float()).abs().max().item()
        flops = attention_flops(b, sq, sk, hq, 576, 512, causal=sq > 1)
        tg, tt = bench_gpu_graph(gluon), bench_gpu_graph(triton_)
        rows.append(dict(b=b, sk=sk, hq=hq, sq=sq, gluon_tflops=flops / tg / 1e12, triton_tflops=flops / tt / 1e12,
                         max_diff=err))
        print(f"b={b} sk={sk} hq={hq} sq={sq}: gluon {flops / tg / 1e12:6.1f} TFLOP/s, triton "
              f"{flops / tt / 1e12:6.1f} TFLOP/s, gluon/triton {tt / tg:.2f}, max diff {err:.2e}", flush=True)
        del q, kv, cache
    if args.out:
        save_sweep(args.out, rows)


if __name__ == "__main__":
    main()
