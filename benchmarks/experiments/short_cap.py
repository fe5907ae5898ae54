"""One process: the short launch's two forms at d = 64 (narrow (16, 64, 4, 4) + 64-row (64, 64, 4, 3), packed K with
seqused_k, no block table) under Triton's maxnreg = 128 against uncapped. `occupancy_sweep.py` compiles them to
134 registers, three programs an SM by registers where their 56 KB of shared memory fit four; the package's cap
(`forward._GPU_MAXNREG`) is keyed by the first form's tiles, so it leaves these uncapped.

    PYTHONPATH=src FMHA_COMMIT=... python3 benchmarks/experiments/short_cap.py [--rounds 3] [--out f.json]

Cases: decodes and short chunks (COUNTxROWS query rows), 32 / 8 heads, 4k keys a sequence, causal, bf16, CUDA-graph
replays; TFLOP/s over the visible pairs. Each row records which launches ran with WIDE forms (`wide_launches`).

Run once (history/short_cap_d64_h200_8519203.json): the causal two-form launch took 156 registers uncapped, and
capped at 128 it lost (64 decodes + 2 x 48 rows 32.9 -> 32.0 TFLOP/s, 32 decodes + 32 x 20 115.6 -> 108.4, 128
decodes + 1 x 40 level): the package leaves those launches uncapped."""
import argparse

import torch

import fmha
from fmha.bench import attention_flops, bench_gpu_graph, save_sweep
from fmha.kernels import forward, launch

CASES = [((64, 1), (2, 48)), ((32, 1), (32, 20)), ((128, 1), (1, 40)), ((32, 1), (32, 12)), ((16, 16), (16, 8))]
_plan = forward._portable_plan
CAP = [0]


def _capped(*a, **kw):
    plan = _plan(*a, **kw)
    if CAP[0] and "WIDE" in plan.meta and plan.meta["HEAD_DIM_QK"] == 64:
        plan.meta = {**plan.meta, "maxnreg": CAP[0]}
        plan.fixed = (plan.fixed[0], tuple(plan.meta.items())) if plan.fixed else plan.fixed
    return plan


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    forward._portable_plan = _capped
    hq, hk, d, ctx = 32, 8, 64, 4096
    rows = []
    for groups in CASES:
        torch.manual_seed(0)
        lens_q = [n for count, n in groups for _ in range(count)]
        b = len(lens_q)
        cu_q = torch.tensor([0, *torch.tensor(lens_q).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
        cu_k = torch.arange(0, (b + 1) * ctx, ctx, dtype=torch.int32, device="cuda")
        q = torch.randn(sum(lens_q), hq, d, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(b * ctx, hk, d, device="cuda", dtype=torch.bfloat16)
        v = torch.randn_like(k)
        used = torch.full((b,), ctx, dtype=torch.int32, device="cuda")
        call = lambda: fmha.attention_varlen(q, k, v, cu_q, cu_k, max(lens_q), ctx, causal=True, seqused_k=used)
        flops = sum(attention_flops(1, n, ctx, hq, d, d, causal=True) for n in lens_q)
        row = dict(groups=" ".join(f"{c}x{n}" for c, n in groups), heads=f"{hq}/{hk}", d=d, ctx=ctx)
        forward._PLANS.clear()
        ref = call().float()
        for _ in range(args.rounds):
            for cap in (0, 128):
                CAP[0] = cap
                forward._PLANS.clear()
                launch._COMPILED.clear()
                launch.RECORD = []
                row[f"cap{cap}_maxdiff"] = (call().float() - ref).abs().max().item()
                row[f"cap{cap}_wide_launches"] = sum("WIDE" in meta for _, _, meta in launch.RECORD)
                launch.RECORD = None
                row[f"cap{cap}_regs"] = sorted(kernel.n_regs for _, (kernel, _) in launch._COMPILED.items())
                row.setdefault(f"cap{cap}_tflops", []).append(flops / bench_gpu_graph(call) / 1e12)
        CAP[0] = 0
        forward._PLANS.clear()
        rows.append(row)
        print(row, flush=True)
    if args.out:
        save_sweep(args.out, rows)


if __name__ == "__main__":
    main()
