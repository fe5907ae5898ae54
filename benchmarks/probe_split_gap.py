"""Where a split-KV decode call's time goes between its two kernels: the split kernel's duration, the gap from its
end to the combine's start, and the combine's duration, from the CUDA profiler's kernel records (torch.profiler,
one call at a time, each after a synchronise; medians over the calls), on `probe_combine.py`'s decode rows:
long-context GQA decode, b = 1 and 4 at 131k keys, page 64, bf16, d = 128 and 64 (the rows whose combine costs
3.8% / 8.3% of the call: NOTES.md, sixty-ninth session). It tells what a faster combine, or a merge inside the
split kernel (no second launch), could win: the gap and the combine's own time, against the split kernel's.

    PYTHONPATH=src python3 benchmarks/probe_split_gap.py [--calls 30] [--out probe.json]
"""
import argparse
import statistics

import torch
from torch.profiler import ProfilerActivity, profile

from fmha.bench import save_sweep
from probe_combine import _cases


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
    for case, _, call in _cases():            # `probe_combine`'s decode rows (its MLA rows follow: not these)
        if case["kind"] != "decode":
            break
        b, d = case["b"], case["d"]
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
        rows.append(dict(case, pairs=len(split), **med))
        print(f"b={b} d={d:3d} | split {med['split_us']:7.1f} us  gap {med['gap_us']:5.2f}  combine "
              f"{med['combine_us']:5.2f}  span {med['span_us']:7.1f} | (gap + combine) / span "
              f"{(med['gap_us'] + med['combine_us']) / med['span_us']:.3f}", flush=True)
    if args.out:
        save_sweep(args.out, rows)


if __name__ == "__main__":
    main()
