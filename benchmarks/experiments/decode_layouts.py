"""16-bit KV-cache calls with the paged caches in engines' layouts (FlashInfer's NHD kv pages, K and V of a page side
by side in one tensor; its heads-major HND pages) against the same values in plain contiguous pages, one process:
whether a cache laid out as an engine allocates it costs speed. The portable kernel reads any strides by pointers;
the Gluon kernel (`forward_sm90`, chunked prefill over a cache) takes them through `tma_view`. The FP8 decode's
counterpart is `fp8_gluon_decode.py layouts`, whose `_laid_out` and `_gbps` this uses.

    PYTHONPATH=src:benchmarks/experiments python3 benchmarks/experiments/decode_layouts.py --out F.json   (GPU)

Medians of three interleaved rounds of CUDA-graph replays (`fmha.bench.interleaved_times`); GB/s of the K and V
bytes read once plus Q and O (issue 3's count).
"""
import json
import os
import sys

import torch

# (d, b, keys, seqlen_q, query heads, KV heads, causal, page): issue 3's b = 64 decode at pages 16 / 64, its split
# b = 4 at 131k and MHA, d = 64 and 256, and a chunked prefill of 128 causal tokens (the Gluon kernel's, over a cache)
CASES = [(128, 64, 4096, 1, 32, 8, False, 16), (128, 64, 4096, 1, 32, 8, False, 64),
         (128, 4, 131072, 1, 32, 8, False, 64), (128, 32, 8192, 1, 32, 32, False, 64),
         (64, 64, 4096, 1, 32, 8, False, 64), (256, 64, 4096, 1, 32, 8, False, 64),
         (128, 16, 4096, 128, 32, 8, True, 64)]
LAYOUTS = ("plain", "kv_pages", "hnd")


def main(out_path=None):
    import fmha
    from fmha.bench import paged_copy
    from fp8_gluon_decode import _gbps, _laid_out, _outputs

    rows = []
    for d, b, n, s_q, h_q, h_k, causal, page in CASES:
        g = torch.Generator(device="cuda").manual_seed(0)
        q = torch.randn(b, s_q, h_q, d, generator=g, device="cuda").to(torch.bfloat16)
        k, v = (torch.randn(b, n, h_k, d, generator=g, device="cuda").to(torch.bfloat16) for _ in range(2))
        perm = torch.randperm(b * -(-n // page), generator=g, device="cuda")
        kc, vc, table = paged_copy(page, k, v, perm=perm)
        del k, v
        seqlens = torch.full((b,), n, dtype=torch.int32, device="cuda")
        caches = _laid_out(kc, vc)
        del kc, vc
        calls = {layout: (lambda layout=layout: fmha.attention_with_kvcache(
            q, *caches[layout], seqlens, block_table=table, causal=causal)) for layout in LAYOUTS}
        outs, ran = _outputs(calls)
        errs = {layout: (out - outs["plain"]).abs().max().item() for layout, out in outs.items()}
        assert max(errs.values()) < 2e-2, errs
        nbytes = (2 * b * n * h_k * d + 2 * q.numel()) * 2
        gbps, rounds = _gbps(calls, nbytes)
        rows.append(dict(d=d, b=b, keys=n, s_q=s_q, h_q=h_q, h_k=h_k, causal=causal, page=page, errs=errs,
                         kernels=ran, **{f"{layout}_gbps": x for layout, x in gbps.items()},
                         kv_pages_vs_plain=gbps["kv_pages"] / gbps["plain"], hnd_vs_plain=gbps["hnd"] / gbps["plain"],
                         rounds=rounds))
        print(f"d={d} b={b} keys={n} s_q={s_q} h_q={h_q} h_k={h_k} page={page}: "
              + " ".join(f"{layout} {x:.0f}" for layout, x in gbps.items())
              + f" GB/s; kv_pages/plain {rows[-1]['kv_pages_vs_plain']:.3f} hnd/plain {rows[-1]['hnd_vs_plain']:.3f}"
              + f" {ran}", flush=True)
        if out_path:              # after every case: a timeout later keeps what ran
            json.dump(dict(gpu=torch.cuda.get_device_name(), commit=os.environ.get("FMHA_COMMIT", "unknown"),
                           rows=rows), open(out_path, "w"), indent=1)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main(sys.argv[sys.argv.index("--out") + 1] if "--out" in sys.argv else None)
