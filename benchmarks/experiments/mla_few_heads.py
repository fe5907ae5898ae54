"""MLA decode with few packed query rows (h_q * s_q < 16: DeepSeek's 128 heads over tensor parallelism of 16 or 32
ranks leave 8 or 4 a rank): the package's call ("ours") against the same public call with the Gluon paths off
("portable": the `triton.language` kernel, which the package ran below 16 rows until b239e4b), one process.
- `dense` (the default): bf16 paged caches, b = 128, page 64 shuffled; also the call with q's heads padded to 16
  (zeros; the output's first h_q heads kept: "pad16", the Gluon kernel's 16-row form, which af3f68f's record took as
  the route's stand-in).
- `fp8`: the same few-row shapes over FP8 caches, V3.2 paged, and token-sparse V3.2 and V4 (its second source
  included) with `fmha.bench.sparse_decode_inputs`' selections at `bench sparse`'s topk and pages.
FlashMLA's bytes (the cache bytes read once + Q + O of the real heads; sparse: the selected tokens' rows); the GPU's
copy bandwidth measured in the same run (`fmha.bench.gpu_ceilings`).

    PYTHONPATH=src:benchmarks/experiments python3 benchmarks/experiments/mla_few_heads.py [dense|fp8] --out F.json

Medians of three interleaved rounds of CUDA-graph replays (`fp8_gluon_decode._gbps`); the JSON is written after
every case.
"""
import json
import os
import sys

import torch

# (b, keys, h_q, s_q): TP 16 / 32 ranks' heads, MTP's s_q = 2, and h_q = 16 (the Gluon kernel's already) as a yardstick
CASES = [(128, n, h_q, s_q) for n in (4096, 16384) for h_q, s_q in ((1, 1), (4, 1), (8, 1), (4, 2), (8, 2), (16, 1))]
# ("paged", b, keys, h_q, s_q, layout) or `fmha.bench.SPARSE_DECODE_CASES`' form (name, b, h_q, s_q, d, layout, topk,
# page, extra topk, extra page) with few heads
FP8_CASES = [("paged", 128, 4096, 8, 1, "v32"), ("paged", 128, 4096, 4, 2, "v32"),
             ("v32-fp8", 64, 8, 1, 576, "v32", 2048, 64, 0, 0), ("v32-fp8", 64, 4, 2, 576, "v32", 2048, 64, 0, 0),
             ("v4-fp8", 64, 8, 1, 512, "model1", 128, 256, 512, 64)]
PAD_HEADS = 16


def _record(rows, row, calls, nbytes, copy_gbps, out_path):
    """Check every call against "ours", time them (`_gbps`), print and append the row, write the JSON."""
    from fp8_gluon_decode import _gbps, _outputs

    results, ran = _outputs(calls)
    err = max((results[name] - results["ours"]).abs().max().item() for name in calls)
    assert err < 2e-2, err
    gbps, rounds = _gbps(calls, nbytes)
    row.update(err=err, kernels=ran, copy_gbps=copy_gbps, **{f"{name}_gbps": x for name, x in gbps.items()},
               **{f"{name}_frac_copy": x / copy_gbps for name, x in gbps.items()},
               ours_vs_portable=gbps["ours"] / gbps["portable"], rounds=rounds)
    if "pad16" in gbps:
        row["pad16_vs_ours"] = gbps["pad16"] / gbps["ours"]
    rows.append(row)
    print(" ".join(f"{k}={v}" for k, v in row.items() if not isinstance(v, (dict, float))) + ": "
          + " ".join(f"{k} {x:.0f}" for k, x in gbps.items())
          + " GB/s (copy fracs " + " / ".join(f"{x / copy_gbps:.3f}" for x in gbps.values())
          + f"; ours/portable {row['ours_vs_portable']:.3f}) err {err:.1e} {ran}", flush=True)
    if out_path:
        json.dump(dict(gpu=torch.cuda.get_device_name(), commit=os.environ.get("FMHA_COMMIT", "unknown"),
                       rows=rows), open(out_path, "w"), indent=1)


def _copy_gbps():
    """This GPU's copy bandwidth measured now (`fmha.bench.gpu_ceilings`), printed as each mode's first line."""
    from fmha.bench import gpu_ceilings

    copy_gbps = gpu_ceilings()["copy_gbps"]
    print(f"{torch.cuda.get_device_name()}: copy {copy_gbps:.0f} GB/s", flush=True)
    return copy_gbps


def dense(out_path=None):
    import fmha.mla as flash_mla
    from fmha.bench import _without_gluon, paged_copy

    copy_gbps, rows = _copy_gbps(), []
    for b, n, h_q, s_q in CASES:
        g = torch.Generator(device="cuda").manual_seed(0)
        q = torch.randn(b, s_q, h_q, 576, generator=g, device="cuda").to(torch.bfloat16)
        kv = torch.randn(b, n, 1, 576, generator=g, device="cuda").to(torch.bfloat16)
        cache, table = paged_copy(64, kv)
        del kv
        seqlens = torch.full((b,), n, dtype=torch.int32, device="cuda")
        causal = s_q > 1
        q_pad = torch.zeros(b, s_q, PAD_HEADS, 576, dtype=q.dtype, device="cuda")
        plans = {name: flash_mla.get_mla_metadata(seqlens, s_q * heads, 1)
                 for name, heads in (("ours", h_q), ("pad16", PAD_HEADS))}

        def padded():
            q_pad[:, :, :h_q].copy_(q)
            return flash_mla.flash_mla_with_kvcache(q_pad, cache, table, seqlens, 512, *plans["pad16"],
                                                    causal=causal)[0][:, :, :h_q]

        def ours():
            return flash_mla.flash_mla_with_kvcache(q, cache, table, seqlens, 512, *plans["ours"], causal=causal)[0]
        calls = {"ours": ours, "portable": _without_gluon(ours), "pad16": padded}
        _record(rows, dict(b=b, keys=n, h_q=h_q, s_q=s_q), calls, (b * n * 576 + q.numel() + b * s_q * h_q * 512) * 2,
                copy_gbps, out_path)
        del cache, q, q_pad
        torch.cuda.empty_cache()


def fp8(out_path=None):
    import fmha.mla as flash_mla
    from fmha.bench import _without_gluon, paged_copy, sparse_decode_inputs

    copy_gbps, rows = _copy_gbps(), []
    g = torch.Generator(device="cuda").manual_seed(0)
    for case in FP8_CASES:
        if case[0] == "paged":
            _, b, n, h_q, s_q, layout = case
            kv = torch.randn(b, n, 1, 576, generator=g, device="cuda").to(torch.bfloat16)
            cache, table = paged_copy(64, kv)
            del kv
            cache = flash_mla.quantize_kv_cache(cache, layout)
            q = torch.randn(b, s_q, h_q, 576, generator=g, device="cuda").to(torch.bfloat16)
            lens = torch.full((b,), n, dtype=torch.int32, device="cuda")
            plan = flash_mla.get_mla_metadata(lens, s_q * h_q, 1, is_fp8_kvcache=True)

            def ours():
                return flash_mla.flash_mla_with_kvcache(q, cache, table, lens, 512, *plan, causal=s_q > 1,
                                                        is_fp8_kvcache=True)[0]
            nbytes = b * n * cache.shape[-1] + (q.numel() + b * s_q * h_q * 512) * 2
            row = dict(case="paged", b=b, keys=n, h_q=h_q, s_q=s_q, layout=layout)
        else:
            name, b, h_q, s_q, d, layout, topk, page, extra_topk, extra_page = case
            q, cache, lens, sink, kw = sparse_decode_inputs(case, g)
            plan = flash_mla.get_mla_metadata(lens, s_q * h_q, 1, num_heads_q=h_q, topk=topk)

            def ours():
                return flash_mla.flash_mla_with_kvcache(q, cache, None, lens, 512, *plan, attn_sink=sink, **kw)[0]
            nbytes = b * s_q * (topk + extra_topk) * cache.shape[-1] + (q.numel() + b * s_q * h_q * 512) * 2
            row = dict(case=name, b=b, h_q=h_q, s_q=s_q, layout=layout, topk=topk, extra_topk=extra_topk)
        _record(rows, row, {"ours": ours, "portable": _without_gluon(ours)}, nbytes, copy_gbps, out_path)
        del cache, q
        torch.cuda.empty_cache()


if __name__ == "__main__":
    out = sys.argv[sys.argv.index("--out") + 1] if "--out" in sys.argv else None
    (fp8 if len(sys.argv) > 1 and sys.argv[1] == "fp8" else dense)(out)
