"""Where the time of one sparse decode call goes, for one `fmha bench sparse` row (default: the V4 row h_q=64,
topk 128 + extra 512, b=64). Usage:
    PYTHONPATH=src python3 benchmarks/profile_sparse.py [row index in bench.SPARSE_DECODE_CASES] [--plain]
    PYTHONPATH=src python3 benchmarks/profile_sparse.py --prefill [row index in bench.SPARSE_PREFILL_CASES] [--plain]
prints the torch profiler's CUDA kernel table; with --plain it only makes three calls (the first compiles), for
    ncu --kernel-name regex:mla_decode_sm90 --launch-skip 2 --launch-count 1 --clock-control none ...
and `benchmarks/ncu_source.py` summarises a report's per-instruction stall samples. `--version=PATH`: the calls run
a copy of `kernels/mla_decode_sm90.py` instead of the package's (the kernel keeps its name). `--peer`: the prefill
calls run FlashMLA's `flash_mla_sparse_fwd` (`benchmarks/peers/fetch_peers.py`) on the same inputs instead
(its kernel: `ncu --kernel-name-base demangled --kernel-name regex:sparse_attn_fwd_kernel ...`)."""
import sys

import torch

import fmha.mla as mla
from fmha.bench import (SPARSE_DECODE_CASES, SPARSE_PREFILL_CASES, load_module_copy, sparse_decode_inputs,
                         sparse_prefill_inputs, use_mla_kernels)

args = [a for a in sys.argv[1:] if not a.startswith("--")]
for a in sys.argv[1:]:
    if a.startswith("--version="):
        use_mla_kernels(load_module_copy(a.split("=", 1)[1]))
g = torch.Generator(device="cuda").manual_seed(0)
if "--prefill" in sys.argv:
    case = SPARSE_PREFILL_CASES[int(args[0]) if args else 1]
    name, sq, skv, hq, d, topk = case
    b, extra_topk = 1, 0
    q, kv, indices = sparse_prefill_inputs(case, g)
    impl = mla
    if "--peer" in sys.argv:
        import flash_mla as impl
    call = lambda: impl.flash_mla_sparse_fwd(q, kv, indices, d ** -0.5, 512)  # noqa
else:
    case = SPARSE_DECODE_CASES[int(args[0]) if args else 2]
    name, b, hq, sq, d, layout, topk, page, extra_topk, extra_page = case
    q, cache, lens, sink, kw = sparse_decode_inputs(case, g)
    meta, splits = mla.get_mla_metadata(lens, sq * hq, 1, num_heads_q=hq, topk=topk)
    call = lambda: mla.flash_mla_with_kvcache(q, cache, None, lens, 512, meta, splits, attn_sink=sink, **kw)  # noqa
for _ in range(3):
    call()
torch.cuda.synchronize()
if "--plain" not in sys.argv:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(10):
            call()
        torch.cuda.synchronize()
    print(name, b, hq, topk, extra_topk)
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=15))
