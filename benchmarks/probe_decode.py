"""A/B of decode pipelining variants through the public KV-cache API (one process, same inputs, CUDA-graph
timing as `fmha bench decode`): decode tiles (BLOCK_M, BLOCK_N, num_warps, num_stages) put in both decode tile
tables (paged and contiguous) in turn. cuDNN SDPA on the contiguous cache
is timed before and after the variants of each case, so drift within the case shows. For tuning; `fmha bench
decode` is the record.

`--placement` instead keeps the tiles and varies where the pages lie: in order (the paged cache is then the
contiguous one, byte for byte), shuffled in runs of pages that fill 2 MB, or shuffled one by one (what
`fmha bench decode` does). It separates the cost of the paged code path from the cost of scattered pages.

`--head-dim` and `--seqlen-q` set the cases' head dim (128) and query rows a sequence (1; more: speculative
decodes, unmasked, so that cuDNN computes the same). Calls that run two KV heads a program (`forward.HEAD_PAIRS`,
`_pairs_pay`: d = 128 GQA decodes that fill the GPU unsplit) take the tiles of twice the head dim (the pairs'
table, else the tables' 2 x d entries), which the variants leave. `--causal 0 1` runs each variant also with
causal=True (labelled /c): at one query row that mask hides no key, so the /c runs time the causal form of the same
work (their maxdiff is against cuDNN's unmasked output, so it means something at one row only).

    PYTHONPATH=src python3 benchmarks/probe_decode.py [--rounds 2] [--placement] [--variants 64,64,4,5 ...]
        [--contiguous] [--head-dim 256] [--seqlen-q 4] [--cases 64,32,8,4096,16 ...] [--kernel-copy PATH]
        [--num-splits 0 1 4] [--causal 0 1] [--out probe.json]
"""
import argparse

import torch
import torch.nn.functional as F
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel

import fmha
from fmha.bench import bench_gpu_graph, paged_copy, save_sweep
from fmha.kernels import forward

CASES = [(64, 32, 8, 4096, 16), (64, 32, 8, 4096, 64), (64, 32, 8, 4096, None), (4, 32, 8, 131072, 64),
         (1, 32, 8, 131072, 64), (32, 32, 32, 8192, 64)]
VARIANTS = [(64, 64, 4, 2), (64, 64, 4, 5), (64, 32, 4, 3), (64, 32, 4, 5), (64, 32, 4, 7), (64, 128, 4, 3),
            (64, 128, 8, 3), (64, 64, 8, 5)]
PLACEMENT_CASES = [(64, 32, 8, 4096, 16), (64, 32, 8, 4096, 64)]
PLACEMENTS = ("in-order", "2MB-runs", "shuffled")
D = 128


def parse_cases(texts):
    """Cases given on a command line as "b,hq,hk,sk,page" (page "-": a contiguous cache) as tuples, page None there."""
    return [tuple(None if x == "-" else int(x) for x in text.split(",")) for text in texts]


def _case(b, hq, hk, sk, page, d=D, seqlen_q=1):
    """Inputs of one decode case on a contiguous cache, cuDNN on it (the call, its output as the reference, its
    first timing in the row)."""
    torch.manual_seed(0)
    q = torch.randn(b, seqlen_q, hq, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(b, sk, hk, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(b, sk, hk, d, device="cuda", dtype=torch.bfloat16)
    lens = torch.full((b,), sk, dtype=torch.int32, device="cuda")
    nbytes = (2 * k.numel() + 2 * q.numel()) * k.element_size()
    qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=hq != hk)
    ref = cudnn().transpose(1, 2).float()
    row = dict(b=b, hq=hq, hk=hk, sk=sk, page=page or 0, d=d, seqlen_q=seqlen_q,
               cudnn_gbps=[nbytes / bench_gpu_graph(cudnn) / 1e9])
    return q, k, v, lens, nbytes, cudnn, ref, row


def placed_copy(page, placement, k, v):
    """Paged caches holding contiguous k, v `(b, s, h, d)`, pages stored in the given placement."""
    b, s = k.shape[:2]
    n = b * (s // page)
    run = min(n, max(1, (2 << 20) // (page * k.shape[2] * k.shape[3] * k.element_size())))    # pages per 2 MB
    assert n % run == 0, (n, run)
    if placement == "in-order":
        perm = torch.arange(n, device=k.device)
    elif placement == "2MB-runs":
        runs = torch.randperm(n // run, device=k.device)
        perm = (runs[:, None] * run + torch.arange(run, device=k.device)[None, :]).reshape(-1)
    else:
        perm = None                                           # shuffled page by page, as `fmha bench decode`
    return paged_copy(page, k, v, perm=perm)


def probe_placement(args, rows):
    for b, hq, hk, sk, page in PLACEMENT_CASES:
        q, k, v, lens, nbytes, cudnn, ref, row = _case(b, hq, hk, sk, page)
        contiguous = lambda: fmha.attention_with_kvcache(q, k, v, lens)
        for r in range(args.rounds):
            row.setdefault("contiguous_gbps", []).append(nbytes / bench_gpu_graph(contiguous) / 1e9)
            for placement in PLACEMENTS:
                k_cache, v_cache, table = placed_copy(page, placement, k, v)
                call = lambda: fmha.attention_with_kvcache(q, k_cache, v_cache, lens, block_table=table)
                if r == 0:
                    row[f"{placement}_maxdiff"] = (call().float() - ref).abs().max().item()
                row.setdefault(f"{placement}_gbps", []).append(nbytes / bench_gpu_graph(call) / 1e9)
                del k_cache, v_cache
        row["cudnn_gbps"].append(nbytes / bench_gpu_graph(cudnn) / 1e9)
        rows.append(row)
        best = max(row["cudnn_gbps"])
        cells = "  ".join(f"{name} {max(row[f'{name}_gbps']) / best:.3f}" for name in ("contiguous", *PLACEMENTS))
        print(f"b={b} hq={hq} hk={hk} sk={sk} page={page} | best of rounds / best cuDNN: {cells}", flush=True)
        del q, k, v
        torch.cuda.empty_cache()


def _label(tiles, suffix="", splits=0, causal=False):
    """A run's key in the rows: its tiles joined by x, or "default" for each table's own; then the kernel's suffix,
    /sN where num_splits is forced and /c where the call is causal."""
    return (("x".join(map(str, tiles)) if tiles else "default") + suffix + (f"/s{splits}" if splits else "")
            + ("/c" if causal else ""))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=2, help="passes over the variants per case")
    p.add_argument("--placement", action="store_true", help="vary where the pages lie instead of the tiles")
    p.add_argument("--batches", type=int, nargs="*", default=None,
                   help="instead: the table's own tiles on b=64's shape at these batch sizes (pages 16, 64 and a "
                        "contiguous cache), to see the cost of a partly filled last wave of programs")
    p.add_argument("--variants", nargs="*", default=None,
                   help="tiles to compare instead of VARIANTS, e.g. 16,64,4,5; `default`: each table's own tiles")
    p.add_argument("--contiguous", action="store_true", help="every case's shape on a contiguous cache only")
    p.add_argument("--head-dim", type=int, default=D, help="the cases' head dim")
    p.add_argument("--seqlen-q", type=int, default=1, help="query rows a sequence (unmasked)")
    p.add_argument("--cases", nargs="*", default=None,
                   help="these cases instead, each b,hq,hk,sk,page (page -: a contiguous cache), e.g. 64,32,8,4096,16")
    p.add_argument("--kernel-copy", default=None,
                   help="also run each variant on this copy of forward.py's attn_fwd_kernel (e.g. a patched file), "
                        "labelled +copy: a one-process A/B of a kernel change")
    p.add_argument("--num-splits", type=int, nargs="*", default=[0],
                   help="run each variant with each of these num_splits (0: the planner's), labelled /sN unless 0")
    p.add_argument("--causal", type=int, nargs="*", default=[0],
                   help="run each variant with each of these causal flags (1: causal=True, labelled /c)")
    p.add_argument("--out", default=None, help="also write the rows as JSON (GPU, date, commit recorded)")
    args = p.parse_args()
    cases, variants = CASES, VARIANTS
    if args.variants:
        variants = [None if v == "default" else tuple(int(x) for x in v.split(",")) for v in args.variants]
    if args.batches:
        cases = [(b, 32, 8, 4096, page) for b in args.batches for page in (16, 64, None)]
        variants = [None]             # each table's own tiles
    if args.cases:
        cases = parse_cases(args.cases)
    if args.contiguous:
        cases = list(dict.fromkeys((b, hq, hk, sk, None) for b, hq, hk, sk, _ in cases))
    rows = []
    if args.placement:
        probe_placement(args, rows)
        if args.out:
            save_sweep(args.out, rows)
        return
    kernels = {"": forward.attn_fwd_kernel}
    if args.kernel_copy:
        from fmha.bench import load_module_copy
        kernels["+copy"] = load_module_copy(args.kernel_copy).attn_fwd_kernel
    runs = [(tiles, suffix, n, bool(c)) for tiles in variants for suffix in kernels for n in args.num_splits
            for c in args.causal]
    key = forward.tile_key(args.head_dim, args.head_dim)
    tables = [table for *_, table in forward._DECODE_LOOKUP if key in table]      # not the head pairs' (2 x d)
    defaults = [t[key] for t in tables]
    split_tiles = forward._GPU_SPLIT_TILES
    for b, hq, hk, sk, page in cases:
        q, k, v, lens, nbytes, cudnn, ref, row = _case(b, hq, hk, sk, page, args.head_dim, args.seqlen_q)
        k_cache, v_cache, table = (k, v, None) if page is None else paged_copy(page, k, v)
        for r in range(args.rounds):
            for tiles, suffix, splits, causal in runs:
                for table_, own in zip(tables, defaults):
                    table_[key] = tiles or own
                # a variant's own tiles in split launches too (`forward._GPU_SPLIT_TILES` for the tables' tiles)
                forward._GPU_SPLIT_TILES = split_tiles if tiles is None else {}
                forward._PLANS.clear()
                forward.attn_fwd_kernel = kernels[suffix]     # `attention_forward` launches the module's global
                call = lambda: fmha.attention_with_kvcache(q, k_cache, v_cache, lens, block_table=table,
                                                           num_splits=splits, causal=causal)
                name = _label(tiles, suffix, splits, causal)
                try:
                    if r == 0:
                        row[f"{name}_maxdiff"] = (call().float() - ref).abs().max().item()
                    row.setdefault(f"{name}_gbps", []).append(nbytes / bench_gpu_graph(call) / 1e9)
                except triton.runtime.errors.OutOfResources as e:      # a variant too big for this GPU
                    row[f"{name}_error"] = str(e).splitlines()[0]
                    row.setdefault(f"{name}_gbps", []).append(0.0)
        for table_, tiles in zip(tables, defaults):
            table_[key] = tiles
        forward.attn_fwd_kernel, forward._GPU_SPLIT_TILES = kernels[""], split_tiles
        row["cudnn_gbps"].append(nbytes / bench_gpu_graph(cudnn) / 1e9)
        rows.append(row)
        cudnn_best = max(row["cudnn_gbps"])
        cells = "  ".join(f"{n} {max(row[f'{n}_gbps']) / cudnn_best:.3f}" for n in (_label(*run) for run in runs))
        print(f"b={b:<3} hq={hq} hk={hk} sk={sk:<6} page={page or '-':<3} | cuDNN "
              f"{'/'.join(f'{x:.0f}' for x in row['cudnn_gbps'])} GB/s | best of rounds / best cuDNN: {cells}",
              flush=True)
        if args.out:              # after every case: a run cut off by its time limit keeps the cases it finished
            save_sweep(args.out, rows)
        del q, k, v, k_cache, v_cache
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
