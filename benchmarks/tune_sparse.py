"""Sweep the MLA kernel's row-major tiles on the sparse FP8 decode rows of `fmha bench sparse` (the table
`kernels.mla_decode._GPU_TILES` is swapped per config; CUDA-graph timing, FLOPs over the selected tokens).

    PYTHONPATH=src python3 benchmarks/tune_sparse.py [--out tune_sparse.json]
"""
import argparse

import torch

import fmha.kernels.mla_decode as kernel
import fmha.mla as mla
from fmha.bench import SPARSE_DECODE_CASES, bench_gpu_graph, save_sweep, sparse_decode_inputs

CONFIGS = [(64, 64, 8, 2), (64, 32, 8, 2), (64, 32, 8, 3), (64, 64, 8, 1), (64, 16, 8, 3)]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=None)
    args = p.parse_args()
    rows = []
    g = torch.Generator(device="cuda").manual_seed(0)
    for case in SPARSE_DECODE_CASES[::2]:
        name, b, hq, sq, d, layout, topk, page, extra_topk, extra_page = case
        q, cache, lens, sink, kw = sparse_decode_inputs(case, g)
        meta, splits = mla.get_mla_metadata(lens, sq * hq, 1, num_heads_q=hq, topk=topk)
        flops = 2 * b * sq * hq * (topk + extra_topk) * (d + 512)
        for tiles in CONFIGS:
            kernel._GPU_TILES = tiles
            try:
                t = bench_gpu_graph(lambda: mla.flash_mla_with_kvcache(q, cache, None, lens, 512, meta, splits,
                                                                       attn_sink=sink, **kw))
            except Exception as e:
                print(f"{name} hq={hq} tiles={tiles}: FAILED {type(e).__name__}: {str(e)[:160]}", flush=True)
                continue
            rows.append(dict(case=name, b=b, hq=hq, tiles=tiles, tflops=flops / t / 1e12))
            print(f"{name} b={b} hq={hq} tiles={tiles}: {rows[-1]['tflops']:6.1f} TFLOP/s", flush=True)
        del cache, q, kw
        torch.cuda.empty_cache()
    if args.out:
        save_sweep(args.out, rows)


if __name__ == "__main__":
    main()
