"""The Gluon paged decode experiment (`experiments/gluon_decode.py`) against the package, cuDNN and the pure read.

b = 64, hq = 32, hk = 8, 4k keys, d = 128, bf16 (issue 3's bar rows), paged (page 16, 64; pages shuffled as
`fmha bench decode` shuffles them). Variants `BN,STAGES[,r | ,wN[,hH] | ,sR]`: the experiment with BN-key tiles in a ring of STAGES,
its wgmma kernel (`r`: the copies only, no math: the ring's read rate) or with `wN` its mma.sync kernel on N warps
(`hH`: H KV heads a program, 2 unless said), with `sR` its warp-specialised kernel (consumers at R registers). `read` is `kernels.kv_read` on the same paged cache (the
bench's yardstick). Every computing call is checked first: against cuDNN on the full cache, and against the package
on ragged lengths with NaN past each sequence's end. GB/s count K and V once plus Q and O; ratios are to cuDNN on the
contiguous cache.

    PYTHONPATH=src python3 benchmarks/probe_gluon_decode.py [--pages 16 64] [--variants 64,3 32,6 ..]
        [--rounds 3] [--out probe.json]
"""
import argparse
import os
import statistics
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import fmha
from fmha.bench import interleaved_times, kv_read_call, paged_copy, save_sweep

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "experiments"))
import gluon_decode  # noqa: E402


def _ragged_check(q, k, v, page, variants):
    """The experiment against the package on lengths 1 .. 4096 with NaN past each end (and in unused pages)."""
    b, sk = k.shape[:2]
    lens = torch.randint(1, sk + 1, (b,), dtype=torch.int32, device=q.device)
    lens[0], lens[1] = 1, sk
    past = torch.arange(sk, device=q.device)[None, :] >= lens[:, None].long()
    kn, vn = k.clone(), v.clone()
    kn[past], vn[past] = float("nan"), float("nan")
    kc, vc, table = paged_copy(page, kn, vn)
    want = fmha.attention_with_kvcache(q, kc, vc, lens, block_table=table).float()
    for spec in variants:
        if spec.endswith(",r"):
            continue
        got = _variant(q, kc, vc, lens, table, spec)().float()
        err = (got - want).abs().max().item()
        assert err < 2e-2, (spec, "ragged", err)


def _variant(q, kc, vc, lens, table, spec):
    bn, stages, *rest = spec.split(",")
    opts = dict(block_n=int(bn), stages=int(stages))
    if rest == ["r"]:
        opts.update(compute=False)
    elif rest and rest[0].startswith("s"):
        opts.update(ws_regs=int(rest[0][1:]))
    elif rest:
        opts.update(mma=2, warps=int(rest[0][1:]), heads=int(rest[1][1:]) if len(rest) > 1 else 2)
    return gluon_decode.launch(q, kc, vc, lens, table, **opts)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--pages", type=int, nargs="*", default=[16, 64])
    p.add_argument("--variants", nargs="*", default=["64,3", "32,4", "32,6", "64,3,r", "32,6,r"])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    b, hq, hk, sk, d = 64, 32, 8, 4096, 128
    rows = []
    for page in args.pages:
        torch.manual_seed(0)
        q = torch.randn(b, 1, hq, d, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(b, sk, hk, d, device="cuda", dtype=torch.bfloat16)
        v = torch.randn_like(k)
        lens = torch.full((b,), sk, dtype=torch.int32, device="cuda")
        _ragged_check(q, k, v, page, args.variants)
        kc, vc, table = paged_copy(page, k, v)
        qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)

        def cudnn():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True)

        calls = {"cudnn": cudnn, "package": lambda: fmha.attention_with_kvcache(q, kc, vc, lens, block_table=table)}
        calls["read"] = kv_read_call(kc, vc, table, sk)[0]
        for spec in args.variants:
            calls["g" + spec.replace(",", "_")] = _variant(q, kc, vc, lens, table, spec)
        ref = cudnn().transpose(1, 2).float()
        for name, call in calls.items():
            if name == "read" or name.endswith("_r"):
                continue
            err = (call().float().reshape(ref.shape) - ref).abs().max().item()
            assert err < 2e-2, (name, err)
        nbytes = 2 * k.numel() * 2 + 2 * q.numel() * 2
        times = interleaved_times(calls, args.rounds)
        row = dict(b=b, hq=hq, hk=hk, sk=sk, d=d, page=page)
        for name, ts in times.items():
            row[f"{name}_gbps"] = nbytes / statistics.median(ts) / 1e9
            row[f"{name}_rounds"] = [nbytes / t / 1e9 for t in ts]
            row[f"{name}_vs_cudnn"] = row[f"{name}_gbps"] / row["cudnn_gbps"]
        rows.append(row)
        print(f"page={page:<3} " + " | ".join(f"{n} {row[n + '_gbps']:7.1f} ({row[n + '_vs_cudnn']:.3f})"
                                              for n in calls), flush=True)
        del k, v, calls
        torch.cuda.empty_cache()
        if args.out:
            save_sweep(args.out, rows)


if __name__ == "__main__":
    main()
