"""Chunked prefill over a KV cache (`attention_with_kvcache` with a chunk of new queries, causal): the Gluon kernel
against the portable kernel that ran every KV-cache call before, and against the FlashAttention-2 backend of torch
SDPA (bottom-right causal, `causal_lower_right`) on the same keys as one contiguous tensor, in one process.

    PYTHONPATH=src python3 benchmarks/probe_kvcache.py [--dims 128] [--chunks 64 ...] [--contexts 4096 ...]
        [--batch 4] [--pages 0 16] [--versions A.py ...] [--out kvcache.json]

Each row: b sequences whose caches hold `context` keys, the last `chunk` of them the chunk's own (the queries are
the last `chunk` positions), a Llama-3-8B-style layer (32 query heads over 8 at d = 128; 16 over 4 at other
dims). `page` 0 is a contiguous cache, else shuffled pages of that size (`bench.paged_copy`). TFLOP/s count the
pairs the causal mask lets through, every impl timed as CUDA-graph replays (a chunk of 64-128 rows runs for tens
of microseconds, less than the host's time for a call: timed eagerly, the same call swung 2x between rows).
`ours-unsplit` forces one split (the Gluon kernel from GLUON_CACHE_MIN_ROWS rows, where `ours` may take the
portable split path on too few work items). The peer has no cache: its keys are the contiguous tensor, its row a
ceiling on what a paged read could cost it. `--versions` adds rows of other copies of `kernels/forward_sm90.py`
(e.g. `git show REV:src/fmha/kernels/forward_sm90.py > base.py`), each launched unsplit as `ours-unsplit` is, named
after the file: an A/B in one process.
"""
import argparse
import os

import torch

import fmha
from fmha.bench import (_without_gluon, attention_flops, bench_gpu_graph, load_module_copy, paged_copy, probe_row,
                         save_sweep)


def fa2_call(q, k, v):
    """torch SDPA's FlashAttention-2 backend, bottom-right causal; GQA through enable_gqa."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.bias import causal_lower_right
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
    mask = causal_lower_right(q.shape[1], k.shape[1])

    def call():
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask,
                                                                    enable_gqa=True).transpose(1, 2)
    return call


def gluon_version(module, q, k_cache, v_cache, lens, table):
    """`module`'s Gluon kernel (a copy of `forward_sm90`) on the chunk, unsplit, causal."""
    out = q.new_empty(q.shape)
    lse = torch.empty(q.shape[0], q.shape[2], q.shape[1], device=q.device)

    def call():
        module.attention_forward_sm90(q, k_cache, v_cache, out, lse, causal=True, softmax_scale=q.shape[-1] ** -0.5,
                                      cache=(lens, table, None))
        return out
    return call


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dims", type=int, nargs="*", default=[128])
    p.add_argument("--chunks", type=int, nargs="*", default=[64, 128, 256, 512, 2048])
    p.add_argument("--contexts", type=int, nargs="*", default=[4096, 16384])
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--pages", type=int, nargs="*", default=[0, 16])
    p.add_argument("--versions", nargs="*", default=[])
    p.add_argument("--out", default=None)
    a = p.parse_args()
    versions = {os.path.basename(f): load_module_copy(f) for f in a.versions}
    rows = []
    for d in a.dims:
        hq, hk = (32, 8) if d == 128 else (16, 4)
        for context in a.contexts:
            b = a.batch
            torch.manual_seed(0)
            k, v = (torch.randn(b, context, hk, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
            lens = torch.full((b,), context, dtype=torch.int32, device="cuda")
            for page in a.pages:
                k_cache, v_cache, table = (k, v, None) if page == 0 else paged_copy(page, k, v)
                for chunk in a.chunks:
                    q = torch.randn(b, chunk, hq, d, device="cuda", dtype=torch.bfloat16)

                    def ours():
                        return fmha.attention_with_kvcache(q, k_cache, v_cache, lens, block_table=table, causal=True)
                    def unsplit():
                        return fmha.attention_with_kvcache(q, k_cache, v_cache, lens, block_table=table, causal=True,
                                                           num_splits=1)
                    impls = {"ours": ours, "ours-unsplit": unsplit, "ours-triton": _without_gluon(ours),
                             "fa2": fa2_call(q, k, v),
                             **{name: gluon_version(module, q, k_cache, v_cache, lens, table)
                                for name, module in versions.items()}}
                    row = dict(d=d, hq=hq, hk=hk, b=b, context=context, chunk=chunk, page=page)
                    probe_row(rows, row, impls, attention_flops(b, chunk, context, hq, d, d, causal=True),
                              compare=["ours-triton", "fa2", *versions], timer=bench_gpu_graph)
    if a.out:
        save_sweep(a.out, rows)


if __name__ == "__main__":
    main()
