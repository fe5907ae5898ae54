"""Where the time of one sparse decode call goes: the torch profiler's CUDA kernel table for one `fmha bench
sparse` row (default: the V4 row h_q=64, topk 128 + extra 512, b=64). Usage:
    PYTHONPATH=src python3 benchmarks/profile_sparse.py [row index in bench.SPARSE_DECODE_CASES]"""
import sys

import torch

import fmha.mla as mla
from fmha.bench import SPARSE_DECODE_CASES, sparse_decode_inputs

case = SPARSE_DECODE_CASES[int(sys.argv[1]) if len(sys.argv) > 1 else 2]
name, b, hq, sq, d, layout, topk, page, extra_topk, extra_page = case
q, cache, lens, sink, kw = sparse_decode_inputs(case, torch.Generator(device="cuda").manual_seed(0))
meta, splits = mla.get_mla_metadata(lens, sq * hq, 1, num_heads_q=hq, topk=topk)
call = lambda: mla.flash_mla_with_kvcache(q, cache, None, lens, 512, meta, splits, attn_sink=sink, **kw)  # noqa
for _ in range(3):
    call()
torch.cuda.synchronize()
with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
    for _ in range(10):
        call()
    torch.cuda.synchronize()
print(name, b, hq, topk, extra_topk)
print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=15))
