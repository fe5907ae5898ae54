"""`attention_varlen(..., block_table=, seqused_k=)` (packed queries over a paged cache: vLLM's FlashAttention call
for a batch that mixes prefill chunks and decodes) against the same work as one `attention_with_kvcache` call per
group of equal-length sequences (decodes, speculative decodes, chunks: each batch on its own path), in one process
on the same cache.

    PYTHONPATH=src python3 benchmarks/probe_varlen_paged.py [--out varlen_paged.json] [--short 32 64:16] [--parts]
        [--rows 2 3] [--wide 64,32,4,5 64,64,4,5+128,32,4,4] [--pack] [--kernels] [--heads 32 16] [--page 64]
        [--case 32x64,1x512@4096] [--versions old_forward_sm90.py] [--empty-launch] [--streams] [--eager] [--unpaired]
        [--short-alone] [--host-rounds 5] [--head-dim 64] [--decode-tiles 64,32,4,2]

Rows: groups of (count, query rows) sequences (causal), every sequence with `context` keys in 16-key pages (`--page`;
shuffled), 32 / 8 heads (`--heads` query and KV heads), d = 128 (`--head-dim`), bf16; CASES, or with `--case` those
given (COUNTxROWS,...@CONTEXT) in their place. TFLOP/s over the pairs the causal mask lets through, CUDA-graph replays
(`--eager`: eager calls, the host's time in, and each call's host time, `NAME_host_us`, the median of `--host-rounds`
bursts, and its difference from ours, `NAME_minus_ours_host_us`); outputs compared first (`probe_row`). Besides the
call as routed (`ours`) and the calls per group (`calls`): the same call held on the portable kernel (`portable`);
with `forward.SHORT_TILE_ROWS` at each `--short` value (`shortN`: sequences of up to N / group query rows left to the
portable kernel's second launch; N:R, `shortN_tilesR`: that launch's tiles those of R packed rows at most, one form,
e.g. 16 for the decodes' narrow one; by default `short16`, the narrow form alone, as before the two forms of
`forward._short_tiles`); with each `--wide` M,N,W,S (forms joined by +), the short launch's forms past the first in
those tiles (`wideM_N_W_S`); with each `--versions` copy of `kernels/forward_sm90.py`, the call as routed on that
copy's Gluon launch (`ours@FILE`); with `--pack`, the Gluon launch's items of two query heads
(`forward_sm90.pack_heads`' form, which the package keeps to padded calls), as routed (`pack`) and with each `--short`
value (`shortN_pack`); with `--unpaired`, each `--short` value with the routing's half cap for even groups off
(`shortN_unpaired`); with each `--decode-tiles` M,N,W,S, the call with those tiles in the 64-row decode tables
(DECODE_ROWS packed rows: the short launch's wide form, speculative decodes; `decodeM_N_W_S`); with `--short-alone`,
the call with `forward.SHORT_ALONE` off (`prefill_tiles`); with `--parts`, each launch alone (`gluon_part`,
`short_part`: the TFLOP/s of the whole row's pairs over that launch's time, so a part's share of the call is ours /
part) and each group's call alone (`call_R`, R its rows a sequence); with `--kernels`, each kernel's GPU time a call
(`ours:NAME_us`, eager calls under torch.profiler) of ours and of the `--short` / `--wide` forms; with
`--empty-launch`, ours and then a launch whose programs return at once (`ours_empty`); with `--streams`, the call with
its two launches on the caller's stream (`one_stream`: `forward.SIDE_STREAM` off; ours runs them side by side). (Until
01f11ab also `two_streams`, the `--parts` launches on two streams: the same as ours since 698eca0.)
"""
import contextlib
import argparse
import os

import torch
import triton

import fmha
from fmha.kernels import forward
from fmha.bench import (_host_us, attention_flops, bench_gpu, bench_gpu_graph, load_module_copy, paged_copy,
                        probe_row, save_sweep)


@contextlib.contextmanager
def held(portable=False, short_tile_rows=None, tile_rows=None, wide=None, pack=False, version=None,
         side_stream=True, unpaired=False, short_alone=True, decode_tiles=None):
    """Calls inside on the portable kernel (Gluon off) when `portable`; with `forward.SHORT_TILE_ROWS` (the query
    rows of a GQA group's tile below which a sequence leaves the Gluon kernel) set to `short_tile_rows` if given; the
    portable kernel's tiles chosen for at most `tile_rows` packed rows if given (in a routed call only the short
    launch's: several tiles of fewer rows a sequence, in place of one taller); the short launch's second form's
    forms past the first `wide` (each (BLOCK_M, BLOCK_N, num_warps, num_stages)) in place of `_short_tiles`' where it
    has them; with `pack`,
    the Gluon launch's items of two query heads (`forward_sm90.pack_heads`, which keeps packed sequences on one);
    `version`: the Gluon launch of that copy of `forward_sm90` (`load_module_copy`), the routing this package's;
    `side_stream` False: both launches on the caller's stream (`forward.SIDE_STREAM`); `unpaired`: the routing's
    cap for even groups off (`forward_sm90.pairs_tails` False there: the short launch takes up to DECODE_ROWS rows a
    sequence; the Gluon kernel still pairs the tails it runs); `short_alone` False: `forward.SHORT_ALONE` off (calls
    the Gluon kernel does not take in one prefill tile a sequence, as before the eighty-fourth session);
    `decode_tiles` (head dim, tiles): those tiles in both 64-row decode tables' entry for that (padded) head dim."""
    from fmha.kernels import forward_sm90
    saved = (forward.gluon_enabled, forward.SHORT_TILE_ROWS, forward._tile_config, forward._short_tiles,
             forward.SIDE_STREAM, forward.SHORT_ALONE)
    forward.SIDE_STREAM, forward.SHORT_ALONE = side_stream, short_alone
    tables = (forward._GPU_DECODE_TILES, forward._GPU_PAGED_DECODE_TILES) if decode_tiles else ()
    saved_tiles = [table[decode_tiles[0]] for table in tables]       # both tables hold every head dim's entry
    for table in tables:
        table[decode_tiles[0]] = decode_tiles[1]
    gluon_call, pairs_tails = forward_sm90.attention_forward_sm90, forward_sm90.pairs_tails
    if unpaired:
        forward_sm90.pairs_tails = lambda *a, **kw: False
    launch = (version or forward_sm90).attention_forward_sm90
    forward_sm90.attention_forward_sm90 = (lambda *a, **kw: launch(*a, **kw, pack=True)) if pack else launch
    if portable:
        forward.gluon_enabled = lambda: False
    forward.SHORT_TILE_ROWS = short_tile_rows or saved[1]
    if tile_rows:
        forward._tile_config = lambda *a, rows=None, **kw: saved[2](*a, rows=rows and min(rows, tile_rows), **kw)
    if wide:
        def short_tiles(*a, **kw):
            rows, tiles, own = saved[3](*a, **kw)
            return rows, tiles, own and wide
        forward._short_tiles = short_tiles
    try:
        yield
    finally:
        (forward.gluon_enabled, forward.SHORT_TILE_ROWS, forward._tile_config, forward._short_tiles,
         forward.SIDE_STREAM, forward.SHORT_ALONE) = saved
        forward_sm90.attention_forward_sm90, forward_sm90.pairs_tails = gluon_call, pairs_tails
        for table, old in zip(tables, saved_tiles):
            table[decode_tiles[0]] = old


# (groups of (sequences, query rows), keys a sequence): decodes, chunks, mixed, speculative decodes of 4-16 rows alone
# (under GLUON_CACHE_MIN_ROWS: the whole call on the portable kernel) and of 8-32 rows beside a 512-row chunk
CASES = [(((64, 1),), 4096), (((4, 1),), 131072), (((32, 1), (2, 512)), 4096), (((4, 512),), 4096),
         (((8, 1), (1, 2048)), 16384), (((32, 4),), 4096), (((32, 8),), 4096), (((32, 8), (1, 512)), 4096),
         (((32, 16), (1, 512)), 4096), (((32, 32), (1, 512)), 4096)]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=None)
    p.add_argument("--short", nargs="*", default=["16"],
                   help="SHORT_TILE_ROWS values to time, each N or N:R (the short launch's tiles for R rows at most)")
    p.add_argument("--wide", nargs="*", default=[],
                   help="tile forms past the first of the short launch to time, each M,N,W,S[+M,N,W,S...] "
                        "(`wideM_N_W_S[__M_N_W_S]`)")
    p.add_argument("--pack", action="store_true",
                   help="also the call with the Gluon launch's items of two query heads (`pack`)")
    p.add_argument("--unpaired", action="store_true",
                   help="also each --short value with the routing's cap for even groups off (`shortN_unpaired`)")
    p.add_argument("--short-alone", action="store_true",
                   help="also the call with forward.SHORT_ALONE off (`prefill_tiles`)")
    p.add_argument("--decode-tiles", nargs="*", default=[],
                   help="tiles M,N,W,S to time in the 64-row decode tables' entry for the head dim (`decodeM_N_W_S`)")
    p.add_argument("--parts", action="store_true")
    p.add_argument("--streams", action="store_true",
                   help="also the call as routed with both launches on the caller's stream (`one_stream`)")
    p.add_argument("--eager", action="store_true", help="eager calls timed (`bench_gpu`), not CUDA-graph replays")
    p.add_argument("--host-rounds", type=int, default=5, help="with --eager: rounds of the host-time bursts")
    p.add_argument("--empty-launch", action="store_true",
                   help="also ours followed by a launch of a program a (sequence, KV head) that returns at once "
                        "(`ours_empty`): what one more launch would cost the call")
    p.add_argument("--kernels", action="store_true",
                   help="also each kernel's GPU time a call (torch.profiler) of ours and the --short / --wide forms")
    p.add_argument("--rows", type=int, nargs="*", default=None, help="indices of the rows to run (all by default)")
    p.add_argument("--heads", type=int, nargs=2, default=(32, 8), help="query heads and KV heads")
    p.add_argument("--page", type=int, default=16, help="keys a page")
    p.add_argument("--head-dim", type=int, default=128, help="head_dim of q, k and v")
    p.add_argument("--case", nargs="*", default=[], help="rows to run in CASES' place, each COUNTxROWS,...@CONTEXT")
    p.add_argument("--versions", nargs="*", default=[],
                   help="copies of kernels/forward_sm90.py whose Gluon launch to time as routed (`ours@FILE`)")
    a = p.parse_args()
    versions = [(os.path.basename(path), load_module_copy(path)) for path in a.versions]
    rows = []
    (hq, hk), d, page = a.heads, a.head_dim, a.page
    cases = [(tuple(tuple(int(x) for x in g.split("x")) for g in spec.split("@")[0].split(",")),
              int(spec.split("@")[1])) for spec in a.case] or CASES
    for index, (groups, context) in enumerate(cases):
        if a.rows is not None and index not in a.rows:
            continue
        lens_q = [n for count, n in groups for _ in range(count)]
        b = len(lens_q)
        g = torch.Generator().manual_seed(b)
        k, v = (torch.randn(b, context, hk, d, generator=g).to(torch.bfloat16).cuda() for _ in range(2))
        k_cache, v_cache, table = paged_copy(page, k, v)
        used = torch.full((b,), context, dtype=torch.int32, device="cuda")
        first = [sum(c for c, _ in groups[:i]) for i in range(len(groups))]       # a group's first sequence
        starts = [0] + torch.tensor(lens_q).cumsum(0).tolist()                  # a sequence's first row (host)
        cu_q = torch.tensor(starts, dtype=torch.int32, device="cuda")
        q = torch.randn(starts[-1], hq, d, generator=g).to(torch.bfloat16).cuda()

        def ours():
            return fmha.attention_varlen(q, k_cache, v_cache, cu_q, None, max(lens_q), context, causal=True,
                                         seqused_k=used, block_table=table)

        def held_call(**how):
            def call():
                with held(**how):
                    return ours()
            return call

        def group_call(i):
            (count, n), s0 = groups[i], first[i]
            rows = slice(starts[s0], starts[s0 + count])
            return fmha.attention_with_kvcache(q[rows].view(count, n, hq, d), k_cache, v_cache, used[s0:s0 + count],
                                               block_table=table[s0:s0 + count], causal=True).flatten(0, 1)

        def calls():
            return torch.cat([group_call(i) for i in range(len(groups))])
        flops = sum(attention_flops(count, n, context, hq, d, d, causal=True) for count, n in groups)
        row = dict(groups=" ".join(f"{c}x{n}" for c, n in groups), context=context, page=page, heads=f"{hq}/{hk}",
                   head_dim=d)
        impls = {"ours": ours, "calls": calls, "portable": held_call(portable=True)}
        for spec in a.short:
            n, _, cap = spec.partition(":")
            name = f"short{n}" + (f"_tiles{cap}" if cap else "")
            impls[name] = held_call(short_tile_rows=int(n), tile_rows=int(cap or 0))
            if a.pack:
                impls[name + "_pack"] = held_call(short_tile_rows=int(n), tile_rows=int(cap or 0), pack=True)
            if a.unpaired:
                impls[name + "_unpaired"] = held_call(short_tile_rows=int(n), tile_rows=int(cap or 0), unpaired=True)
        for spec in a.wide:
            forms = tuple(tuple(int(x) for x in form.split(",")) for form in spec.split("+"))
            impls["wide" + spec.replace(",", "_").replace("+", "__")] = held_call(wide=forms)
        if a.pack:
            impls["pack"] = held_call(pack=True)
        for spec in a.decode_tiles:
            impls["decode" + spec.replace(",", "_")] = held_call(
                decode_tiles=(forward.tile_key(d, d), tuple(int(x) for x in spec.split(","))))
        if a.short_alone:
            impls["prefill_tiles"] = held_call(short_alone=False)
        if a.empty_launch:
            def ours_empty():
                out = ours()
                _returns[(b * hk, 1, 1)](cu_q)
                return out
            impls["ours_empty"] = ours_empty
        for name, module in versions:
            impls[f"ours@{name}"] = held_call(version=module)
        if a.streams:
            impls["one_stream"] = held_call(side_stream=False)
        compare = list(impls)[1:]
        if a.parts:
            impls.update(parts(q, k_cache, v_cache, cu_q, max(lens_q), context, used, table))
            impls.update({f"call_{n}": (lambda i=i: group_call(i)) for i, (_, n) in enumerate(groups)})
        row["timer"] = "eager" if a.eager else "graph"
        probe_row(rows, row, impls, flops, compare=compare, timer=bench_gpu if a.eager else bench_gpu_graph)
        if a.eager:           # the host's microseconds a call (above the GPU's, eager timings show it)
            rows[-1].update(host_times(impls, a.host_rounds))
            print({k: round(v, 1) for k, v in rows[-1].items() if k.endswith("_host_us")})
        if a.kernels:         # two rounds, the second kept (the first impl timed would pay the GPU's warm-up)
            for _ in range(2):
                for name in ["ours"] + [n for n in impls if n.startswith(("short", "wide", "pack"))]:
                    for kernel, us in kernel_times(impls[name]).items():
                        rows[-1][f"{name}:{kernel}_us"] = us
            print({k: round(v, 2) for k, v in rows[-1].items() if k.endswith("_us")})
        if a.out:                 # after every row, so that a run cut by its time limit keeps what it measured
            save_sweep(a.out, rows)


def host_times(impls, rounds):
    """{NAME_host_us: median over `rounds` of the host's microseconds a call (`_host_us`, a burst of calls)}, the
    impls in alternating order each round (forward, backward), and {NAME_minus_ours_host_us: the median of the
    rounds' differences}: bursts of one process drift by 10-15% on the device's hosts."""
    times = {name: [] for name in impls}
    for r in range(rounds):
        for name in (list(impls) if r % 2 == 0 else list(impls)[::-1]):
            times[name].append(_host_us(impls[name]))
    median = lambda xs: sorted(xs)[len(xs) // 2]       # noqa: E731
    out = {f"{name}_host_us": median(ts) for name, ts in times.items()}
    out.update({f"{name}_minus_ours_host_us": median([t - o for t, o in zip(ts, times["ours"])])
                for name, ts in times.items() if name != "ours"})
    return out


@triton.jit
def _returns(CU_Q):
    """Programs that return at once, as a launch's do where no sequence is theirs (`--empty-launch`)."""
    pass


def kernel_times(fn, reps=40):
    """{kernel name: mean GPU microseconds a call} of `reps` eager calls of fn (torch.profiler's CUDA activity)."""
    fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    times = {}
    for e in prof.key_averages():
        total = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
        if total and e.count >= reps:
            times[e.key.split("(")[0][:40]] = total / reps
    return times


def parts(q, k_cache, v_cache, cu_q, max_q, context, used, table):
    """The routed call's two launches, each alone (the kernels' own entry points, into buffers of their own)."""
    from fmha.kernels import forward_sm90
    out = torch.empty_like(q)
    lse = torch.empty(q.shape[1], q.shape[0], device=q.device)
    d, dv, group = q.shape[-1], v_cache.shape[-1], q.shape[1] // k_cache.shape[2]
    paired = forward_sm90.pairs_tails(d, dv, group, (-1, 0), max_q, 0.0, True)     # as the routed call's
    short = forward._short_tiles(d, dv, group, True, False, paired=paired)[0]

    def gluon_part():
        assert forward_sm90.attention_forward_sm90(q, k_cache, v_cache, out, lse, causal=True,
                                                   softmax_scale=q.shape[-1] ** -0.5,
                                                   varlen=(cu_q, None, max_q, context),
                                                   cache=(used, table, None), short_rows=short)
        return out

    def short_part():
        forward.attention_forward(q, k_cache, v_cache, out, lse, cu_seqlens_q=cu_q, cu_seqlens_k=None,
                                  max_seqlen_q=max_q, max_seqlen_k=context, softmax_scale=None, window=(-1, 0),
                                  softcap=0.0, alibi_slopes=None, sinks=None, cache_seqlens=used, block_table=table,
                                  num_splits=0, short_rows=short)
        return out
    return {"gluon_part": gluon_part, "short_part": short_part}


if __name__ == "__main__":
    main()
