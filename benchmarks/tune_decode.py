"""Sweep decode through the KV-cache path on the GPU: tile configs (`--tiles`, the default) or the split count
(`--splits`, through the public API with CUDA-graph timing, as serving runs decode).

    PYTHONPATH=src python3 benchmarks/tune_decode.py [--splits] [--out tune_decode.json]

GB/s counts K + V read once + Q + O; compare with the copy bandwidth `fmha bench decode` measures.
"""
import argparse

import torch

import fmha
from fmha.bench import bench_gpu, bench_gpu_graph, save_sweep
from fmha.kernels.forward import attention_forward
from fmha.schedule import num_sms, plan_num_splits

TILE_CASES = [(64, 32, 8, 4096, 16), (1, 32, 8, 131072, 64), (32, 32, 32, 8192, 64)]
TILE_CONFIGS = [(64, 128, 4, 3), (64, 64, 4, 4), (64, 128, 4, 4), (64, 256, 8, 2), (64, 64, 4, 2), (128, 128, 8, 3)]
SPLIT_CASES = [(1, 32, 8, 131072, 64), (4, 32, 8, 131072, 64), (64, 32, 8, 4096, 64), (32, 32, 32, 8192, 64)]
SPLITS = [0, 1, 2, 4, 8, 9, 16, 24, 32, 33, 48, 64, 96, 128, 256]       # 0 = the planner's choice
D = 128


def _inputs(b, hq, hk, sk, page):
    q = torch.randn(b, 1, hq, D, device="cuda", dtype=torch.bfloat16)
    kc = torch.randn(b * sk // page, page, hk, D, device="cuda", dtype=torch.bfloat16)
    vc = torch.randn_like(kc)
    table = torch.randperm(b * sk // page, device="cuda").view(b, -1).to(torch.int32)
    lens = torch.full((b,), sk, dtype=torch.int32, device="cuda")
    return q, kc, vc, table, lens, (2 * kc.numel() + 2 * q.numel()) * 2


def sweep_tiles(rows):
    for b, hq, hk, sk, page in TILE_CASES:
        q, kc, vc, table, lens, nbytes = _inputs(b, hq, hk, sk, page)
        out, lse = torch.empty_like(q), torch.empty(b, hq, 1, device="cuda")
        for tiles in TILE_CONFIGS:
            gp = hq // hk
            programs = b * (hq // gp) * -(-gp // tiles[0])
            for splits in sorted({plan_num_splits(programs, sk, tiles[1], num_sms(q.device), tiles[2]), 1}):
                def run():
                    attention_forward(q, kc, vc, out, lse, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=1,
                                      max_seqlen_k=sk, softmax_scale=None, window=(-1, -1), softcap=0.0,
                                      alibi_slopes=None, sinks=None, cache_seqlens=lens, block_table=table,
                                      num_splits=splits, pack_gqa=True, tiles=tiles)
                try:
                    t = bench_gpu(run)
                except Exception as e:
                    print(f"b={b} sk={sk} tiles={tiles} splits={splits}: FAILED {type(e).__name__}", flush=True)
                    continue
                rows.append(dict(b=b, hq=hq, hk=hk, sk=sk, page=page, tiles=tiles, splits=splits, gbps=nbytes / t / 1e9))
                print(f"b={b:<3} hq={hq} hk={hk} sk={sk:<6} page={page:<3} tiles={tiles} splits={splits:<3}: "
                      f"{rows[-1]['gbps']:7.1f} GB/s", flush=True)


def sweep_splits(rows):
    for b, hq, hk, sk, page in SPLIT_CASES:
        q, kc, vc, table, lens, nbytes = _inputs(b, hq, hk, sk, page)
        out = torch.empty_like(q)
        for splits in SPLITS:
            if splits * 64 > sk:
                continue
            t = bench_gpu_graph(lambda: fmha.attention_with_kvcache(q, kc, vc, lens, block_table=table,
                                                                    num_splits=splits, out=out))
            rows.append(dict(b=b, hq=hq, hk=hk, sk=sk, page=page, splits=splits, gbps=nbytes / t / 1e9))
            print(f"b={b:<3} hq={hq} hk={hk} sk={sk:<6} splits={splits:<3} ({'auto' if splits == 0 else 'forced'}): "
                  f"{rows[-1]['gbps']:7.1f} GB/s", flush=True)
        del q, kc, vc
        torch.cuda.empty_cache()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--splits", action="store_true", help="sweep the split count instead of the tiles")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    rows = []
    (sweep_splits if args.splits else sweep_tiles)(rows)
    if args.out:
        save_sweep(args.out, rows)


if __name__ == "__main__":
    main()
