"""Quick A/B of the MLA decode paths on a few shapes (one process, same inputs): the Gluon kernel (`fmha.mla`)
against the portable `triton.language` one. For tuning; `fmha bench mla` is the record.

    PYTHONPATH=src python3 benchmarks/probe_mla.py [N] [--out probe.json]     # the first N cases
    PYTHONPATH=src python3 benchmarks/probe_mla.py --varlen --overheads 0 2 5   # planner A/B, Gluon only
    PYTHONPATH=src python3 benchmarks/probe_mla.py --versions /tmp/base.py    # kernel A/B, Gluon only
    PYTHONPATH=src python3 benchmarks/probe_mla.py --versions /tmp/base.py --sparse   # on `fmha bench sparse` rows
        (the b=64 decode rows and two prefill rows; --every-row: all of them; --prefill: the three prefill rows)
    PYTHONPATH=src python3 benchmarks/probe_mla.py --combine    # sparse decode: whole plans without the combine
    PYTHONPATH=src python3 benchmarks/probe_mla.py --lse-copy   # sparse decode: LSE in place vs copied after
    PYTHONPATH=src python3 benchmarks/probe_mla.py --lengths    # sparse decode: topk_length read in the kernel
    PYTHONPATH=src python3 benchmarks/probe_mla.py --tile-sweep # V4 sparse decode: time per token and per tile
    PYTHONPATH=src python3 benchmarks/probe_mla.py --loader-sweep   # V4: the loading warpgroup by rule / on / off
    PYTHONPATH=src python3 benchmarks/probe_mla.py --hot        # scattered keys against one L2-hot tile
    PYTHONPATH=src python3 benchmarks/probe_mla.py --batch-sweep   # V3.2 sparse decode against the batch size
    PYTHONPATH=src:.peers python3 benchmarks/probe_mla.py --whole-plans   # dense: whole sequences vs equal shares
    PYTHONPATH=src python3 benchmarks/probe_mla.py --dense-combine  # dense, planned whole: without the no-op combine

`--versions` times other copies of `kernels/mla_decode_sm90.py` (e.g. `git show REV:src/fmha/kernels/mla_decode_sm90.py
> /tmp/base.py`) beside the package's own, in the same process and interleaved, each checked against the package's
output first.

`--varlen` draws each sequence's length around the case's (a normal with a quarter of it as deviation, as FlashMLA's
test does); `--overheads` times the Gluon kernel once per `schedule.plan_mla` piece overhead instead of against the
portable kernel.
"""
import argparse
import os

import torch

import fmha.kernels.mla_decode
import fmha.kernels.mla_decode_sm90

import fmha.mla as ours_mla
from fmha.bench import (SPARSE_DECODE_CASES, SPARSE_PREFILL_CASES, _heat, _portable_mla, attention_flops, bench_gpu,
                         bench_gpu_graph, load_module_copy, paged_copy, save_sweep, sparse_decode_inputs,
                         outputs_diff, sparse_prefill_inputs, use_mla_kernels)
from fmha.kernels.launch import Plans
from fmha.schedule import mla_num_parts, num_sms, plan_mla

CASES = [(128, 8192, 128, 1), (128, 8192, 32, 1), (128, 8192, 16, 2), (128, 8192, 16, 1)]
VERSION_CASES = [(128, 8192, 128, 1), (128, 4096, 128, 1), (128, 8192, 128, 2), (128, 8192, 64, 1),
                 (128, 8192, 16, 1), (128, 4096, 32, 1), (128, 4096, 16, 2)]


def _dense_inputs(b, sk, hq, sq):
    """(q, cache, table, lens) of a dense MLA decode case: b sequences of sk keys in shuffled 64-key pages."""
    torch.manual_seed(0)
    q = torch.randn(b, sq, hq, 576, device="cuda", dtype=torch.bfloat16)
    kv = torch.randn(b, sk, 1, 576, device="cuda", dtype=torch.bfloat16)
    cache, table = paged_copy(64, kv)
    return q, cache, table, torch.full((b,), sk, dtype=torch.int32, device="cuda")


def _dense_case(b, sk, hq, sq):
    """(row, call, flops, bytes, timer) of a dense MLA decode case (page 64)."""
    q, cache, table, lens = _dense_inputs(b, sk, hq, sq)
    meta, splits = ours_mla.get_mla_metadata(lens, sq * hq, 1)
    run = lambda: ours_mla.flash_mla_with_kvcache(q, cache, table, lens, 512, meta, splits, causal=sq > 1)
    return (dict(b=b, sk=sk, hq=hq, sq=sq), run, attention_flops(b, sq, sk, hq, 576, 512, causal=sq > 1),
            b * sk * 576 * 2 + q.numel() * 2 + b * sq * hq * 512 * 2, bench_gpu_graph)


def _sparse_decode_case(case, lengths=False):
    """One `fmha bench sparse` decode row (`SPARSE_DECODE_CASES`' form) as `_dense_case` returns it: the benchmark's
    inputs and FLOP / byte counts. `lengths`: the call also passes topk_length (and extra_topk_length), each the
    full topk."""
    name, b, hq, sq, d, layout, topk, page, extra_topk, extra_page = case
    q, cache, lens, sink, kw = sparse_decode_inputs(case, torch.Generator(device="cuda").manual_seed(0))
    if lengths:
        kw["topk_length"] = torch.full((b,), topk, dtype=torch.int32, device="cuda")
        if extra_topk:
            kw["extra_topk_length"] = torch.full((b,), extra_topk, dtype=torch.int32, device="cuda")
    meta, splits = ours_mla.get_mla_metadata(lens, sq * hq, 1, num_heads_q=hq, topk=topk, is_fp8_kvcache=True)
    run = lambda: ours_mla.flash_mla_with_kvcache(q, cache, None, lens, 512, meta, splits,  # noqa: E731
                                                  attn_sink=sink, **kw)
    selected = topk + extra_topk
    return (dict(case=name, b=b, hq=hq, sq=sq, d=d), run, 2 * b * sq * hq * selected * (d + 512),
            b * sq * selected * cache.shape[-1] + (q.numel() + b * sq * hq * 512) * 2, bench_gpu_graph)


def _sparse_cases(decode_rows=slice(None, None, 2), prefill=slice(2), lengths=False):
    """`fmha bench sparse`'s decode rows (`decode_rows` of them: the b=64 ones by default) and its prefill rows
    (`prefill` of them: the first two by default), as `_dense_case` returns them (the same inputs and FLOP / byte
    counts as the benchmark). `lengths`: as `_sparse_decode_case`."""
    for case in SPARSE_DECODE_CASES[decode_rows]:
        yield _sparse_decode_case(case, lengths)
    for case in SPARSE_PREFILL_CASES[prefill]:
        name, sq, skv, hq, d, topk = case
        q, kv, indices = sparse_prefill_inputs(case, torch.Generator(device="cuda").manual_seed(0))
        run = lambda: ours_mla.flash_mla_sparse_fwd(q, kv, indices, d ** -0.5, 512)  # noqa: E731
        yield (dict(case=name, sq=sq, hq=hq, d=d), run, 2 * sq * hq * topk * (d + 512),
               (sq * topk * d + q.numel() + sq * hq * 512) * 2, bench_gpu)


def run_versions(paths, out, unchecked=False, sparse=False, rounds=3, every_row=False, prefill_only=False):
    """Each case: the package's Gluon kernel and every copy, outputs checked against the package's (every output of
    the call: `outputs_diff`), run for a second untimed (`fmha.bench._heat`), then timed `rounds` times round-robin,
    each round starting one version further on (median of each: a timing's place in a burst moves it by a few
    percent, NOTES.md fourteenth session); the rows carry TFLOP/s and GB/s per version. `sparse`: `fmha bench
    sparse`'s rows (`_sparse_cases`) instead of the dense ones (`every_row`: the b=128 decode rows too;
    `prefill_only`: its three prefill rows alone)."""
    own = (fmha.kernels.mla_decode_sm90, fmha.kernels.mla_decode._ROUTES)
    # Each version with its own kept launch plans (`use_mla_kernels`).
    versions = [("package", own)] + [(os.path.basename(p), (load_module_copy(p), Plans())) for p in paths]
    rows = []
    if prefill_only:
        cases = _sparse_cases(slice(0), slice(None))
    elif sparse:
        cases = _sparse_cases(slice(None) if every_row else slice(None, None, 2))
    else:
        cases = (_dense_case(*c) for c in VERSION_CASES)
    for row, run, flops, nbytes, timer in cases:
        times = {name: [] for name, _ in versions}
        ref = run()
        for name, module in versions:
            use_mla_kernels(*module)
            err = outputs_diff(run(), ref)
            if unchecked:
                print(f"{name}: max diff {err} against the package's kernel (unchecked)")
            else:
                assert err < 2e-2, f"{name}: max diff {err} against the package's kernel"
        _heat([run])
        for r in range(rounds):
            for name, module in versions[r % len(versions):] + versions[:r % len(versions)]:
                use_mla_kernels(*module)
                times[name].append(timer(run))
        use_mla_kernels(*own)
        for name, ts in times.items():
            t = sorted(ts)[len(ts) // 2]
            row[f"{name}_tflops"], row[f"{name}_gbps"] = flops / t / 1e12, nbytes / t / 1e9
        rows.append(row)
        label = " ".join(f"{k}={v}" for k, v in row.items() if not k.endswith(("_tflops", "_gbps")))
        print(label + ": " + ", ".join(f"{name} {row[f'{name}_tflops']:6.1f} TFLOP/s {row[f'{name}_gbps']:6.0f} GB/s"
                                      for name in times), flush=True)
        del run
        torch.cuda.empty_cache()
        if out:                   # after every row, as `run_patched`
            save_sweep(out, rows)


def _old_lse_copy(real):
    """`_mla_decode_fwd` as sparse decode ran it before the LSE was written in place: per-token LSE rows
    (seq_tokens = 1), then copied into (b, h_q, s_q) by one more kernel. The valid lengths go per token too,
    expanded once per tensor (before any capture) and kept, so that no kernel of theirs is timed."""
    per_token = {}

    def expand(t, s_q):
        if t is None:
            return None
        key = (t.data_ptr(), t.shape[0], s_q)
        if key not in per_token:
            per_token[key] = t.repeat_interleave(s_q)
        return per_token[key]

    def call(*args):
        args = list(args)
        s_q, args[19] = args[19], 1                                            # seq_tokens
        args[11], args[16] = expand(args[11], s_q), expand(args[16], s_q)     # valid, x_valid
        out, lse = real(*args)
        return out, lse.view(-1, s_q, lse.shape[1]).transpose(1, 2).contiguous()
    return call


def _old_length_ops(real):
    """`_sparse_inputs` plus the two kernels per source that the host ran before the kernels read topk_length
    per sequence and clamped it themselves (repeat_interleave over s_q, clamp to topk; results dropped)."""
    def call(q_lat, indices_name, indices, length_name, topk_length):
        if topk_length is not None:
            topk_length.repeat_interleave(q_lat.shape[1]).clamp(0, indices.shape[2])
        return real(q_lat, indices_name, indices, length_name, topk_length)
    return call


def run_patched(out, variants, cases, rounds=4):
    """Each case (as `_dense_case` returns them) once per variant (name -> {(module, attribute): replacement};
    the first variant is the package as it is): outputs compared bit for bit with the first, then timed in
    alternating order (medians of `rounds`)."""
    names = list(variants)
    real = {key: getattr(*key) for patch in variants.values() for key in patch}
    rows = []

    def use(name):
        for (module, attr), value in real.items():
            setattr(module, attr, variants[name].get((module, attr), value))

    for row, run, flops, nbytes, timer in cases:
        outs = {}
        for v in names:
            use(v)
            outs[v] = run()
        assert all(torch.equal(x, y) for v in names[1:] for x, y in zip(outs[names[0]], outs[v]))
        times = {v: [] for v in names}
        for r in range(rounds):
            for v in (names if r % 2 == 0 else names[::-1]):
                use(v)
                _heat([run], 1.0)
                times[v].append(timer(run))
        use(names[0])
        for v, ts in times.items():
            t = sorted(ts)[len(ts) // 2]
            row[f"{v}_tflops"], row[f"{v}_gbps"] = flops / t / 1e12, nbytes / t / 1e9
            row[f"{v}_tflops_each"] = [flops / t / 1e12 for t in ts]
        for v in names[1:]:
            row[f"{names[0]}_vs_{v}"] = row[f"{names[0]}_tflops"] / row[f"{v}_tflops"]
        rows.append(row)
        label = " ".join(f"{k}={v}" for k, v in row.items() if k in ("case", "b", "sk", "hq", "sq", "extra_topk"))
        print(f"{label}: " + ", ".join(f"{v} {row[f'{v}_tflops']:.1f}" for v in names) + " TFLOP/s ("
              + ", ".join(f"{row[f'{names[0]}_vs_{v}']:.3f}x {v}" for v in names[1:]) + ")", flush=True)
        del run, outs
        torch.cuda.empty_cache()
        if out:                   # after every row: a run cut short by its time limit keeps what it measured
            save_sweep(out, rows)


def _hot_cases():
    """Each `fmha bench sparse` row (decode and the first two prefill rows) and three dense h_q = 128 rows twice:
    with the benchmark's inputs ("cold") and with every key tile reading the same 64 keys ("hot": the first
    64 indices of the first token's row repeated, the second source's likewise; dense: every block-table entry
    the first page), whose rows stay in L2. The same instructions run in both; the difference is what the
    scattered reads cost in the memory system. Yields (row, {"cold": call, "hot": call}, flops, timer): decode
    as CUDA-graph replays, prefill eagerly, as `fmha bench` times them."""
    g = torch.Generator(device="cuda").manual_seed(0)

    def hot(idx):
        lead = idx.reshape(-1, idx.shape[-1])[0, :64]
        return lead.repeat(idx.shape[-1] // 64).expand(idx.shape).contiguous()

    for case in SPARSE_DECODE_CASES:
        name, b, hq, sq, d, layout, topk, page, extra_topk, extra_page = case
        q, cache, lens, sink, kw = sparse_decode_inputs(case, g)
        meta, splits = ours_mla.get_mla_metadata(lens, sq * hq, 1, num_heads_q=hq, topk=topk, is_fp8_kvcache=True)
        kw_hot = dict(kw, indices=hot(kw["indices"]))
        if extra_topk:
            kw_hot["extra_indices_in_kvcache"] = hot(kw["extra_indices_in_kvcache"])
        calls = {v: (lambda k=k: ours_mla.flash_mla_with_kvcache(q, cache, None, lens, 512, meta, splits,
                                                                   attn_sink=sink, **k))
                 for v, k in (("cold", kw), ("hot", kw_hot))}
        yield (dict(case=name, b=b, hq=hq, sq=sq, d=d), calls, 2 * b * sq * hq * (topk + extra_topk) * (d + 512),
               bench_gpu_graph)
    for case in SPARSE_PREFILL_CASES[:2]:
        name, sq, skv, hq, d, topk = case
        q, kv, indices = sparse_prefill_inputs(case, g)
        calls = {v: (lambda i=i: ours_mla.flash_mla_sparse_fwd(q, kv, i, d ** -0.5, 512))
                 for v, i in (("cold", indices), ("hot", hot(indices)))}
        yield dict(case=name, sq=sq, hq=hq, d=d), calls, 2 * sq * hq * topk * (d + 512), bench_gpu
    for b, sk, hq, sq in VERSION_CASES[:3]:
        torch.manual_seed(0)
        q = torch.randn(b, sq, hq, 576, device="cuda", dtype=torch.bfloat16)
        cache, table = paged_copy(64, torch.randn(b, sk, 1, 576, device="cuda", dtype=torch.bfloat16))
        lens = torch.full((b,), sk, dtype=torch.int32, device="cuda")
        meta, splits = ours_mla.get_mla_metadata(lens, sq * hq, 1)
        hot_table = torch.full_like(table, table[0, 0].item())
        calls = {v: (lambda t=t: ours_mla.flash_mla_with_kvcache(q, cache, t, lens, 512, meta, splits,
                                                                   causal=sq > 1))
                 for v, t in (("cold", table), ("hot", hot_table))}
        yield (dict(case="dense", b=b, sk=sk, hq=hq, sq=sq), calls,
               attention_flops(b, sq, sk, hq, 576, 512, causal=sq > 1), bench_gpu_graph)


def _flat_cases():
    """The V3.2 sparse decode rows twice: the cache as benchmarked (64-key pages) and the same bytes viewed as pages of
    one key (the same flat positions; the kernel's page arithmetic then divides by 1)."""
    g = torch.Generator(device="cuda").manual_seed(0)
    for case in SPARSE_DECODE_CASES[:2]:
        name, b, hq, sq, d, layout, topk, page, extra_topk, extra_page = case
        q, cache, lens, sink, kw = sparse_decode_inputs(case, g)
        meta, splits = ours_mla.get_mla_metadata(lens, sq * hq, 1, num_heads_q=hq, topk=topk, is_fp8_kvcache=True)
        flat = cache.view(-1, 1, 1, cache.shape[-1])
        calls = {v: (lambda c=c: ours_mla.flash_mla_with_kvcache(q, c, None, lens, 512, meta, splits,
                                                                   attn_sink=sink, **kw))
                 for v, c in (("page64", cache), ("page1", flat))}
        assert all(torch.equal(x, y) for x, y in zip(calls["page64"](), calls["page1"]()))
        yield dict(case=name, b=b, hq=hq, sq=sq, d=d), calls, 2 * b * sq * hq * topk * (d + 512), bench_gpu_graph


def run_hot(out, rounds=4, cases=None):
    """`_hot_cases` (or `cases` of that form), each variant timed `rounds` times in alternating order (medians);
    the second variant's speed over the first's as `<second>_vs_<first>`."""
    rows = []
    for row, calls, flops, timer in cases or _hot_cases():
        names = list(calls)
        times = {v: [] for v in names}
        _heat(list(calls.values()), 1.0)
        for r in range(rounds):
            for v in (names if r % 2 == 0 else names[::-1]):
                times[v].append(timer(calls[v]))
        for v, ts in times.items():
            row[f"{v}_tflops"] = flops / sorted(ts)[len(ts) // 2] / 1e12
        ratio = f"{names[1]}_vs_{names[0]}"
        row[ratio] = row[f"{names[1]}_tflops"] / row[f"{names[0]}_tflops"]
        rows.append(row)
        print(" ".join(f"{k}={v}" for k, v in row.items() if not k.endswith("tflops") and k != ratio) + ": "
              + " ".join(f"{v} {row[f'{v}_tflops']:.1f}" for v in names) + f" TFLOP/s ({row[ratio]:.3f}x)", flush=True)
        del calls
        torch.cuda.empty_cache()
        if out:
            save_sweep(out, rows)


def _v4_cases(extras):
    """The V4 FP8 sparse decode rows of `fmha bench sparse` with the extra source's topk swept (`extras`), as
    `_dense_case` returns them (the row also names the extra topk)."""
    for case in SPARSE_DECODE_CASES[2:]:
        for extra_topk in extras:
            row, run, flops, nbytes, timer = _sparse_decode_case((*case[:8], extra_topk, case[9]))
            row["extra_topk"] = extra_topk
            yield row, run, flops, nbytes, timer


def run_tile_sweep(out, extras=(256, 512, 1024, 2048)):
    """Where a V4 sparse call's time goes, per token and per tile: the V4 FP8 rows (h_q 64 and 128, b 64 and
    128) with the extra source's topk swept (`extras`); microseconds per call, the tokens each part runs and
    the key tiles of a token, for a straight-line fit of time against tiles (intercept: a token's fixed cost)."""
    rows = []
    topk = SPARSE_DECODE_CASES[2][6]
    for case, run, flops, _, timer in _v4_cases(extras):
        _heat([run], 1.0)
        t = sorted(timer(run) for _ in range(3))[1]
        parts = mla_num_parts(case["hq"], 1, num_sms(torch.device("cuda")))
        row = dict(case=case["case"], b=case["b"], hq=case["hq"], extra_topk=case["extra_topk"], us=t * 1e6,
                   tokens_per_part=-(-case["b"] * case["sq"] // parts),
                   tiles_per_token=(-(-topk // 64) * 64 + case["extra_topk"]) // 64, tflops=flops / t / 1e12)
        rows.append(row)
        print(row, flush=True)
        del run
        torch.cuda.empty_cache()
    if out:
        save_sweep(out, rows)


def run_batch_sweep(out, batches, rounds=2):
    """V3.2's FP8 sparse decode row (`SPARSE_DECODE_CASES[0]`) at other batch sizes, `rounds` passes over them:
    TFLOP/s, microseconds per query token, and the planned parts' tokens (whole tokens a part: the busiest part
    against an equal share shows what the plan's quantisation costs)."""
    rows = []
    for r in range(rounds):
        for b in batches:
            case, run, flops, _, timer = _sparse_decode_case((*SPARSE_DECODE_CASES[0][:1], b,
                                                              *SPARSE_DECODE_CASES[0][2:]))
            if r == 0 and b == batches[0]:
                _heat([run])
            t = timer(run)
            tokens = b * case["sq"]
            parts = mla_num_parts(case["hq"], 1, num_sms(torch.device("cuda")))
            rows.append(dict(round=r, b=b, tflops=flops / t / 1e12, us_per_token=t * 1e6 / tokens, parts=parts,
                             busiest_vs_share=-(-tokens // parts) * parts / tokens))
            print(rows[-1], flush=True)
            del run
            torch.cuda.empty_cache()
    if out:
        save_sweep(out, rows)


WHOLE_PLAN_CASES = [(128, sk, hq, sq) for sk in (4096, 8192) for hq, sq in ((16, 1), (16, 2), (32, 1), (32, 2), (64, 1))]


# The few-rows kernel's rows: bench mla's memory-bound ones (h_q * s_q <= 32), one length drawn around 4096 a sequence
# (split plans: partials and the combine), and two sequences cut across every part.
ROWS_CASES = [(128, sk, hq, sq) for sk in (4096, 8192, 16384) for hq, sq in ((16, 1), (16, 2), (32, 1))]


def run_rows_kernel(out, rounds=3):
    """`mla_rows_sm90` (transposed products for <= 32 packed rows) against the 64-row block of `mla_decode_sm90`
    (its `ROWS_KERNEL_MAX` at 0) and FlashMLA where importable, on ROWS_CASES plus a varlen and a two-sequence case:
    outputs checked against the block's (out and LSE, `outputs_diff`), CUDA-graph timings interleaved, medians of
    `rounds`."""
    import fmha.kernels.mla_decode_sm90 as sm90
    from fmha.bench import mla_peers
    peers = mla_peers()
    cases = [(c, None) for c in ROWS_CASES] + [((128, 4096, 16, 2), "varlen"), ((2, 16384, 16, 1), None)]
    rows = []
    for (b, sk, hq, sq), kind in cases:
        q, cache, table, lens = _dense_inputs(b, sk, hq, sq)
        if kind == "varlen":
            torch.manual_seed(1)
            lens = torch.randint(sk // 2, sk + 1, (b,), dtype=torch.int32, device="cuda")
        meta = ours_mla.get_mla_metadata(lens, sq * hq, 1)

        def ours(limit):
            def call():
                if sm90.ROWS_KERNEL_MAX != limit:
                    sm90.ROWS_KERNEL_MAX = limit
                    fmha.kernels.mla_decode._ROUTES.clear()
                return ours_mla.flash_mla_with_kvcache(q, cache, table, lens, 512, *meta, causal=sq > 1)
            return call
        impls = {"rows": ours(32), "block": ours(0)}
        impls.update({name: build(q, cache, table, lens, sq, hq) for name, build in peers.items()})
        ref = impls["block"]()
        row = dict(b=b, sk=sk, hq=hq, sq=sq, lengths=kind or "equal", pieces=int(meta[1][-1]))
        for name, fn in impls.items():
            row[f"{name}_max_diff"] = outputs_diff(fn(), ref)
        times = {name: [] for name in impls}
        for r in range(rounds):
            for name in (list(impls) if r % 2 == 0 else list(impls)[::-1]):
                _heat([impls[name]], 0.3)
                times[name].append(bench_gpu_graph(impls[name]))
        nbytes = int(lens.sum()) * 576 * 2 + q.numel() * 2 + b * sq * hq * 512 * 2
        for name, ts in times.items():
            row[f"{name}_gbps"] = nbytes / sorted(ts)[len(ts) // 2] / 1e9
        for name in impls:
            if name != "rows":
                row[f"rows_vs_{name}"] = row["rows_gbps"] / row[f"{name}_gbps"]
        rows.append(row)
        print(f"b={b} sk={sk} hq={hq} sq={sq} {row['lengths']} pieces {row['pieces']}: " +
              ", ".join(f"{n} {row[f'{n}_gbps']:.0f} GB/s" for n in impls) + " | " +
              ", ".join(f"rows/{n} {row[f'rows_vs_{n}']:.3f}" for n in impls if n != "rows") +
              " | max diff " + ", ".join(f"{n} {row[f'{n}_max_diff']:.1e}" for n in impls), flush=True)
        del q, cache, impls, ref
        torch.cuda.empty_cache()
        if out:
            save_sweep(out, rows)
    sm90.ROWS_KERNEL_MAX = 32
    fmha.kernels.mla_decode._ROUTES.clear()


def run_whole_plans(out, cases=WHOLE_PLAN_CASES, rounds=3):
    """Dense rows of equal-length sequences planned whole (`schedule.runs_whole`: one sequence a part when
    there are fewer sequences than parts, some parts idle) against equal shares (WHOLE_SEQUENCE_SLACK 0: every
    part busy, sequences cut and merged), FlashMLA beside them where importable; CUDA-graph timings interleaved,
    medians of `rounds`, outputs checked against the whole plan's."""
    import fmha.schedule as schedule
    from fmha.bench import mla_peers
    peers = mla_peers()
    rows = []
    for b, sk, hq, sq in cases:
        q, cache, table, lens = _dense_inputs(b, sk, hq, sq)
        plans = {"whole": ours_mla.get_mla_metadata(lens, sq * hq, 1)}
        slack, schedule.WHOLE_SEQUENCE_SLACK = schedule.WHOLE_SEQUENCE_SLACK, 0.0
        try:
            plans["shares"] = ours_mla.get_mla_metadata(lens, sq * hq, 1)
        finally:
            schedule.WHOLE_SEQUENCE_SLACK = slack
        impls = {name: (lambda m=m: ours_mla.flash_mla_with_kvcache(q, cache, table, lens, 512, *m, causal=sq > 1))
                 for name, m in plans.items()}
        impls.update({name: build(q, cache, table, lens, sq, hq) for name, build in peers.items()})
        ref = impls["whole"]()
        row = dict(b=b, sk=sk, hq=hq, sq=sq, pieces={n: int(m[1][-1]) for n, m in plans.items()})
        for name, fn in impls.items():
            row[f"{name}_max_diff"] = outputs_diff(fn(), ref)
        times = {name: [] for name in impls}
        for r in range(rounds):
            for name in (list(impls) if r % 2 == 0 else list(impls)[::-1]):
                _heat([impls[name]], 0.5)
                times[name].append(bench_gpu_graph(impls[name]))
        nbytes = b * sk * 576 * 2 + q.numel() * 2 + b * sq * hq * 512 * 2
        for name, ts in times.items():
            row[f"{name}_gbps"] = nbytes / sorted(ts)[len(ts) // 2] / 1e9
        for name in impls:
            if name != "whole":
                row[f"whole_vs_{name}"] = row["whole_gbps"] / row[f"{name}_gbps"]
        rows.append(row)
        print(f"b={b} sk={sk} hq={hq} sq={sq} pieces {row['pieces']}: " +
              ", ".join(f"{n} {row[f'{n}_gbps']:.0f} GB/s" for n in impls) + " | " +
              ", ".join(f"whole/{n} {row[f'whole_vs_{n}']:.3f}" for n in impls if n != "whole") +
              f" | max diff shares {row['shares_max_diff']:.1e}", flush=True)
        del q, cache, impls, ref
        torch.cuda.empty_cache()
        if out:
            save_sweep(out, rows)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("n", nargs="?", type=int, default=len(CASES))
    p.add_argument("--out", default=None, help="also write the rows as JSON (GPU, date, commit recorded)")
    p.add_argument("--varlen", action="store_true", help="lengths drawn around each case's")
    p.add_argument("--overheads", type=int, nargs="*", default=None, help="plan_mla piece overheads to compare")
    p.add_argument("--versions", nargs="*", default=None, help="other copies of mla_decode_sm90.py to time")
    p.add_argument("--sparse", action="store_true", help="--versions on `fmha bench sparse`'s rows")
    p.add_argument("--every-row", action="store_true", help="--sparse: the b=128 decode rows as well")
    p.add_argument("--prefill", action="store_true", help="--versions on `fmha bench sparse`'s prefill rows alone")
    p.add_argument("--unchecked", action="store_true",
                   help="print the versions' differences instead of asserting (timing probes with wrong results)")
    p.add_argument("--rounds", type=int, default=3, help="--versions: timings of each version (median)")
    p.add_argument("--whole-plans", action="store_true", help="dense: whole-sequence plans against equal shares")
    p.add_argument("--dense-combine", action="store_true", help="dense, planned whole: without the no-op combine")
    p.add_argument("--rows-kernel", action="store_true", help="dense, <= 32 packed rows: mla_rows_sm90 against the "
                   "64-row block and FlashMLA")
    p.add_argument("--combine", action="store_true", help="sparse decode: whole plans without / with the combine")
    p.add_argument("--lse-copy", action="store_true",
                   help="sparse decode: the LSE written in place against per-token rows and a copy kernel")
    p.add_argument("--tile-sweep", action="store_true", help="V4 sparse decode: time against the extra topk")
    p.add_argument("--loader-sweep", action="store_true",
                   help="V4 sparse decode over the extra topk: model1's loading warpgroup by rule, always, never")
    p.add_argument("--extras", type=int, nargs="*", default=[256, 512, 1024, 2048],
                   help="--loader-sweep: the extra source's topk values")
    p.add_argument("--lengths", action="store_true",
                   help="sparse decode with topk_length: read in the kernel against the host's former ops")
    p.add_argument("--hot", action="store_true",
                   help="sparse and dense rows with their keys scattered (as benchmarked) against one L2-hot tile")
    p.add_argument("--flat", action="store_true", help="V3.2 sparse decode: 64-key pages against 1-key pages")
    p.add_argument("--batch-sweep", type=int, nargs="*", default=None,
                   help="V3.2 sparse decode at these batch sizes (none given: 32 64 66 96 128 132 160 192 256)")
    args = p.parse_args()
    if args.batch_sweep is not None:
        return run_batch_sweep(args.out, args.batch_sweep or [32, 64, 66, 96, 128, 132, 160, 192, 256])
    if args.hot:
        return run_hot(args.out)
    if args.flat:
        return run_hot(args.out, cases=_flat_cases())
    sparse_decode = _sparse_cases(slice(None), prefill=slice(0))
    if args.whole_plans:
        return run_whole_plans(args.out)
    if args.rows_kernel:
        return run_rows_kernel(args.out)
    if args.dense_combine:
        # Dense calls cannot know on the host that the plan ran every sequence whole (the lengths are on the
        # device), so they always launch the combine, which then has nothing to merge: its cost, by leaving it out
        # (outputs bit for bit the same on these whole-planned rows).
        m = fmha.kernels.mla_decode
        return run_patched(args.out, {"as_is": {}, "no_combine": {(m, "combine"): lambda *a, **k: None}},
                           [_dense_case(*case) for case in WHOLE_PLAN_CASES])
    if args.combine:
        # A no-op combine forced on by `runs_whole` returning False: split buffers made, the combine launched.
        return run_patched(args.out, {"whole": {}, "combine": {(ours_mla, "runs_whole"): lambda *a: False}},
                           sparse_decode)
    if args.tile_sweep:
        return run_tile_sweep(args.out)
    if args.loader_sweep:
        # model1 with and without the loading warpgroup, against the package's rule, over token rows of 10-34 tiles.
        m = fmha.kernels.mla_decode_sm90
        return run_patched(args.out, {"rule": {}, "loader": {(m, "MODEL1_LOADER_TILES"): (0, 0)},
                                      "no_loader": {(m, "MODEL1_LOADER_TILES"): (1 << 30, 1 << 30)}},
                           _v4_cases(args.extras))
    if args.lengths:
        old = _old_length_ops(ours_mla._sparse_inputs)
        return run_patched(args.out, {"in_kernel": {}, "host_ops": {(ours_mla, "_sparse_inputs"): old}},
                           _sparse_cases(slice(None), prefill=slice(0), lengths=True))
    if args.lse_copy:
        old = _old_lse_copy(ours_mla._mla_decode_fwd)
        return run_patched(args.out, {"in_place": {}, "copy": {(ours_mla, "_mla_decode_fwd"): old}}, sparse_decode)
    if args.versions is not None:
        return run_versions(args.versions, args.out, args.unchecked, args.sparse, args.rounds, args.every_row,
                            args.prefill)
    rows = []
    for b, sk, hq, sq in CASES[: args.n]:
        torch.manual_seed(0)
        q = torch.randn(b, sq, hq, 576, device="cuda", dtype=torch.bfloat16)
        kv = torch.randn(b, sk, 1, 576, device="cuda", dtype=torch.bfloat16)
        cache, table = paged_copy(64, kv)
        lens = torch.full((b,), sk, dtype=torch.int32, device="cuda")
        if args.varlen:
            lens = (torch.randn(b, device="cuda") * sk / 4 + sk).clamp(1, sk).to(torch.int32)
        flops = sum(attention_flops(1, sq, n, hq, 576, 512, causal=sq > 1) for n in lens.tolist())
        if args.overheads is not None:
            parts = mla_num_parts(sq * hq, 1, num_sms(q.device))
            ref = None
            for overhead in args.overheads:
                meta, splits = plan_mla(lens, parts, piece_overhead=overhead)
                run = lambda: ours_mla.flash_mla_with_kvcache(q, cache, table, lens, 512, meta, splits, causal=sq > 1)
                got = run()
                ref = got if ref is None else ref
                t = bench_gpu_graph(run)
                rows.append(dict(b=b, sk=sk, hq=hq, sq=sq, varlen=args.varlen, piece_overhead=overhead,
                                 pieces=int(splits[-1]), gluon_tflops=flops / t / 1e12,
                                 max_diff=outputs_diff(got, ref)))
                print(f"b={b} sk={sk} hq={hq} sq={sq} varlen={args.varlen} overhead {overhead}: {int(splits[-1])} "
                      f"pieces, {flops / t / 1e12:6.1f} TFLOP/s, max diff {rows[-1]['max_diff']:.1e}", flush=True)
            del q, kv, cache
            continue
        meta, splits = ours_mla.get_mla_metadata(lens, sq * hq, 1)
        gluon = lambda: ours_mla.flash_mla_with_kvcache(q, cache, table, lens, 512, meta, splits, causal=sq > 1)
        triton_ = _portable_mla(q, cache, table, lens, meta, splits, causal=sq > 1)
        err = (gluon()[0].float() - triton_().float()).abs().max().item()
        tg, tt = bench_gpu_graph(gluon), bench_gpu_graph(triton_)
        rows.append(dict(b=b, sk=sk, hq=hq, sq=sq, gluon_tflops=flops / tg / 1e12, triton_tflops=flops / tt / 1e12,
                         max_diff=err))
        print(f"b={b} sk={sk} hq={hq} sq={sq}: gluon {flops / tg / 1e12:6.1f} TFLOP/s, triton "
              f"{flops / tt / 1e12:6.1f} TFLOP/s, gluon/triton {tt / tg:.2f}, max diff {err:.2e}", flush=True)
        del q, kv, cache
    if args.out:
        save_sweep(args.out, rows)


if __name__ == "__main__":
    main()
