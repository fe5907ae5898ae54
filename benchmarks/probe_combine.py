"""A/B of the split-KV combine kernel: the package's `kernels/combine.py` against other copies of it (e.g.
`git show REV:src/fmha/kernels/combine.py > old.py`; 558a28c's parent holds the one before the tiled merge), in one
process on the same inputs, on calls that merge parts: long-context GQA decode (b = 1 and 4 at 131k keys, page 64,
d = 128; b = 1 at d = 64) and MLA decode with lengths drawn around 8192 (the planner cuts sequences into parts
there). CUDA-graph timing; each output's largest difference from the package's is recorded. `--none` also times
the calls with no combine at all (their outputs unmerged: a timing only, the yardstick of what the merge costs).

    PYTHONPATH=src python3 benchmarks/probe_combine.py OTHER.py [OTHER2.py ..] [--none] [--out probe.json]
"""
import argparse
import os

import torch

import fmha
import fmha.mla as mla
from fmha.bench import bench_gpu_graph, load_module_copy, paged_copy, save_sweep
from fmha.kernels import forward, mla_decode

DECODE = [(1, 32, 8, 131072, 128), (4, 32, 8, 131072, 128), (1, 32, 8, 131072, 64)]
MLA = [(128, 8192, 128, 1), (128, 8192, 32, 1), (128, 8192, 16, 1), (32, 8192, 16, 1)]


def _cases():
    for b, hq, hk, sk, d in DECODE:
        torch.manual_seed(0)
        q = torch.randn(b, 1, hq, d, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(b, sk, hk, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        kc, vc, table = paged_copy(64, k, v)
        lens = torch.full((b,), sk, dtype=torch.int32, device="cuda")
        nbytes = 2 * k.numel() * 2
        yield dict(kind="decode", b=b, hq=hq, hk=hk, sk=sk, d=d), nbytes, \
            lambda: fmha.attention_with_kvcache(q, kc, vc, lens, block_table=table)
    for b, sk, hq, sq in MLA:
        torch.manual_seed(0)
        q = torch.randn(b, sq, hq, 576, device="cuda", dtype=torch.bfloat16)
        cache, table = paged_copy(64, torch.randn(b, sk, 1, 576, device="cuda", dtype=torch.bfloat16))
        lens = (torch.randn(b, device="cuda") * sk / 4 + sk).clamp(1, sk).to(torch.int32)
        meta, splits = mla.get_mla_metadata(lens, sq * hq, 1)
        nbytes = int(lens.sum()) * 576 * 2
        yield dict(kind="mla-varlen", b=b, hq=hq, sq=sq, sk=sk), nbytes, \
            lambda: mla.flash_mla_with_kvcache(q, cache, table, lens, 512, meta, splits)[0]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("others", nargs="+", metavar="OTHER.py", help="copies of kernels/combine.py, named by file")
    p.add_argument("--none", action="store_true", help="also time the calls with no combine (timing only)")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    versions = {"package": forward.combine}
    for path in args.others:
        versions[os.path.splitext(os.path.basename(path))[0]] = load_module_copy(path).combine
    if args.none:
        versions["none"] = lambda *a, **kw: None
    rows = []
    for row, nbytes, call in _cases():
        ref = call().float()
        for r in range(2):
            for name, fn in versions.items():
                forward.combine = mla_decode.combine = fn
                if r == 0:
                    row[f"{name}_maxdiff"] = (call().float() - ref).abs().max().item()
                row.setdefault(f"{name}_gbps", []).append(nbytes / bench_gpu_graph(call) / 1e9)
        forward.combine = mla_decode.combine = versions["package"]
        rows.append(row)
        base = max(row["package_gbps"])
        print(f"{row} | package {base:.0f} GB/s | " + ", ".join(
            f"{name} {max(row[name + '_gbps']):.0f} (x{max(row[name + '_gbps']) / base:.3f})"
            for name in versions if name != "package"), flush=True)
    if args.out:
        save_sweep(args.out, rows)


if __name__ == "__main__":
    main()
