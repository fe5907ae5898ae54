"""Quick A/B of the MLA decode paths on a few compute-bound shapes (one process, same inputs): the Gluon kernel
(`fmha.mla`) against the portable `triton.language` one. For tuning; `fmha bench mla` is the record."""
import sys

import torch

import fmha.mla as ours_mla
from fmha.bench import _portable_mla, attention_flops, bench_gpu_graph, paged_copy

CASES = [(128, 8192, 128, 1), (128, 8192, 32, 1), (128, 8192, 16, 2), (128, 8192, 16, 1)]


def main():
    cases = CASES[: int(sys.argv[1])] if len(sys.argv) > 1 else CASES
    for b, sk, hq, sq in cases:
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
        print(f"b={b} sk={sk} hq={hq} sq={sq}: gluon {flops / tg / 1e12:6.1f} TFLOP/s, triton "
              f"{flops / tt / 1e12:6.1f} TFLOP/s, gluon/triton {tt / tg:.2f}, max diff {err:.2e}", flush=True)
        del q, kv, cache


if __name__ == "__main__":
    main()
