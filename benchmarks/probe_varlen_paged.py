"""`attention_varlen(..., block_table=, seqused_k=)` (packed queries over a paged cache: vLLM's FlashAttention call
for a batch that mixes prefill chunks and decodes) against the same work as two `attention_with_kvcache` calls
(the decodes, then the chunks, each batch on its own path: split decode tiles, the Gluon chunk kernel), in one
process on the same cache.

    PYTHONPATH=src python3 benchmarks/probe_varlen_paged.py [--out varlen_paged.json]

Rows: `decodes` sequences of one query and `chunks` of `chunk` queries (causal), every sequence with `context`
keys in 16-key pages (shuffled), 32 / 8 heads, d = 128, bf16. TFLOP/s over the pairs the causal mask lets
through, CUDA-graph replays; outputs compared first (`probe_row`). Besides the call as routed (`ours`), the same call
held on the portable kernel (`portable`), and held there with each KV head's query heads packed in one tile
whatever `max_seqlen_q` (`portable_packed`: a decode sequence's heads share a program).
"""
import contextlib
import argparse

import torch

import fmha
from fmha.kernels import forward
from fmha.bench import attention_flops, bench_gpu_graph, paged_copy, probe_row, save_sweep


@contextlib.contextmanager
def held(pack):
    """The portable kernel for calls inside (Gluon off), with GQA packing forced on when `pack`."""
    saved = forward.gluon_enabled, forward._pack_gqa
    forward.gluon_enabled = lambda: False
    if pack:
        forward._pack_gqa = lambda group, seqlen_q, block_m: group > 1
    try:
        yield
    finally:
        forward.gluon_enabled, forward._pack_gqa = saved


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=None)
    a = p.parse_args()
    rows = []
    hq, hk, d, page = 32, 8, 128, 16
    for decodes, chunks, chunk, context in [(64, 0, 0, 4096), (4, 0, 0, 131072), (32, 2, 512, 4096),
                                            (0, 4, 512, 4096), (8, 1, 2048, 16384)]:
        b = decodes + chunks
        g = torch.Generator().manual_seed(b)
        k, v = (torch.randn(b, context, hk, d, generator=g).to(torch.bfloat16).cuda() for _ in range(2))
        k_cache, v_cache, table = paged_copy(page, k, v)
        lens_q = [1] * decodes + [chunk] * chunks
        cu_q = torch.tensor([0] + list(torch.tensor(lens_q).cumsum(0)), dtype=torch.int32, device="cuda")
        used = torch.full((b,), context, dtype=torch.int32, device="cuda")
        q = torch.randn(int(cu_q[-1]), hq, d, generator=g).to(torch.bfloat16).cuda()
        q_dec = q[:decodes].view(decodes, 1, hq, d)
        q_chunk = q[decodes:].view(chunks, chunk, hq, d)

        def ours():
            return fmha.attention_varlen(q, k_cache, v_cache, cu_q, None, max(lens_q), context, causal=True,
                                         seqused_k=used, block_table=table)

        def portable(pack=False):
            with held(pack):
                return ours()

        def two_calls():
            parts = []
            if decodes:
                parts.append(fmha.attention_with_kvcache(q_dec, k_cache, v_cache, used[:decodes],
                                                         block_table=table[:decodes], causal=True).flatten(0, 1))
            if chunks:
                parts.append(fmha.attention_with_kvcache(q_chunk, k_cache, v_cache, used[decodes:],
                                                         block_table=table[decodes:], causal=True).flatten(0, 1))
            return torch.cat(parts)
        flops = (attention_flops(decodes, 1, context, hq, d, d, causal=True) +
                 attention_flops(chunks, chunk, context, hq, d, d, causal=True))
        row = dict(decodes=decodes, chunks=chunks, chunk=chunk, context=context, page=page)
        impls = {"ours": ours, "portable": portable, "portable_packed": lambda: portable(True),
                 "two_calls": two_calls}
        probe_row(rows, row, impls, flops, compare=["two_calls", "portable", "portable_packed"],
                  timer=bench_gpu_graph)
    if a.out:
        save_sweep(a.out, rows)


if __name__ == "__main__":
    main()
