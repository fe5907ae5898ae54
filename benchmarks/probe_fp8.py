"""How much of a sparse FP8 decode call is the dequantisation, and what a setting of the Gluon MLA kernel (a
module constant of `mla_decode_sm90` named by --knob) gives: the b=64 rows of `fmha bench sparse` timed on their
FP8 caches and on bf16 caches holding the same keys at the same indices (the same kernel with plain gathers),
and two dense rows of `fmha bench mla`, at each value of the setting in one process; CUDA-graph timing, FLOPs
over the selected tokens. Run once on the kernel as it is and once with the dequantisation step patched out
(timing only, results wrong) to split the FP8 overhead into the step itself and the rest. For tuning;
`fmha bench` is the record.

    PYTHONPATH=src python3 benchmarks/probe_fp8.py [--label base] [--knob NAME --values 0 1] [--out probe.json]
"""
import argparse

import torch

import fmha.mla as mla
from fmha.bench import SPARSE_DECODE_CASES, bench_gpu_graph, paged_copy, save_sweep, sparse_decode_inputs
from fmha.kernels import mla_decode_sm90

DENSE_CASES = [(128, 4096, 128, 1), (128, 8192, 16, 1)]       # (b, s_k, h_q, s_q), page 64


def _timed(call, flops, args, row, key):
    for value in args.values:
        if args.knob:
            setattr(mla_decode_sm90, args.knob, type(getattr(mla_decode_sm90, args.knob))(value))
        row.setdefault(f"{key}_{value}_tflops", []).extend(flops / bench_gpu_graph(call) / 1e12 for _ in range(2))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--label", default="base")
    p.add_argument("--knob", default=None, help="a module constant of mla_decode_sm90 to vary")
    p.add_argument("--values", type=int, nargs="*", default=[0], help="its values (ints; a bool knob: 0 / 1)")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    rows = []
    for case in SPARSE_DECODE_CASES[::2]:
        name, b, hq, sq, d, layout, topk, page, extra_topk, extra_page = case
        row = dict(case=name, b=b, hq=hq, label=args.label)
        flops = 2 * b * sq * hq * (topk + extra_topk) * (d + 512)
        for fmt in ("fp8", "bf16"):
            g = torch.Generator(device="cuda").manual_seed(0)
            q, cache, lens, sink, kw = sparse_decode_inputs(case, g)
            if fmt == "bf16":
                cache = mla.dequantize_kv_cache(cache, layout)
                kw["is_fp8_kvcache"] = False
                if "extra_k_cache" in kw:
                    kw["extra_k_cache"] = mla.dequantize_kv_cache(kw["extra_k_cache"], layout)
            meta, splits = mla.get_mla_metadata(lens, sq * hq, 1, num_heads_q=hq, topk=topk,
                                                is_fp8_kvcache=fmt == "fp8")
            call = lambda: mla.flash_mla_with_kvcache(q, cache, None, lens, 512, meta, splits,  # noqa: E731
                                                      attn_sink=sink, **kw)
            _timed(call, flops, args, row, fmt)
            del q, cache, kw
            torch.cuda.empty_cache()
        rows.append(row)
        print(f"{args.label}: {name} b={b} hq={hq} " + "  ".join(f"{k[:-7]} {max(v):.0f}" for k, v in row.items()
                                                                 if k.endswith("_tflops")), flush=True)
    for b, sk, hq, sq in DENSE_CASES:
        row = dict(case="dense", b=b, sk=sk, hq=hq, sq=sq, label=args.label)
        g = torch.Generator(device="cuda").manual_seed(0)
        q = torch.randn(b, sq, hq, 576, device="cuda", dtype=torch.bfloat16, generator=g)
        kv = torch.randn(b, sk, 1, 576, device="cuda", dtype=torch.bfloat16, generator=g)
        cache, table = paged_copy(64, kv)
        del kv
        lens = torch.full((b,), sk, dtype=torch.int32, device="cuda")
        meta, splits = mla.get_mla_metadata(lens, sq * hq, 1)
        call = lambda: mla.flash_mla_with_kvcache(q, cache, table, lens, 512, meta, splits, causal=sq > 1)  # noqa
        _timed(call, 2 * b * sq * hq * sk * (576 + 512), args, row, "bf16")
        rows.append(row)
        print(f"{args.label}: dense b={b} sk={sk} hq={hq} sq={sq} " + "  ".join(
            f"{k[:-7]} {max(v):.0f}" for k, v in row.items() if k.endswith("_tflops")), flush=True)
        del q, cache
        torch.cuda.empty_cache()
    if args.out:
        save_sweep(args.out, rows)


if __name__ == "__main__":
    main()
