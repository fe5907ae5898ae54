"""How fast can the decode case's K/V bytes be read at all, and does the order of the reads matter?

Pure-read kernels (`fmha.kernels.kv_read`: no attention math, each program XOR-folds what it loads) over the
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

from fmha.bench import bench_gpu_graph, paged_copy, save_sweep
from fmha.kernels.kv_read import kv_read, xor_fold
from probe_decode import _case


# per-head reads: (warps, keys a step, programs per head)
READ_VARIANTS = [(8, 128, 1), (16, 128, 1), (16, 256, 1), (8, 64, 1), (8, 128, 2), (8, 128, 4), (16, 128, 2),
                 (4, 64, 2)]


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
        calls[f"read_row_{name}_w4"] = kv_read(kc, vc, table, sk, whole_row=True, warps=4)
        for warps, bn, splits in READ_VARIANTS:
            label = f"read_head_{name}_w{warps}n{bn}x{splits}"
            calls[label] = kv_read(kc, vc, table, sk, warps=warps, block_n=bn, splits=splits)
    # Every read variant sees every word of K and V once: the XOR of its programs' outputs is the same number.
    want = xor_fold(k) ^ xor_fold(v)
    for label, c in calls.items():
        if label.startswith("read_"):
            assert xor_fold(c()) == want, label
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
