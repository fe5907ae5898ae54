"""MLA decode with few packed query rows (h_q * s_q < 16: DeepSeek's 128 heads over tensor parallelism of 16 or 32
ranks leave 8 or 4 a rank): the package's call ("ours"), the portable `triton.language` kernel on it ("portable",
which the package ran below 16 rows until the Gluon kernel took them), and the call with q's heads padded to 16
(zeros; the output's first h_q heads kept: "pad16", the Gluon kernel's 16-row form). One process, bf16, page 64
shuffled, FlashMLA's bytes (the cache read once + Q + O of the real heads); the GPU's copy bandwidth measured in the
same run (`fmha.bench.gpu_ceilings`).

    PYTHONPATH=src:benchmarks/experiments python3 benchmarks/experiments/mla_few_heads.py --out F.json   (GPU)

Medians of three interleaved rounds of CUDA-graph replays (`fp8_gluon_decode._gbps`).
"""
import json
import os
import sys

import torch

# (b, keys, h_q, s_q): TP 16 / 32 ranks' heads, MTP's s_q = 2, and h_q = 16 (the Gluon kernel's already) as a yardstick
CASES = [(128, n, h_q, s_q) for n in (4096, 16384) for h_q, s_q in ((1, 1), (4, 1), (8, 1), (4, 2), (8, 2), (16, 1))]
PAD_HEADS = 16


def main(out_path=None):
    import fmha.mla as flash_mla
    from fmha.bench import _portable_mla, gpu_ceilings, paged_copy
    from fmha.kernels import launch
    from fp8_gluon_decode import _gbps

    copy_gbps = gpu_ceilings()["copy_gbps"]
    print(f"{torch.cuda.get_device_name()}: copy {copy_gbps:.0f} GB/s", flush=True)
    rows = []
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
            out, lse = flash_mla.flash_mla_with_kvcache(q_pad, cache, table, seqlens, 512, *plans["pad16"],
                                                        causal=causal)
            return out[:, :, :h_q], lse[:, :h_q]

        calls = {"ours": lambda: flash_mla.flash_mla_with_kvcache(q, cache, table, seqlens, 512, *plans["ours"],
                                                                  causal=causal)[0],
                 "portable": _portable_mla(q, cache, table, seqlens, *plans["ours"], causal), "pad16": lambda: padded()[0]}
        ran, results = {}, {}
        for name, call in calls.items():
            launch.RECORD = []
            results[name] = call().float()
            ran[name] = sorted({kernel for kernel, _, _ in launch.RECORD})
        launch.RECORD = None
        err = max((results[name] - results["ours"]).abs().max().item() for name in calls)
        assert err < 2e-2, err
        nbytes = (b * n * 576 + q.numel() + b * s_q * h_q * 512) * 2
        gbps, rounds = _gbps(calls, nbytes)
        rows.append(dict(b=b, keys=n, h_q=h_q, s_q=s_q, err=err, kernels=ran, copy_gbps=copy_gbps,
                         **{f"{name}_gbps": x for name, x in gbps.items()},
                         **{f"{name}_frac_copy": x / copy_gbps for name, x in gbps.items()},
                         ours_vs_portable=gbps["ours"] / gbps["portable"], pad16_vs_ours=gbps["pad16"] / gbps["ours"],
                         rounds=rounds))
        print(f"b={b} keys={n} h_q={h_q} s_q={s_q}: " + " ".join(f"{k} {x:.0f}" for k, x in gbps.items())
              + " GB/s (copy fracs " + " / ".join(f"{x / copy_gbps:.3f}" for x in gbps.values())
              + f"; ours/portable {rows[-1]['ours_vs_portable']:.3f}, pad16/ours {rows[-1]['pad16_vs_ours']:.3f})"
              + f" err {err:.1e} {ran}", flush=True)
        if out_path:              # after every case: a timeout later keeps what ran
            json.dump(dict(gpu=torch.cuda.get_device_name(), commit=os.environ.get("FMHA_COMMIT", "unknown"),
                           rows=rows), open(out_path, "w"), indent=1)
        del cache, q, q_pad, results
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main(sys.argv[sys.argv.index("--out") + 1] if "--out" in sys.argv else None)
