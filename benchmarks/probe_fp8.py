"""How much of a sparse FP8 decode call is the dequantisation: the b=64 rows of `fmha bench sparse` timed on
their FP8 caches and on bf16 caches holding the same keys at the same indices (the same kernel with plain
gathers), CUDA-graph timing, FLOPs over the selected tokens. Run it once on the kernel as it is and once
with the kernel's dequantisation step patched out (timing only, results wrong) to split the FP8 overhead into
the step itself and the rest. For tuning; `fmha bench sparse` is the record.

    PYTHONPATH=src python3 benchmarks/probe_fp8.py [--label base] [--out probe.json]
"""
import argparse

import torch

import fmha.mla as mla
from fmha.bench import SPARSE_DECODE_CASES, bench_gpu_graph, save_sweep, sparse_decode_inputs


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--label", default="base")
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
            row[f"{fmt}_tflops"] = [flops / bench_gpu_graph(call) / 1e12 for _ in range(2)]
            del q, cache, kw
            torch.cuda.empty_cache()
        rows.append(row)
        print(f"{args.label}: {name} b={b} hq={hq} fp8 {max(row['fp8_tflops']):.0f} bf16 {max(row['bf16_tflops']):.0f}"
              " TFLOP/s", flush=True)
    if args.out:
        save_sweep(args.out, rows)


if __name__ == "__main__":
    main()
