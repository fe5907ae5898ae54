"""A/B of a refactor of the Gluon kernels: the package's `fp8_decode_sm90` and `forward_sm90` against older copies of
those files (`git show REV:src/fmha/kernels/fp8_decode_sm90.py > old_fp8_decode_sm90.py`, likewise forward_sm90;
loaded by `fmha.bench.load_module_copy`, as `probe_combine.py` does), in one process, on the same inputs, through the
kernels' own entry points (`fp8_decode_forward_sm90`, `attention_forward_sm90`). Written in the hundred-and-second
session for the review mends of 7d0dc4f (the FP8 decode's softmax through `forward_sm90._softmax_tile`, the mbarrier
helper `bars` in the prefill and FP8 decode kernels).

    python3 benchmarks/experiments/mend_ab.py --old-fp8 OLD_FP8.py --old-prefill OLD_FWD.py --out F.json   (GPU)
    python3 benchmarks/experiments/mend_ab.py --old-fp8 OLD_FP8.py --fp8 0 1 3 --rounds 9 --old-first --out F.json

Each case: the largest difference between the two outputs (the refactor should leave them bitwise equal), and
medians of five interleaved rounds (or --rounds) of CUDA-graph replays (`fmha.bench.interleaved_times`): new / old
time. The records of 7d0dc4f and 24bcdcb (`history/mend_ab*`) came from this file's first form, which imported a
`git archive` copy of the whole old package (`build/old_src`, carried to the device) instead; the cases and the
timing were the same.
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# FP8 decode: (d, b, keys, seqlen_q, query heads, KV heads, causal, page or None), from fp8_gluon_decode.TIME_CASES
FP8_CASES = [(128, 64, 4096, 1, 512, 8, False, 64), (128, 64, 4096, 1, 512, 8, False, None),
             (128, 64, 4096, 1, 512, 8, False, 16), (128, 64, 4096, 8, 64, 8, True, 64),
             (128, 4, 131072, 1, 512, 8, False, 64), (64, 64, 4096, 1, 512, 8, False, 64),
             (256, 64, 4096, 1, 512, 8, False, 64)]
# Prefill: (d, sequence length, causal), 16k tokens and hidden 2048 as `fmha bench prefill`
PREFILL_CASES = [(64, 1024, False), (64, 4096, True), (128, 1024, False), (128, 4096, True), (256, 16384, True)]


ROUNDS, OLD_FIRST = 5, False


def _time(calls):
    from fmha.bench import interleaved_times
    if OLD_FIRST:
        calls = {"old": calls["old"], "new": calls["new"]}
    times = interleaved_times(calls, ROUNDS)
    med = {name: sorted(ts)[ROUNDS // 2] for name, ts in times.items()}
    return med["new"] / med["old"], med


def _compare(calls, outs):
    """Each call once, then (the largest difference between the two (out, lse) in `outs`, `_time`'s ratio and
    medians)."""
    for c in calls.values():
        c()
    torch.cuda.synchronize()
    diff = max((outs["new"][0].float() - outs["old"][0].float()).abs().max().item(),
               (outs["new"][1] - outs["old"][1]).abs().max().item())
    return (diff,) + _time(calls)


def fp8_rows(old, which=None):
    import fp8_gluon_decode
    from fmha.kernels import fp8_decode_sm90 as new

    rows = []
    for d, b, n, s_q, h_q, h_k, causal, page in [c for i, c in enumerate(FP8_CASES) if which is None or i in which]:
        q, kc, vc, seqlens, kd, vd, table, k, v = fp8_gluon_decode._inputs(b, s_q, h_q, h_k, d, [n] * b, page)
        del k, v
        kd, vd = kd.contiguous(), vd.contiguous()
        outs = {}

        def call(mod, name):
            out = torch.empty(b, s_q, h_q, d, dtype=q.dtype, device="cuda")
            lse = torch.empty(b, h_q, s_q, dtype=torch.float32, device="cuda")
            outs[name] = (out, lse)
            return lambda: mod.fp8_decode_forward_sm90(q, kc, vc, out, lse, seqlens, table, kd, vd, causal=causal,
                                                       softmax_scale=d ** -0.5, max_seqlen_k=n, num_splits=0)
        diff, ratio, med = _compare({"new": call(new, "new"), "old": call(old, "old")}, outs)
        rows.append(dict(kernel="fp8_decode", d=d, b=b, keys=n, s_q=s_q, h_q=h_q, h_k=h_k, causal=causal, page=page,
                         max_diff=diff, new_over_old_time=ratio, seconds=med))
        print(f"fp8 d={d} b={b} keys={n} s_q={s_q} h_q={h_q} causal={causal} page={page}: diff {diff:.3g} "
              f"new/old time {ratio:.4f}", flush=True)
        torch.cuda.empty_cache()
    return rows


def prefill_rows(old):
    from fmha.kernels import forward_sm90 as new

    rows = []
    for d, s, causal in PREFILL_CASES:
        b, h = 16384 // s, 2048 // d
        g = torch.Generator(device="cuda").manual_seed(d + s)
        q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
        outs = {}

        def call(mod, name):
            out = torch.empty_like(q)
            lse = torch.empty(b, h, s, dtype=torch.float32, device="cuda")
            outs[name] = (out, lse)

            def run():
                assert mod.attention_forward_sm90(q, k, v, out, lse, causal=causal, softmax_scale=d ** -0.5)
            return run
        diff, ratio, med = _compare({"new": call(new, "new"), "old": call(old, "old")}, outs)
        rows.append(dict(kernel="prefill", d=d, b=b, seqlen=s, heads=h, causal=causal, max_diff=diff,
                         new_over_old_time=ratio, seconds=med))
        print(f"prefill d={d} s={s} causal={causal}: diff {diff:.3g} new/old time {ratio:.4f}", flush=True)
        torch.cuda.empty_cache()
    return rows


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--old-fp8", help="an older copy of kernels/fp8_decode_sm90.py")
    parser.add_argument("--old-prefill", help="an older copy of kernels/forward_sm90.py (not with --fp8)")
    parser.add_argument("--out")
    parser.add_argument("--fp8", type=int, nargs="*", help="these FP8_CASES alone (no prefill)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--old-first", action="store_true", help="time the old copy first in each round")
    args = parser.parse_args()
    global ROUNDS, OLD_FIRST
    ROUNDS, OLD_FIRST = args.rounds, args.old_first
    from fmha.bench import load_module_copy, save_sweep
    rows = []
    if args.old_fp8:
        rows += [dict(r, old=args.old_fp8) for r in fp8_rows(load_module_copy(args.old_fp8), args.fp8)]
    if args.old_prefill and not args.fp8:
        rows += [dict(r, old=args.old_prefill) for r in prefill_rows(load_module_copy(args.old_prefill))]
    if args.out:
        save_sweep(args.out, rows)


if __name__ == "__main__":
    main()
