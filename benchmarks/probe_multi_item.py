"""The multi-item decode experiment (`experiments/multi_item.py`) against the package and cuDNN, one process.

b = 64, hq = 32, hk = 8, 4k keys, d = 128, bf16 (issue 3's bar rows), paged (page 16, 64; pages shuffled) or
contiguous. Variants `ITEMS,BN,WARPS,STAGES[,h]`: the experiment's kernel with that many items a program (`h`: one
item, q loaded once before the loop). Each call is
checked against cuDNN first; GB/s count K and V once plus Q and O; ratios are to cuDNN on the contiguous cache.
`--versions` also times the package with copies of `kernels/forward.py` (e.g. one with `experiments/q_in_loop.patch`
applied: the package's contiguous 16-row form reading q from shared memory each key tile, as this experiment does),
one head a program (the copies' `HEAD_PAIRS` off: the package takes head pairs on these rows); `package-1head` is
the package so.

    PYTHONPATH=src python3 benchmarks/probe_multi_item.py [--pages 64 16 0] [--variants 1,128,4,3 2,128,4,3 ..]
        [--versions forward_q.py ..] [--rounds 2] [--out probe.json]
"""
import argparse
import os
import statistics
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import fmha
from fmha.bench import interleaved_times, load_module_copy, paged_copy, save_sweep
from probe_fp8_decode import _with_forward, _with_settings

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "experiments"))
import multi_item  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--pages", type=int, nargs="*", default=[64, 16])
    p.add_argument("--variants", nargs="*", default=["1,128,4,3", "2,128,4,3", "1,64,4,5", "2,64,4,5"])
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--versions", nargs="*", default=[], metavar="FORWARD.py")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    b, hq, hk, sk, d = args.batch, 32, 8, 4096, 128
    versions = {os.path.splitext(os.path.basename(path))[0]: load_module_copy(path) for path in args.versions}
    for module in versions.values():
        module.HEAD_PAIRS = False
    rows = []
    for page in args.pages:
        torch.manual_seed(0)
        q = torch.randn(b, 1, hq, d, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(b, sk, hk, d, device="cuda", dtype=torch.bfloat16)
        v = torch.randn_like(k)
        lens = torch.full((b,), sk, dtype=torch.int32, device="cuda")
        kc, vc, table = paged_copy(page, k, v) if page else (k, v, None)
        qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)

        def cudnn():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True)

        calls = {"cudnn": cudnn, "package": lambda: fmha.attention_with_kvcache(q, kc, vc, lens, block_table=table)}
        calls["package-1head"] = _with_settings(calls["package"], HEAD_PAIRS=False)
        for vname, module in versions.items():
            calls[f"package@{vname}"] = _with_forward(calls["package"], module)
        for spec in args.variants:
            fields = spec.split(",")
            items, bn, warps, stages = (int(x) for x in fields[:4])
            calls["mi" + spec.replace(",", "_")] = multi_item.launch(q, kc, vc, sk, table, items=items, BN=bn,
                                                                     num_warps=warps, num_stages=stages,
                                                                     q_hoisted=fields[4:] == ["h"])
        ref = cudnn().transpose(1, 2).float()
        for name, call in calls.items():
            err = (call().float().reshape(ref.shape) - ref).abs().max().item()
            assert err < 2e-2, (name, err)
        nbytes = 2 * k.numel() * 2 + 2 * q.numel() * 2
        times = interleaved_times(calls, args.rounds)
        row = dict(b=b, hq=hq, hk=hk, sk=sk, d=d, page=page)
        for name, ts in times.items():
            row[f"{name}_gbps"] = nbytes / statistics.median(ts) / 1e9
            row[f"{name}_vs_cudnn"] = row[f"{name}_gbps"] / row["cudnn_gbps"] if name != "cudnn" else 1.0
        rows.append(row)
        print(f"page={page or '-':<3} cudnn {row['cudnn_gbps']:7.1f} | "
              + " | ".join(f"{n} {row[n + '_gbps']:7.1f} ({row[n + '_vs_cudnn']:.3f})" for n in calls if n != "cudnn"),
              flush=True)
        del k, v, calls
        torch.cuda.empty_cache()
        if args.out:
            save_sweep(args.out, rows)


if __name__ == "__main__":
    main()
