"""The decode experiments (`experiments/multi_item.py`, `experiments/gluon_decode.py`) against the package and
cuDNN, one process.

b = 64, hq = 32, hk = 8, 4k keys, d = 128, bf16 (issue 3's bar rows), paged (page 16, 64; pages shuffled) or
contiguous. Variants `ITEMS,BN,WARPS,STAGES[,h]`: the experiment's kernel with that many items a program (`h`: one
item, q loaded once before the loop). Each call is
checked against cuDNN first; GB/s count K and V once plus Q and O; ratios are to cuDNN on the contiguous cache.
`--versions` also times the package with copies of `kernels/forward.py` (e.g. one with `experiments/q_in_loop.patch`
applied: the package's contiguous 16-row form reading q from shared memory each key tile, as this experiment does),
one head a program (the copies' `HEAD_PAIRS` off: the package takes head pairs on these rows); `package-1head` is
the package so.
`--gluon BN,STAGES[,r | ,wN[,hH] | ,sR]` (paged pages only): the Gluon kernels with BN-key tiles in a ring of
STAGES, the wgmma form (`r`: its copies only, no math: the ring's read rate), with `wN` the mma.sync form on N
warps (`hH`: H KV heads a program, 2 unless said), with `sR` the warp-specialised form (consumers at R registers);
each is also checked against the package on ragged lengths with NaN past each end. `--read` times
`kernels.kv_read` on the same cache (the bench's yardstick). Rows keep every round's rate (`_rounds`).

    PYTHONPATH=src python3 benchmarks/probe_multi_item.py [--pages 64 16 0] [--variants 1,128,4,3 2,128,4,3 ..]
        [--versions forward_q.py ..] [--gluon 32,2,w4 ..] [--read] [--rounds 2] [--out probe.json]
"""
import argparse
import os
import statistics
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import fmha
from fmha.bench import interleaved_times, kv_read_call, load_module_copy, paged_copy, save_sweep
from probe_fp8_decode import _with_forward, _with_settings

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "experiments"))
import gluon_decode  # noqa: E402
import multi_item  # noqa: E402


def _gluon(q, kc, vc, lens, table, spec):
    """A `--gluon` variant's callable."""
    bn, stages, *rest = spec.split(",")
    opts = dict(block_n=int(bn), stages=int(stages))
    if rest == ["r"]:
        opts.update(compute=False)
    elif rest and rest[0].startswith("s"):
        opts.update(ws_regs=int(rest[0][1:]))
    elif rest:
        opts.update(mma=2, warps=int(rest[0][1:]), heads=int(rest[1][1:]) if len(rest) > 1 else 2)
    return gluon_decode.launch(q, kc, vc, lens, table, **opts)


def _ragged_check(q, k, v, page, specs):
    """Each computing `--gluon` variant against the package on lengths 1 .. sk with NaN past each end."""
    b, sk = k.shape[:2]
    lens = torch.randint(1, sk + 1, (b,), dtype=torch.int32, device=q.device)
    lens[0], lens[1] = 1, sk
    past = torch.arange(sk, device=q.device)[None, :] >= lens[:, None].long()
    kn, vn = k.clone(), v.clone()
    kn[past], vn[past] = float("nan"), float("nan")
    kc, vc, table = paged_copy(page, kn, vn)
    want = fmha.attention_with_kvcache(q, kc, vc, lens, block_table=table).float()
    for spec in specs:
        if not spec.endswith(",r"):
            err = (_gluon(q, kc, vc, lens, table, spec)().float() - want).abs().max().item()
            assert err < 2e-2, (spec, "ragged", err)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--pages", type=int, nargs="*", default=[64, 16])
    p.add_argument("--variants", nargs="*", default=["1,128,4,3", "2,128,4,3", "1,64,4,5", "2,64,4,5"])
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--versions", nargs="*", default=[], metavar="FORWARD.py")
    p.add_argument("--gluon", nargs="*", default=[])
    p.add_argument("--read", action="store_true")
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
        if page and args.gluon:
            _ragged_check(q, k, v, page, args.gluon)
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
        if args.read:
            calls["read"], whole = kv_read_call(kc, vc, table, sk)
            assert whole, "the pure read did not fold every word of the cache"
        for spec in args.gluon if page else []:
            calls["g" + spec.replace(",", "_")] = _gluon(q, kc, vc, lens, table, spec)
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
