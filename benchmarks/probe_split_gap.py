"""Where a split-KV decode call's time goes between its two kernels: the split kernel's duration, the gap from its
end to the combine's start, and the combine's duration, from the CUDA profiler's kernel records (torch.profiler,
one call at a time, each after a synchronise; medians over the calls), on `probe_combine.py`'s decode rows:
long-context GQA decode, b = 1 and 4 at 131k keys, page 64, bf16, d = 128 and 64 (the rows whose combine costs
3.8% / 8.3% of the call: NOTES.md, sixty-ninth session). It tells what a faster combine, or a merge inside the
split kernel (no second launch), could win: the gap and the combine's own time, against the split kernel's.

    PYTHONPATH=src python3 benchmarks/probe_split_gap.py [--calls 30] [--out probe.json]

`--mla`: dense MLA decode rows (b = 128 equal lengths, page 64) instead, ours and FlashMLA's (where importable,
e.g. `PYTHONPATH=src:.peers`): every kernel of a call with its median duration, the gaps between them and the
call's span, at two lengths each, so that the per-call fixed cost (the span's intercept against the length)
can be told apart kernel by kernel.

    PYTHONPATH=src:.peers python3 benchmarks/probe_split_gap.py --mla [--graph] [--calls 30] [--out probe.json]

`--graph`: the calls captured in one CUDA graph and replayed back to back (as `fmha bench` times decode), each
call's period (first kernel's start to the next call's) beside its span.
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


MLA_ROWS = [(128, sk, hq, 1) for hq in (16, 64, 128) for sk in (4096, 16384)]


def _profile(call, calls, graph=False):
    """The kernels (`_kernels`) of `calls` calls after three unprofiled ones: synchronised one at a time, or with
    `graph` replayed back to back from one CUDA graph that holds them all (as `bench_gpu_graph` times them)."""
    for _ in range(3):
        call()
    torch.cuda.synchronize()
    if graph:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(calls):
                call()
        g.replay()
        torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        if graph:
            g.replay()
            torch.cuda.synchronize()
        for _ in range(0 if graph else calls):
            call()
            torch.cuda.synchronize()
    return _kernels(prof)


def _profiled_calls(call, calls, graph=False):
    """`_profile`'s kernels, a list per call of (name, start us, duration us)."""
    ks = _profile(call, calls, graph)
    if not ks or len(ks) % calls:
        raise SystemExit(f"{len(ks)} kernels over {calls} calls: not the same kernels each call")
    per = len(ks) // calls
    return [ks[i:i + per] for i in range(0, len(ks), per)]


def _without_combine(call):
    """`call` with the MLA decode's combine left out (a timing yardstick: right only on whole-planned rows)."""
    from fmha.kernels import mla_decode

    def run():
        real, mla_decode.combine = mla_decode.combine, lambda *a, **k: None
        try:
            return call()
        finally:
            mla_decode.combine = real
    return run


def run_mla(calls, out, graph=False):
    import fmha.mla as ours_mla
    from fmha.bench import mla_peers
    from probe_mla import _dense_inputs
    rows = []
    for b, sk, hq, sq in MLA_ROWS:
        q, cache, table, lens = _dense_inputs(b, sk, hq, sq)
        meta = ours_mla.get_mla_metadata(lens, sq * hq, 1)
        impls = {"ours": lambda: ours_mla.flash_mla_with_kvcache(q, cache, table, lens, 512, *meta)}
        impls["ours_no_combine"] = _without_combine(impls["ours"])
        impls.update({n: build(q, cache, table, lens, sq, hq) for n, build in mla_peers().items()})
        for name, call in impls.items():
            per_call = _profiled_calls(call, calls, graph)
            kernels = [dict(name=k[0][:60], us=statistics.median(c[i][2] for c in per_call))
                       for i, k in enumerate(per_call[0])]
            gaps = [statistics.median(c[i + 1][1] - c[i][1] - c[i][2] for c in per_call)
                    for i in range(len(kernels) - 1)]
            span = statistics.median(c[-1][1] + c[-1][2] - c[0][1] for c in per_call)
            # Back to back (graph): a call's period, from its first kernel's start to the next call's.
            period = statistics.median(d[0][1] - c[0][1] for c, d in zip(per_call, per_call[1:]))
            rows.append(dict(impl=name, b=b, sk=sk, hq=hq, sq=sq, graph=graph, kernels=kernels, gaps_us=gaps,
                             span_us=span, period_us=period, gbps=b * sk * 576 * 2 / span / 1e3))
            print(f"{name:9s} sk={sk:5d} hq={hq:3d} | span {span:7.1f} us ({rows[-1]['gbps']:.0f} GB/s) "
                  f"period {period:7.1f} | "
                  + " + ".join(f"{k['name'][:24]} {k['us']:.1f}" for k in kernels)
                  + (f" | gaps {', '.join(f'{g:.2f}' for g in gaps)}" if gaps else ""), flush=True)
        if out:
            save_sweep(out, rows)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--calls", type=int, default=30)
    p.add_argument("--out", default=None)
    p.add_argument("--mla", action="store_true", help="dense MLA decode, ours and FlashMLA: every kernel of a call")
    p.add_argument("--graph", action="store_true", help="--mla: the calls replayed back to back from a CUDA graph")
    args = p.parse_args()
    if args.mla:
        return run_mla(args.calls, args.out, args.graph)
    rows = []
    for case, _, call in _cases():            # `probe_combine`'s decode rows (its MLA rows follow: not these)
        if case["kind"] != "decode":
            break
        b, d = case["b"], case["d"]
        split, gap, comb, span = [], [], [], []
        ks = [r for r in _profile(call, args.calls) if "attn_fwd_kernel" in r[0] or "combine_kernel" in r[0]]
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
