"""Same 64 packed rows, other packings: does a decode tile read a cache as fast whether its rows are 64 query
heads of one token or 4 heads of 16 tokens? (The ninety-second session saw (64, 64, 4, 3) at d = 64 read 2650 GB/s
for one token of 512 heads over 8 and ~3550 for 16 tokens of 32 heads over 8, paged, b = 64, 4k keys.)
One process, CUDA-graph timing, GB/s of K + V + Q + O bytes; prints each row and writes them as JSON to argv[1]
(the first run, history/probe_gp_shape_h200_b0476d1.json, recorded only the GPU: date 2026-11-30, commit b0476d1)."""
import sys

import torch

import fmha
from fmha.bench import bench_gpu_graph, paged_copy, save_sweep
from fmha.kernels import forward

B, HK, SK, PAGE = 64, 8, 4096, 64
rows = []
for d in (64, 128):
    torch.manual_seed(0)
    k = torch.randn(B, SK, HK, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(B, SK, HK, d, device="cuda", dtype=torch.bfloat16)
    perm = torch.randperm(B * (SK // PAGE), device="cuda")
    kc, vc, table = paged_copy(PAGE, k, v, perm=perm)
    lens = torch.full((B,), SK, dtype=torch.int32, device="cuda")
    for sq, hq in ((1, 512), (2, 256), (4, 128), (8, 64), (16, 32)):
        q = torch.randn(B, sq, hq, d, device="cuda", dtype=torch.bfloat16)
        nbytes = (2 * k.numel() + 2 * q.numel()) * 2
        for paged in (False, True):
            for tiles in (None, (64, 128, 4, 3)):
                tables = (forward._GPU_DECODE_TILES, forward._GPU_PAGED_DECODE_TILES)
                saved = [dict(t) for t in tables]
                if tiles:
                    for t in tables:
                        t[d] = tiles
                try:
                    call = (lambda: fmha.attention_with_kvcache(q, kc, vc, lens, block_table=table)) if paged else \
                        (lambda: fmha.attention_with_kvcache(q, k, v, lens))
                    call()
                    gbps = [nbytes / bench_gpu_graph(call) / 1e9 for _ in range(2)]
                finally:
                    for t, old in zip(tables, saved):
                        t.clear()
                        t.update(old)
                row = dict(d=d, sq=sq, hq=hq, paged=paged, tiles=tiles or "default", gbps=gbps)
                rows.append(row)
                print(row, flush=True)
save_sweep(sys.argv[1], rows)       # with the GPU, date and commit (set FMHA_COMMIT on the device)
