"""One process: the 64-row decode forms at d = 64 with Triton's `maxnreg` capped at 128, for four 4-warp programs an
SM, against the package's own (the ninety-second session's next step; run in the ninety-third,
history/rows64_cap_h200_0978768.json, before the package took the cap: `forward._GPU_MAXNREG`; since then
`--caps 0` measures the forms uncapped; in history/rows64_cap_confirm_h200_c442fbc.json, run before a fix of the
column names, "ours_gbps" alternates capped / uncapped, and "ours_regs" and "ours_maxdiff" are the uncapped's).

Why: the paged d = 64 64-row form (64, 64, 4, 3) sits at the edge of 128 registers, and whatever pushes it past
costs a program an SM and a quarter of its read. Compiled for sm_90 on the CPU (benchmarks/experiments/
split_compile.py): one token as the constant seqlen_q = 1 142 registers (the package now launches an unspecialised
twin there, 127), 16 causal query tokens on 16-key pages 150 (measured: 2682 GB/s causal against 3590 unmasked,
history/probe_rows64_d64_spec16_h200_b0476d1.json), an FP8 cache unspecialised 140 (paged 1190 GB/s against 1838
with the constant, history/probe_rows64_d64_confirm_h200_122dc5a.json) and contiguous 144 / 159 (unspecialised /
constant; 1893 against 1479 GB/s of FP8 bytes). Capped at 128, ptxas fits all of these with no spills (STACK 0)
except the constant-seqlen_q bf16 paged form and 16 causal tokens with seqlen_q = 1 (8 bytes of stack).

    PYTHONPATH=src FMHA_COMMIT=... python3 benchmarks/experiments/rows64_cap.py [--caps 0 128 twin const twin_all]
        [--more | --narrow | --rows32] [--cap-tile M,N,W] [--head-dim 64] [--only 0 1 ...] [--out f.json]

Variants beside the package's ("ours"): a cap (0: uncapped) on the 64-row forms at the head dim, "twin" (one-token
64-row launches on the seqlen_q-unspecialised twin, FP8 too: the package's since fca6043), "twin_all" (every
one-token launch on it, the narrow forms too), "const" (one-token launches with seqlen_q the constant 1).

Cases: (query tokens, query heads over 8 KV heads, page or None, FP8, causal), b = 64 at 4k keys, and b = 4 at 131k
keys (split) for the first two. GB/s of the cache's bytes (FP8 bytes for FP8) plus q and out."""
import argparse

import torch

import fmha
from fmha.bench import bench_gpu_graph, paged_copy, quantize_fp8, save_sweep
from fmha.kernels import forward, launch

D, HK = 64, 8
CASES = [(1, 512, 64, False, False, 64, 4096), (1, 512, None, False, False, 64, 4096),
         (1, 512, 64, True, False, 64, 4096), (1, 512, None, True, False, 64, 4096),
         (16, 32, 16, False, True, 64, 4096), (16, 32, 16, False, False, 64, 4096),
         (16, 32, 64, False, True, 64, 4096), (16, 32, None, False, True, 64, 4096),
         (1, 512, 64, False, False, 4, 131072), (16, 32, 64, False, True, 4, 131072)]
# --more: FP8 at 16 tokens (140-148 registers uncapped), contiguous split (bf16 16 tokens 135, one token 143), and
# causal 16 tokens on 16-key pages split.
MORE = [(16, 32, 64, True, False, 64, 4096), (16, 32, None, True, False, 64, 4096),
        (16, 32, None, False, False, 4, 131072), (1, 512, None, False, False, 4, 131072),
        (16, 32, 16, False, True, 4, 32768)]
# --narrow: one token over an FP8 cache in the narrow (16-row, mma.sync) forms, which keep the constant seqlen_q = 1:
# GQA 8 (8 rows) on 16- / 64-key pages, contiguous, and split (b = 4 at 131k keys); GQA 4 (4 rows) on 64-key pages.
NARROW = [(1, 64, 16, True, False, 64, 4096), (1, 64, 64, True, False, 64, 4096), (1, 64, None, True, False, 64, 4096),
          (1, 64, 64, True, False, 4, 131072), (1, 32, 64, True, False, 64, 4096)]
# --rows32: FP8 caches at 32 packed rows (4 causal tokens of a GQA group of 8), contiguous, 64-key pages, and b = 4
# at 131k keys (split); with --cap-tile 32,64,2 the caps apply to those forms' tiles (the sm_90 occupancy sweep:
# contiguous (32, 64, 2, 4) at 168 registers, six programs an SM, 144 for seven).
# Cases 3-5 (the second process, with the package's cap of 144 on the contiguous form): 4 tokens unmasked, one token
# of 256 query heads (32 rows), b = 1 at 131k keys (split). Case 6: 64-key pages at b = 4 with 131k keys (split), for
# the paged form's tile (32, 128, 2, 4) at 255 registers, four programs an SM (--cap-tile 32,128,2).
ROWS32 = [(4, 64, None, True, True, 64, 4096), (4, 64, 64, True, True, 64, 4096), (4, 64, None, True, True, 4, 131072),
          (4, 64, None, True, False, 64, 4096), (1, 256, None, True, False, 64, 4096),
          (4, 64, None, True, True, 1, 131072), (4, 64, 64, True, True, 4, 131072)]
_plan = forward._portable_plan
CAP = [None]
CAP_TILE = [(64, None, None)]     # (BLOCK_M, BLOCK_N, num_warps) the caps apply to, None: any
KERNELS = ("twin", "const", "twin_all")   # the variants that pick the one-token kernel rather than a cap


def _capped(*a, **kw):
    """`_portable_plan` with maxnreg = CAP on the 64-row forms at head dim D (0: none; CAP_TILE's tiles with
    --cap-tile), or with CAP "twin" the seqlen_q-unspecialised twin on every one-token 64-row launch (FP8 caches
    too), with "twin_all" on every one-token launch (the narrow forms too), with "const" none (seqlen_q = 1 a
    constant)."""
    plan = _plan(*a, **kw)
    if CAP[0] == "twin_all":
        if kw["seqlen_q"] == 1:
            plan.kernel = forward._forward_kernel(64, 1)
    elif CAP[0] in KERNELS:
        if kw["seqlen_q"] == 1 and plan.meta["BLOCK_M"] == 64:
            plan.kernel = forward._forward_kernel(64, 1) if CAP[0] == "twin" else forward.attn_fwd_kernel
    elif CAP[0] is not None and plan.meta["HEAD_DIM_QK"] == D and all(
            want is None or plan.meta[key] == want
            for key, want in zip(("BLOCK_M", "BLOCK_N", "num_warps"), CAP_TILE[0])):
        plan.meta = {**plan.meta, "maxnreg": CAP[0]}
        if not CAP[0]:
            del plan.meta["maxnreg"]
        plan.fixed = (plan.fixed[0], tuple(plan.meta.items())) if plan.fixed else plan.fixed
    return plan


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--caps", nargs="*", default=["128", "twin"])
    p.add_argument("--out", default=None)
    p.add_argument("--more", action="store_true", help="the second run's cases: FP8 16 tokens, contiguous split")
    p.add_argument("--narrow", action="store_true", help="the one-token FP8 cases of the narrow forms (alone)")
    p.add_argument("--rows32", action="store_true", help="FP8 caches at 32 packed rows (alone)")
    p.add_argument("--cap-tile", default=None, help="M,N,W: the tiles the caps apply to (default: 64-row forms)")
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--only", type=int, nargs="*", default=None, help="indices of the cases to run")
    args = p.parse_args()
    global D
    D = args.head_dim
    forward._portable_plan = _capped
    rows = []
    if args.cap_tile:
        CAP_TILE[0] = tuple(int(x) for x in args.cap_tile.split(","))
    cases = NARROW if args.narrow else ROWS32 if args.rows32 else CASES + MORE if args.more else CASES
    for sq, hq, page, fp8, causal, b, sk in [cases[i] for i in args.only] if args.only is not None else cases:
        torch.manual_seed(0)
        q = torch.randn(b, sq, hq, D, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(b, sk, HK, D, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(b, sk, HK, D, device="cuda", dtype=torch.bfloat16)
        descales = {}
        if fp8:
            (k, descales["k_descale"]), (v, descales["v_descale"]) = quantize_fp8(k, HK), quantize_fp8(v, HK)
        kc, vc, table = (k, v, None) if page is None else paged_copy(page, k, v, perm=torch.randperm(
            b * (sk // page), device="cuda"))
        lens = torch.full((b,), sk, dtype=torch.int32, device="cuda")
        nbytes = 2 * k.numel() * k.element_size() + 2 * q.numel() * 2
        call = lambda: fmha.attention_with_kvcache(q, kc, vc, lens, block_table=table, causal=causal, **descales)
        forward._PLANS.clear()
        ref = call().float()
        row = dict(d=D, sq=sq, hq=hq, hk=HK, page=page or 0, fp8=fp8, causal=causal, b=b, sk=sk)
        caps = [c if c in KERNELS else int(c) for c in args.caps if c not in KERNELS or sq == 1]
        for _ in range(args.rounds):
            for cap in [None, *caps]:
                CAP[0] = cap
                forward._PLANS.clear()
                name = cap if cap in KERNELS else "ours" if cap is None else f"cap{cap}"
                launch._COMPILED.clear()
                row[f"{name}_maxdiff"] = (call().float() - ref).abs().max().item()
                row[f"{name}_regs"] = sorted(kernel.n_regs for (fn, *_), (kernel, _) in launch._COMPILED.items()
                                             if fn in (forward.attn_fwd_kernel, *forward._UNSPECIALISED_Q.values()))
                row.setdefault(f"{name}_gbps", []).append(nbytes / bench_gpu_graph(call) / 1e9)
        CAP[0] = None
        forward._PLANS.clear()
        rows.append(row)
        print(row, flush=True)
    if args.out:
        save_sweep(args.out, rows)


if __name__ == "__main__":
    main()
