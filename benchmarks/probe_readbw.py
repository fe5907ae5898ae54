"""How fast can the decode case's K/V bytes be read at all, and does the order of the reads matter?

Pure-read kernels (no attention math: each program XOR-folds what it loads, so no load can be dropped) over the
same caches as `fmha bench decode`'s b=64, hk=8, sk=4096, d=128 rows (1 GiB of K + V), in two orders:
- per-head: one program per (sequence, KV head) walks that head's 256-byte slice of every key row (2 KB apart),
  as the decode kernel does; the 8 programs of a sequence read neighbouring slices of the same rows;
- whole-row: one program per (sequence, eighth of its keys) reads whole 2 KB key rows (all heads): the
  same 512 programs of 2 MB each, but every DRAM page a program opens is read through by that program.
Per-head reads also run with other warp counts, step sizes and programs per head (READ_VARIANTS): how many bytes
a program keeps in flight is what moves a paged read.
Each on a contiguous cache and on paged caches (pages 16 and 64, shuffled as `fmha bench decode` shuffles them),
beside cuDNN SDPA on the contiguous cache and our decode kernel, all in one process, CUDA-graph timing.

    PYTHONPATH=src python3 benchmarks/probe_readbw.py [--rounds 2] [--out probe.json]
"""
import argparse

import torch
import triton
import triton.language as tl

from fmha.bench import bench_gpu_graph, paged_copy, save_sweep
from probe_decode import _case


@triton.jit
def _xor(a, b):
    return a ^ b


@triton.jit
def _read_kernel(K, V, OUT, TABLE, keys, page, table_stride,
                 HEADS: tl.constexpr, ROW: tl.constexpr, COLS: tl.constexpr, BN: tl.constexpr,
                 PAGED: tl.constexpr, WHOLE_ROW: tl.constexpr, SPLITS: tl.constexpr):
    # K, V viewed as int32: a key row is ROW words (heads * d bf16), a head's slice COLS words.
    pid = tl.program_id(0)
    b = pid // (HEADS * SPLITS)
    if WHOLE_ROW:
        chunk = keys // HEADS
        k_lo = (pid % HEADS) * chunk
        col0 = 0
    else:
        # programs (sequence, head, split): a head's keys in SPLITS consecutive chunks
        chunk = keys // SPLITS
        k_lo = (pid % SPLITS) * chunk
        col0 = (pid // SPLITS % HEADS) * COLS
    offs_n = tl.arange(0, BN)
    offs_c = tl.arange(0, COLS)
    acc = tl.zeros([BN, COLS], dtype=tl.int32)
    for n in range(k_lo, k_lo + chunk, BN):
        key = n + offs_n
        if PAGED:
            pg = tl.load(TABLE + b * table_stride + key // page).to(tl.int64)
            row = pg * page + key % page
        else:
            row = b.to(tl.int64) * keys + key
        ptrs = row[:, None] * ROW + col0 + offs_c[None, :]
        acc = acc ^ tl.load(K + ptrs) ^ tl.load(V + ptrs)
    tl.store(OUT + pid, tl.reduce(tl.reduce(acc, 1, _xor), 0, _xor))


def read_call(k_cache, v_cache, table, b, keys, hk, d, whole_row, warps, stages, bn=None, splits=1):
    """A pure read of every key of every sequence, in one of the two orders (`bn` keys a step; per-head reads
    may cut each head's keys into `splits` programs)."""
    ki, vi = k_cache.view(torch.int32), v_cache.view(torch.int32)
    row, cols = hk * d // 2, d // 2
    page = k_cache.shape[1] if table is not None else 1
    if whole_row:
        bn, cols, splits = bn or 16, row, 1      # 16 rows x 2 KB = 32 KB a tensor per step
    else:
        bn = bn or 128                           # 128 rows x 256 B = 32 KB a tensor per step
    out = torch.empty(b * hk * splits, dtype=torch.int32, device=k_cache.device)
    grid = (b * hk * splits,)

    def call():
        _read_kernel[grid](ki, vi, out, table if table is not None else out, keys, page,
                           table.stride(0) if table is not None else 0,
                           HEADS=hk, ROW=row, COLS=cols, BN=bn, PAGED=table is not None, WHOLE_ROW=whole_row,
                           SPLITS=splits,
                           num_warps=warps, num_stages=stages)
        return out
    return call


# per-head reads: (warps, keys a step, programs per head)
READ_VARIANTS = [(8, 128, 1), (16, 128, 1), (16, 256, 1), (8, 64, 1), (8, 128, 2), (8, 128, 4), (16, 128, 2),
                 (4, 64, 2)]


def _fold(t):
    """XOR of all int32 words of t."""
    x = t.reshape(-1).view(torch.int32).to(torch.int64)
    while x.numel() > 1:
        if x.numel() % 2:
            x = torch.cat([x, x.new_zeros(1)])
        x = x[0::2] ^ x[1::2]
    return int(x.item())


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    import fmha
    b, hq, hk, sk, d = 64, 32, 8, 4096, 128
    q, k, v, lens, nbytes, cudnn, ref, row = _case(b, hq, hk, sk, 64)
    row = dict(b=b, hq=hq, hk=hk, sk=sk, cudnn_gbps=row["cudnn_gbps"])
    caches = {"contig": (k, v, None)}
    for page in (16, 64):
        torch.manual_seed(page)
        caches[f"page{page}"] = paged_copy(page, k, v)
    calls = {}
    for name, (kc, vc, table) in caches.items():
        calls[f"ours_{name}"] = (lambda kc=kc, vc=vc, table=table:
                                 fmha.attention_with_kvcache(q, kc, vc, lens, block_table=table))
        calls[f"read_row_{name}_w4"] = read_call(kc, vc, table, b, sk, hk, d, True, 4, 1)
        for warps, bn, splits in READ_VARIANTS:
            label = f"read_head_{name}_w{warps}n{bn}x{splits}"
            calls[label] = read_call(kc, vc, table, b, sk, hk, d, False, warps, 1, bn, splits)
    # Every read variant sees every word of K and V once: the XOR of its programs' outputs is the same number.
    want = _fold(k) ^ _fold(v)
    for label, c in calls.items():
        if label.startswith("read_"):
            assert _fold(c()) == want, label
        else:
            assert (c().float() - ref).abs().max().item() < 2e-2, label
    for r in range(args.rounds):
        for label, c in calls.items():
            row.setdefault(f"{label}_gbps", []).append(nbytes / bench_gpu_graph(c) / 1e9)
        row["cudnn_gbps"].append(nbytes / bench_gpu_graph(cudnn) / 1e9)
    best = max(row["cudnn_gbps"])
    print(f"cuDNN (contiguous) best {best:.0f} GB/s; best of rounds / best cuDNN:")
    for label in calls:
        print(f"  {label:28s} {max(row[f'{label}_gbps']):7.0f} GB/s  {max(row[f'{label}_gbps']) / best:.3f}")
    if args.out:
        save_sweep(args.out, [row])


if __name__ == "__main__":
    main()
