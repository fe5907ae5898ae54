"""Where a split-KV decode call's time goes between its two kernels: the split kernel's duration, the gap from its
end to the combine's start, and the combine's duration, from the CUDA profiler's kernel records (torch.profiler,
one call at a time, each after a synchronise; medians over the calls). Long-context GQA decode, b = 1 and 4 at
131k keys, page 64, bf16, d = 128 and 64 (the rows whose combine costs 3.8% / 8.3% of the call: NOTES.md,
sixty-ninth session). It tells a merge inside the split kernel (no second launch) what it could win: the gap and
the combine's own time, against the split kernel's.

    PYTHONPATH=src python3 benchmarks/probe_split_gap.py [--calls 30] [--out probe.json]
"""
import argparse
import statistics

import torch
from torch.profiler import ProfilerActivity, profile

import fmha
from fmha.bench import paged_copy, save_sweep

CASES = [(1, 32, 8, 131072, 128), (4, 32, 8, 131072, 128), (1, 32, 8, 131072, 64)]


def _kernels(prof):
    """(name, start us, duration us) of each kernel the profiler recorded, in start order."""
    rows = [(e.name, e.time_range.start, e.time_range.end - e.time_range.start)
            for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return sorted(rows, key=lambda r: r[1])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--calls", type=int, default=30)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    rows = []
    for b, hq, hk, sk, d in CASES:
        torch.manual_seed(0)
        q = torch.randn(b, 1, hq, d, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(b, sk, hk, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        kc, vc, table = paged_copy(64, k, v)
        lens = torch.full((b,), sk, dtype=torch.int32, device="cuda")
        call = lambda: fmha.attention_with_kvcache(q, kc, vc, lens, block_table=table)  # noqa: E731
        for _ in range(3):
            call()
        torch.cuda.synchronize()
        split, gap, comb, span = [], [], [], []
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(args.calls):
                call()
                torch.cuda.synchronize()
        ks = [r for r in _kernels(prof) if "attn_fwd_kernel" in r[0] or "combine_kernel" in r[0]]
        for a, c in zip(ks, ks[1:]):
            if "attn_fwd_kernel" in a[0] and "combine_kernel" in c[0]:
                split.append(a[2])
                gap.append(c[1] - (a[1] + a[2]))
                comb.append(c[2])
                span.append(c[1] + c[2] - a[1])
        if not split:
            raise SystemExit(f"b={b} d={d}: no split kernel followed by a combine in the profile ({len(ks)} kernels)")
        med = {n: statistics.median(x) for n, x in (("split_us", split), ("gap_us", gap), ("combine_us", comb),
                                                    ("span_us", span))}
        rows.append(dict(b=b, hq=hq, hk=hk, sk=sk, d=d, pairs=len(split), **med))
        print(f"b={b} d={d:3d} | split {med['split_us']:7.1f} us  gap {med['gap_us']:5.2f}  combine "
              f"{med['combine_us']:5.2f}  span {med['span_us']:7.1f} | (gap + combine) / span "
              f"{(med['gap_us'] + med['combine_us']) / med['span_us']:.3f}", flush=True)
    if args.out:
        save_sweep(args.out, rows)


if __name__ == "__main__":
    main()
