"""`attention_with_kvcache(..., cache_leftpad=)` (FlashAttention's left-padded batches) against the same call on a
cache whose sequences start at row 0 (each one's keys moved to the front, `cache_seqlens` less the padding), in one
process: the two read the same bytes and do the same math, so their ratio is what the padding costs.

    PYTHONPATH=src python3 benchmarks/probe_leftpad.py [--out leftpad.json]

Rows: decode (one query, b = 64, 32 / 8 heads, d = 128, splits as planned) and causal chunks of 64 and 512 rows
(b = 4; the Gluon kernel on Hopper), caches of 4096 / 16384 rows, each sequence padded by 0-1023 rows (random).
`ours-triton` is the leftpad call on the portable kernel (FMHA_GLUON's switch), for the chunks. Timed as CUDA-graph
replays (`bench_gpu_graph`); outputs compared first (`probe_row`).
"""
import argparse

import torch

import fmha
from fmha.bench import _without_gluon, attention_flops, bench_gpu_graph, probe_row, save_sweep


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=None)
    a = p.parse_args()
    rows = []
    hq, hk, d = 32, 8, 128
    for b, chunk, capacity in [(64, 1, 4096), (4, 64, 4096), (4, 512, 4096), (4, 64, 16384), (4, 512, 16384)]:
        g = torch.Generator().manual_seed(chunk)
        k, v = (torch.randn(b, capacity, hk, d, generator=g).to(torch.bfloat16).cuda() for _ in range(2))
        pad = torch.randint(0, 1024, (b,), generator=g, dtype=torch.int32)
        lens = torch.full((b,), capacity, dtype=torch.int32)
        k_front, v_front = torch.empty_like(k), torch.empty_like(v)
        for i, s in enumerate(pad.tolist()):
            k_front[i, :capacity - s], v_front[i, :capacity - s] = k[i, s:], v[i, s:]
        q = torch.randn(b, chunk, hq, d, generator=g).to(torch.bfloat16).cuda()
        pad, lens = pad.cuda(), lens.cuda()
        causal = chunk > 1

        def ours():
            return fmha.attention_with_kvcache(q, k, v, lens, cache_leftpad=pad, causal=causal)

        def shifted():
            return fmha.attention_with_kvcache(q, k_front, v_front, lens - pad, causal=causal)
        impls = {"ours": ours, "shifted": shifted}
        if chunk > 1:
            impls["ours-triton"] = _without_gluon(ours)
        keys = capacity - int(pad.float().mean())
        row = dict(b=b, chunk=chunk, capacity=capacity, mean_keys=keys)
        probe_row(rows, row, impls, attention_flops(b, chunk, keys, hq, d, d, causal=causal),
                  compare=list(impls)[1:], timer=bench_gpu_graph)
    if a.out:
        save_sweep(a.out, rows)


if __name__ == "__main__":
    main()
