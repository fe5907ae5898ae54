"""A/B of V3.2's FP8 sparse decode: the package's path (`fmha.mla.flash_mla_with_kvcache`, `mla_decode_sm90`) against
`kernels/sparse_decode_sm90.py` (a loading warpgroup that dequantises, a scoring warpgroup and a P·V-only one), on
`fmha bench sparse`'s V3.2 rows, one process, outputs checked against the package's first (also with invalid
indices), then timed round-robin from CUDA graphs.

    PYTHONPATH=src python3 benchmarks/probe_sparse_v32.py [--out probe.json] [--rounds 3]
"""
import argparse

import torch

import fmha.mla as ours_mla
from fmha.bench import SPARSE_DECODE_CASES, _heat, bench_gpu_graph, save_sweep, sparse_decode_inputs
from fmha.kernels import sparse_decode_sm90 as new


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    rows = []
    for case in [c for c in SPARSE_DECODE_CASES if c[0] == "v32-fp8"]:
        name, b, hq, sq, d, layout, topk, page, extra_topk, extra_page = case
        q, cache, lens, sink, kw = sparse_decode_inputs(case, torch.Generator(device="cuda").manual_seed(0))
        idx = kw["indices"]
        # Invalid entries (-1 and past the cache) in a copy of the index rows, for the check only.
        bad = idx.clone()
        bad[..., 5::97] = -1
        bad[..., 7::131] = cache.shape[0] * cache.shape[1] + 3
        scale = d ** -0.5
        for indices in (bad, idx):
            meta, splits = ours_mla.get_mla_metadata(lens, sq * hq, 1, num_heads_q=hq, topk=topk)
            kw_i = dict(kw, indices=indices)
            o_ref, lse_ref = ours_mla.flash_mla_with_kvcache(q, cache, None, lens, 512, meta, splits,
                                                             attn_sink=sink, **kw_i)
            o_new, lse_new = new.sparse_decode_v32(q, cache, indices, scale, sink)
            torch.cuda.synchronize()
            lse_new = lse_new.view(b, sq, hq).transpose(1, 2)
            err_o = (o_new.float() - o_ref.float()).abs().max().item()
            err_l = (lse_new - lse_ref).abs().max().item()
            print(f"{name} b={b} {'invalid ' if indices is bad else ''}check: max |out diff| {err_o:.3e}, "
                  f"max |lse diff| {err_l:.3e}", flush=True)
            assert err_o < 2e-2 and err_l < 1e-3, "outputs differ"
        meta, splits = ours_mla.get_mla_metadata(lens, sq * hq, 1, num_heads_q=hq, topk=topk)
        calls = {"package": lambda: ours_mla.flash_mla_with_kvcache(q, cache, None, lens, 512, meta, splits,
                                                                    attn_sink=sink, **kw),
                 "new": lambda: new.sparse_decode_v32(q, cache, idx, scale, sink)}
        flops = 2 * b * sq * hq * topk * (d + 512)
        _heat(list(calls.values()))
        times = {k: [] for k in calls}
        for _ in range(args.rounds):
            for k, fn in calls.items():
                times[k].append(bench_gpu_graph(fn))
        row = dict(case=name, b=b, hq=hq, sq=sq, topk=topk)
        for k, ts in times.items():
            row[f"{k}_tflops"] = flops / sorted(ts)[len(ts) // 2] / 1e12
        row["new_vs_package"] = row["new_tflops"] / row["package_tflops"]
        rows.append(row)
        print(f"{name} b={b}: package {row['package_tflops']:.1f} new {row['new_tflops']:.1f} TFLOP/s "
              f"({row['new_vs_package']:.3f}x)", flush=True)
    if args.out:
        save_sweep(args.out, rows)


if __name__ == "__main__":
    main()
