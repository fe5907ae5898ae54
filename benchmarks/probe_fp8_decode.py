"""Decode against an FP8 KV cache beside the same keys in bf16: what halving the bytes buys.

`fmha bench decode`'s shapes (b=64, hq=32, hk=8, sk=4096, d=128; b=4 / b=1 at sk=131072), each cache contiguous or
paged (pages shuffled as the bench shuffles them), once in bf16 and once as float8_e4m3fn with per-(batch, KV head)
`k_descale` / `v_descale` (`fmha.bench.quantize_fp8`). For each: our decode on both caches, the pure read of each
cache (`kernels.kv_read`, the yardstick `fmha bench decode` uses), and cuDNN SDPA on the contiguous bf16 cache, all in
one process with CUDA-graph timing. GB/s count each call's own bytes (an FP8 cache is half the K/V bytes);
`fp8_speedup` is the bf16 call's time over the FP8 call's (tokens a second). Paged caches also run with the 64-row
decode tiles in place of the 16- and 32-row ones (`_with_tiles`: what FP8 calls of head dims without an FP8 table entry
run). Every call is checked first: bf16 against cuDNN, FP8 against the fp32
oracle on the same FP8 values.

    PYTHONPATH=src python3 benchmarks/probe_fp8_decode.py [--rounds 2] [--out probe.json] [--fp8-tiles 64,128,4,3 ..]
        [--versions base.py ..] [--cases 3 4] [--bf16-tiles 32,64,4,5 ..] [--head-dim 64] [--v-words 0 1]
        [--splits 32 64 ..] [--fp8-splits 2 4 ..] [--pairs] [--no-combine] [--pair-tiles 16,64,4,3 ..]
        [--shapes 64,8,1,4096,64 ..]
"""
import argparse
import importlib
import os
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import fmha
from fmha.bench import interleaved_times, kv_read_call, load_module_copy, paged_copy, quantize_fp8, save_sweep
from fmha.kernels import forward
from fmha.reference import attention_ref
from probe_decode import parse_cases

CASES = [(64, 32, 8, 4096, None), (64, 32, 8, 4096, 16), (64, 32, 8, 4096, 64), (4, 32, 8, 131072, 64),
         (1, 32, 8, 131072, 64)]
# Not run unless named with --cases: 5, 32 query heads a KV head, 32 packed rows (what speculative decoding's 4
# tokens give a GQA group of 8), past the 16-row tables: the 64-row forms unless --fp8-tiles gives others; 6 and 7,
# the long-context cases on contiguous caches (the contiguous FP8 table's other shapes); 8, case 5 contiguous; 9,
# `fmha bench decode`'s MHA row (one packed row a program); 10 and 11 tell its two traits apart: 10 as many
# programs (1024, unsplit) in GQA groups of 4, 11 MHA's 4 KB between a key's heads with half the programs; 12 and
# 13, case 2's bytes in half as many programs of twice the keys and in twice as many of half (what a program's
# fixed cost, its pipeline fill and output, weighs); 14 and 15, case 5's 32 packed rows at b = 4 with 131k keys,
# paged and contiguous (split launches of the 32-row tiles); 16 and 17, 64 packed rows (8 tokens a GQA group of 8),
# paged and contiguous: the 64-row forms, or with --fp8-tiles 32,.. two 32-row blocks a KV head; 18, case 16's 64
# rows at b = 4 with 131k keys, paged (split launches of the 64-row forms).
EXTRA_CASES = [(64, 256, 8, 4096, 64), (4, 32, 8, 131072, None), (1, 32, 8, 131072, None), (64, 256, 8, 4096, None),
               (32, 32, 32, 8192, 64), (128, 32, 8, 4096, 64), (16, 32, 32, 8192, 64), (32, 32, 8, 8192, 64),
               (128, 32, 8, 2048, 64), (4, 256, 8, 131072, 64), (4, 256, 8, 131072, None), (64, 512, 8, 4096, 64),
               (64, 512, 8, 4096, None), (4, 512, 8, 131072, 64)]
D = 128


def _read_call(k_cache, v_cache, table, keys):
    """The pure read of a cache, cut as `fmha bench decode` cuts it, checked to have read every word."""
    call, whole = kv_read_call(k_cache, v_cache, table, keys)
    assert whole
    return call


def _with_tiles(fn, tiles=None, key=None):
    """fn run (and so captured, under graph timing) with `tiles` (BLOCK_M, BLOCK_N, num_warps, num_stages) in
    every decode table at head dim `key` (default D), or, with tiles None, with every table below DECODE_ROWS rows
    (the 16-row and 32-row ones, bf16 and FP8) switched off (the 64-row forms)."""
    def call():
        saved = [dict(t) for t in forward._GPU_DECODE_TABLES]
        if tiles is None:
            for *_, bound, t in forward._DECODE_LOOKUP:
                if bound < forward.DECODE_ROWS:
                    t.clear()
        else:
            for t in forward._GPU_DECODE_TABLES:
                t[key or D] = tiles
        try:
            return fn()
        finally:
            for t, old in zip(forward._GPU_DECODE_TABLES, saved):
                t.clear()
                t.update(old)
    return call


def _tiles_and_cap(spec):
    """--fp8-tiles / --bf16-tiles' "M,N,W,S[,R]": the tiles (BLOCK_M, BLOCK_N, num_warps, num_stages) and the
    register cap R (Triton's maxnreg, in `forward._GPU_MAXNREG` for those tiles at D) or None."""
    values = tuple(int(x) for x in spec.split(","))
    return values[:4], (values[4] if len(values) > 4 else None)


def _with_settings(fn, **values):
    """fn run with these attributes of `forward` set (`HEAD_PAIRS=True`: adjacent KV heads as one head of twice the
    width; `FP8_V_WORDS=mode`: how the mma.sync forms read an FP8 V), on launch plans of its own (a plan holds the
    settings it was made with)."""
    plans = forward.Plans()
    values = dict(values, _PLANS=plans)

    def call():
        saved = {name: getattr(forward, name) for name in values}
        for name, value in values.items():
            setattr(forward, name, value)
        try:
            return fn()
        finally:
            for name, value in saved.items():
                setattr(forward, name, value)
    return call


def _with_forward(fn, module):
    """fn run with `module` (a copy of kernels/forward.py, `load_module_copy`) as the KV-cache op's kernel."""
    op = importlib.import_module("fmha.attention")     # the module; `fmha.attention` is the function

    def call():
        saved = op.attention_forward
        op.attention_forward = module.attention_forward
        try:
            return fn()
        finally:
            op.attention_forward = saved
    return call


def main():
    global D
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--out", default=None)
    p.add_argument("--fp8-tiles", nargs="*", default=[], metavar="M,N,W,S[,R]",
                   help="also time the FP8 cache with these decode tiles in place of the tables' own (R: capped at R "
                        "registers, an FP8-only `_GPU_MAXNREG` entry)")
    p.add_argument("--bf16-tiles", nargs="*", default=[], metavar="M,N,W,S[,R]",
                   help="also time the bf16 cache with these decode tiles in place of the tables' own (R: capped at "
                        "R registers)")
    p.add_argument("--head-dim", type=int, default=D,
                   help="d of q, k and v (the tables' key; --fp8-tiles / --bf16-tiles then go in at that key)")
    p.add_argument("--v-words", type=int, nargs="*", default=[], metavar="MODE",
                   help="also time the FP8 cache with forward.FP8_V_WORDS = each MODE (0 bytes, 1 words split in "
                        "triton.language, 2 by byte permutes)")
    p.add_argument("--versions", nargs="*", default=[], metavar="FORWARD.py",
                   help="also time the FP8 cache with these copies of kernels/forward.py (an A/B in one process)")
    p.add_argument("--pairs", action="store_true",
                   help="also time the bf16 cache with forward.HEAD_PAIRS forced on (two KV heads a program wherever "
                        "the kernel can) and off (one head a program; by default `_pairs_pay` picks)")
    p.add_argument("--pair-tiles", nargs="*", default=[], metavar="M,N,W,S",
                   help="also time the bf16 cache with forward.HEAD_PAIRS forced on and these tiles at the pair's "
                        "width (the decode tables' 2 x head-dim entries, which the pairs take)")
    p.add_argument("--splits", type=int, nargs="*", default=[], metavar="N",
                   help="also time the bf16 cache with num_splits=N forced (the tables' tiles)")
    p.add_argument("--fp8-splits", type=int, nargs="*", default=[], metavar="N",
                   help="also time the FP8 cache with num_splits=N forced (the tables' tiles)")
    p.add_argument("--no-combine", action="store_true",
                   help="also time the bf16 calls (and --pairs') with the split-KV combine launch skipped: timing "
                        "only (their outputs are not merged), what the combine costs a split call")
    p.add_argument("--cases", type=int, nargs="*", default=None, metavar="I",
                   help="only these of CASES + EXTRA_CASES (indices)")
    p.add_argument("--shapes", nargs="*", default=None, metavar="B,HQ,HK,SK,PAGE",
                   help="these cases instead (PAGE -: a contiguous cache), e.g. 64,8,1,4096,64")
    args = p.parse_args()
    D = args.head_dim
    versions = {os.path.splitext(os.path.basename(path))[0]: load_module_copy(path) for path in args.versions}
    rows = []
    cases = [(CASES + EXTRA_CASES)[i] for i in args.cases] if args.cases is not None else CASES
    if args.shapes:
        cases = parse_cases(args.shapes)
    for b, hq, hk, sk, page in cases:
        torch.manual_seed(0)
        q = torch.randn(b, 1, hq, D, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(b, sk, hk, D, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(b, sk, hk, D, device="cuda", dtype=torch.bfloat16)
        (k8, k_descale), (v8, v_descale) = quantize_fp8(k, hk), quantize_fp8(v, hk)
        lens = torch.full((b,), sk, dtype=torch.int32, device="cuda")
        if page:
            perm = torch.randperm(b * (sk // page), device="cuda")
            kc, vc, table = paged_copy(page, k, v, perm=perm)
            kc8, vc8, _ = paged_copy(page, k8, v8, perm=perm)
        else:
            kc, vc, kc8, vc8, table = k, v, k8, v8, None
        qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)

        def cudnn():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=hq != hk)

        calls = {
            "ours_bf16": lambda: fmha.attention_with_kvcache(q, kc, vc, lens, block_table=table),
            "ours_fp8": lambda: fmha.attention_with_kvcache(q, kc8, vc8, lens, block_table=table,
                                                            k_descale=k_descale, v_descale=v_descale),
            "read_bf16": _read_call(kc, vc, table, sk),
            "read_fp8": _read_call(kc8, vc8, table, sk),
            "cudnn": cudnn,
        }
        if page:
            calls["ours_bf16_wide"] = _with_settings(_with_tiles(calls["ours_bf16"]), HEAD_PAIRS=False)
            calls["ours_fp8_wide"] = _with_tiles(calls["ours_fp8"])
        for cache, specs in (("fp8", args.fp8_tiles), ("bf16", args.bf16_tiles)):
            for spec in specs:
                tiles, cap = _tiles_and_cap(spec)
                caps = {**forward._GPU_MAXNREG, (cache == "fp8", D, *tiles[:3]): cap} if cap else forward._GPU_MAXNREG
                calls[f"ours_{cache}_t{spec.replace(',', '_')}"] = _with_settings(_with_tiles(
                    calls[f"ours_{cache}"], tiles), HEAD_PAIRS=False, _GPU_MAXNREG=caps)
        if args.pairs:
            calls["ours_bf16_pairs"] = _with_settings(calls["ours_bf16"], HEAD_PAIRS=True)
            calls["ours_bf16_pairs_off"] = _with_settings(calls["ours_bf16"], HEAD_PAIRS=False)
        for spec in args.pair_tiles:
            calls[f"ours_bf16_pt{spec.replace(',', '_')}"] = _with_settings(
                _with_tiles(calls["ours_bf16"], tuple(int(x) for x in spec.split(",")), key=2 * D), HEAD_PAIRS=True)
        if args.no_combine:
            for name in [n for n in ("ours_bf16", "ours_bf16_pairs") if n in calls]:
                calls["nocombine" + name[4:]] = _with_settings(calls[name], combine=lambda *a, **kw: None)
        for n in args.splits:
            calls[f"ours_bf16_s{n}"] = (lambda n=n: fmha.attention_with_kvcache(q, kc, vc, lens, block_table=table,
                                                                              num_splits=n))
        for n in args.fp8_splits:
            calls[f"ours_fp8_s{n}"] = (lambda n=n: fmha.attention_with_kvcache(
                q, kc8, vc8, lens, block_table=table, k_descale=k_descale, v_descale=v_descale, num_splits=n))
        for mode in args.v_words:
            calls[f"ours_fp8_vw{mode}"] = _with_settings(calls["ours_fp8"], FP8_V_WORDS=mode)
        for vname, module in versions.items():
            calls[f"ours_fp8@{vname}"] = _with_forward(calls["ours_fp8"], module)
        ref = cudnn().transpose(1, 2).float()
        assert (calls["ours_bf16"]().float() - ref).abs().max().item() < 2e-2
        ref8, _ = attention_ref(q, k8, v8, k_descale=k_descale, v_descale=v_descale)
        for name in [n for n in calls if n.startswith("ours_")]:
            try:
                got = calls[name]()
            except Exception as e:     # a swept tile config that does not fit (shared memory): drop it
                if not name.startswith(("ours_fp8_t", "ours_bf16_t", "ours_bf16_pt")):
                    raise
                print(f"  {name}: {type(e).__name__}: {str(e)[:120]}", flush=True)
                del calls[name]
                continue
            assert (got.float() - (ref8 if "fp8" in name else ref)).abs().max().item() < 3e-2, name
        qo = 2 * q.numel() * q.element_size()            # Q read and O written, bf16
        nbytes = {"bf16": 2 * k.numel() * 2 + qo, "fp8": 2 * k.numel() + qo}
        times = interleaved_times(calls, args.rounds)
        row = dict(b=b, hq=hq, hk=hk, sk=sk, page=page or 0)
        for name, ts in times.items():
            t = statistics.median(ts)
            row[f"{name}_gbps"] = (nbytes["fp8"] if "fp8" in name else nbytes["bf16"]) / t / 1e9
            row[f"{name}_us"] = t * 1e6
        row["fp8_speedup"] = row["ours_bf16_us"] / row["ours_fp8_us"]
        row["fp8_vs_read"] = row["ours_fp8_gbps"] / row["read_fp8_gbps"]
        row["bf16_vs_read"] = row["ours_bf16_gbps"] / row["read_bf16_gbps"]
        rows.append(row)
        print(f"b={b:<3} sk={sk:<6} page={page or '-':<3} | GB/s bf16 {row['ours_bf16_gbps']:7.1f} "
              f"(read {row['read_bf16_gbps']:7.1f})  fp8 {row['ours_fp8_gbps']:7.1f} (read {row['read_fp8_gbps']:7.1f})"
              f"  cudnn {row['cudnn_gbps']:7.1f} | fp8 speedup {row['fp8_speedup']:.2f}x"
              + (f" | 64-row tiles: bf16 {row['ours_bf16_wide_gbps']:7.1f} fp8 {row['ours_fp8_wide_gbps']:7.1f}"
                 if page else "")
              + "".join(f" | {n.removeprefix('ours_')} {row[n + '_gbps']:7.1f}" for n in calls
                        if n.startswith(("nocombine", "ours_fp8_t", "ours_fp8@", "ours_bf16_t", "ours_bf16_s",
                                         "ours_bf16_p", "ours_fp8_vw", "ours_fp8_s"))),
              flush=True)
        del q, k, v, k8, v8, kc, vc, kc8, vc8, calls
        torch.cuda.empty_cache()
        if args.out:                                     # after every case, so a cut-off run keeps its rows
            save_sweep(args.out, rows)


if __name__ == "__main__":
    main()
