"""`fmha bench`: our kernels against every peer importable here, in one process, on the same inputs.

Each row reports TFLOP/s (FlashMLA's formula: 2 * visible (q, k) pairs * heads * (dqk + dv)), GB/s
(each input read once, the output written once), the ratio of ours to each peer, and the fraction of
this GPU's own bf16 matmul peak and device-copy bandwidth, both measured in the same run.
Peers are optional imports: torch SDPA (FLASH_ATTENTION = FlashAttention-2, CUDNN_ATTENTION), FlexAttention
(compiled), and `flash_attn` (FA2) / `flash_attn_interface` (FA3) when installed.
"""
from __future__ import annotations

import argparse
import datetime
import itertools
import json
import os
import statistics
import subprocess
import sys
import time

import torch


# ---------------------------------------------------------------------------------------------- timing

def time_fn(fn, runs=20, warmup=5):
    """Median seconds per call. CUDA: events around each call after warm-up; CPU: wall clock."""
    for _ in range(warmup):
        fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        times = []
        for _ in range(runs):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        return statistics.median(times)
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def bench_gpu(fn, rep_ms=200):
    """Median seconds per call on the GPU; triton's do_bench flushes L2 between calls."""
    import triton.testing

    return triton.testing.do_bench(fn, warmup=50, rep=rep_ms, return_mode="median") / 1e3


def bench_gpu_graph(fn, rep_ms=200):
    """Median seconds per call replayed from a CUDA graph: decode steps are captured in serving, and a
    graph takes the host's launch cost out of a call this short (the same for ours and every peer)."""
    import triton.testing

    # do_bench_cudagraph runs `fn` on new streams that do not wait for the current one: without this sync, the
    # first call could read inputs (a block table, a cache) whose initialising kernels are still running —
    # garbage page indices and an illegal address, seen here on 1-GiB caches.
    torch.cuda.synchronize()
    with torch.cuda.stream(torch.cuda.Stream()):
        return triton.testing.do_bench_cudagraph(fn, rep=rep_ms, return_mode="median") / 1e3


def interleaved_times(calls, rounds, timer=bench_gpu_graph):
    """{name: [seconds, one a round]} for a dict of callables, each round timing every call in turn, so that a
    drift of the GPU's clocks over the run falls on all of them alike (the probes take the median)."""
    times = {name: [] for name in calls}
    for _ in range(rounds):
        for name, call in calls.items():
            times[name].append(timer(call))
    return times


def visible_pairs(sq, sk, window, causal):
    """Number of (query, key) pairs the mask lets through, per (batch, head)."""
    left, right = window
    if causal:
        right = 0
    total = 0
    for i in range(sq):
        lo = 0 if left < 0 else max(0, i + sk - sq - left)
        hi = sk - 1 if right < 0 else min(sk - 1, i + sk - sq + right)
        total += max(0, hi - lo + 1)
    return total


def attention_flops(b, sq, sk, hq, dqk, dv, window=(-1, -1), causal=False):
    return 2 * b * hq * visible_pairs(sq, sk, window, causal) * (dqk + dv)


def gpu_ceilings(fp8=False):
    """This GPU's bf16 matmul rate (8192^3) and device-copy bandwidth (bytes read + written), measured now;
    `fp8`: also its e4m3 matmul rate (`torch._scaled_mm`, bf16 out)."""
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    t_mm = bench_gpu(lambda: torch.matmul(a, b))
    extra = {}
    if fp8:
        a8, b8 = a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn).t().contiguous().t()     # column-major b
        one = torch.ones((), device="cuda")
        t8 = bench_gpu(lambda: torch._scaled_mm(a8, b8, scale_a=one, scale_b=one, out_dtype=torch.bfloat16))
        extra["fp8_matmul_tflops"] = 2 * n ** 3 / t8 / 1e12
        del a8, b8
    del a, b
    src = torch.randn(256 * 1024 * 1024, device="cuda")          # 1 GiB
    dst = torch.empty_like(src)
    t_cp = bench_gpu(lambda: dst.copy_(src))
    nbytes = 2 * src.numel() * src.element_size()
    del src, dst
    return dict(matmul_tflops=2 * n ** 3 / t_mm / 1e12, copy_gbps=nbytes / t_cp / 1e9, **extra)


# ----------------------------------------------------------------------------------------------- peers

def prefill_peers():
    """name → builder(q, k, v, causal) returning a zero-arg callable. q/k/v are NHD (b, s, h, d)."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    peers = {}

    def sdpa(backend):
        def build(q, k, v, causal):
            qt, kt, vt = (t.transpose(1, 2).contiguous() for t in (q, k, v))   # SDPA's native (b, h, s, d)
            gqa = q.shape[2] != k.shape[2]

            def call():
                with sdpa_kernel(backend):
                    return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal, enable_gqa=gqa)
            return call
        return build

    peers["cudnn"] = sdpa(SDPBackend.CUDNN_ATTENTION)
    peers["sdpa-fa2"] = sdpa(SDPBackend.FLASH_ATTENTION)
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
        # Every case is a new shape: without a higher limit dynamo stops recompiling after 8 and flex
        # silently falls back to an unfused, score-materialising implementation (it would time the wrong thing).
        for name in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit"):
            if hasattr(torch._dynamo.config, name):
                setattr(torch._dynamo.config, name, 4096)
        flex = torch.compile(flex_attention, dynamic=False)

        def build_flex(q, k, v, causal):
            qt, kt, vt = (t.transpose(1, 2).contiguous() for t in (q, k, v))
            mask = None
            if causal:
                sq, sk = q.shape[1], k.shape[1]
                mask = create_block_mask(lambda b, h, i, j: j <= i + (sk - sq), None, None, sq, sk)
            gqa = q.shape[2] != k.shape[2]
            return lambda: flex(qt, kt, vt, block_mask=mask, enable_gqa=gqa)
        peers["flex"] = build_flex
    except ImportError:
        pass
    try:
        import flash_attn
        peers["flash_attn2"] = lambda q, k, v, causal: (lambda: flash_attn.flash_attn_func(q, k, v, causal=causal))
    except ImportError:
        pass
    try:
        import flash_attn_interface
        peers["fa3"] = lambda q, k, v, causal: (lambda: flash_attn_interface.flash_attn_func(q, k, v, causal=causal))
    except ImportError:
        pass
    return peers


# ---------------------------------------------------------------------------------------------- prefill

PREFILL_CASES = [(d, s, causal) for d in (64, 128, 256) for s in (1024, 4096, 16384) for causal in (False, True)]
# head_dim_qk -> head_dim_v where they differ: DeepSeek's MLA prefill (192 / 128). Run with `--head-dim 192`.
PREFILL_VALUE_DIMS = {192: 128}


def bench_prefill(args, record):
    """`--dtype fp8`: ours on float8_e4m3fn q, k, v (no descales), the portable kernel on the same, and our bf16
    path and every (bf16) peer on the same values widened to bf16: the attention they all compute is the same."""
    import fmha

    total_tokens, hidden = 16384, 2048
    dtype = torch.bfloat16
    fp8 = getattr(args, "dtype", "bf16") == "fp8"
    peers = prefill_peers()
    rows = []
    cases = PREFILL_CASES
    if args.head_dim:
        cases = [(d, s, causal) for d in args.head_dim for s in (1024, 4096, 16384) for causal in (False, True)]
    for d, s, causal in cases:
        b, h = total_tokens // s, hidden // d
        dv = PREFILL_VALUE_DIMS.get(d, d)
        torch.manual_seed(0)
        q, k, v = (torch.randn(b, s, h, dim, device="cuda", dtype=dtype) for dim in (d, d, dv))
        flops = attention_flops(b, s, s, h, d, dv, causal=causal)
        impls = {}
        if fp8:
            q8, k8, v8 = (t.to(torch.float8_e4m3fn) for t in (q, k, v))
            q, k, v = (t.to(dtype) for t in (q8, k8, v8))
            impls["ours"] = lambda: fmha.attention(q8, k8, v8, causal=causal)
            impls["ours-triton"] = _portable_prefill(q8, k8, v8, causal)
            impls["ours-bf16"] = lambda: fmha.attention(q, k, v, causal=causal)
        else:
            impls["ours"] = lambda: fmha.attention(q, k, v, causal=causal)
            impls["ours-triton"] = _portable_prefill(q, k, v, causal)
        nbytes = 2 * (q.numel() + v.numel()) * (1 if fp8 else q.element_size())
        for name, build in peers.items():
            impls[name] = build(q, k, v, causal)
        ref_name = "ours-bf16" if fp8 else "ours"
        ref = impls[ref_name]().float()
        row = dict(workload="prefill", d=d, s=s, b=b, h=h, causal=causal, **({"dv": dv} if dv != d else {}),
                   **({"dtype": "fp8"} if fp8 else {}))
        # FP8: our e4m3 P is within 2^-4 of the exact one (`tests/utils.assert_matches_fp8_p`), so an output
        # with few keys (the first causal rows) is within 2^-4 max |v| only; a wrong kernel is off by far more.
        # The slack is for our FP8 kernels alone: the bf16 peers compute what the reference does.
        tol = 0.05
        if fp8:
            tol = dict.fromkeys(("ours", "ours-triton"), 0.05 + 2.0 ** -3 * v.abs().max().item())
        _measure(row, impls, ref, flops, nbytes, ratio_of="tflops", graph=False,
                 to_nhd=lambda o: o.transpose(1, 2) if o.shape[1] == h and o.shape[2] == s else o, tol=tol,
                 ref_name=ref_name)
        rows.append(row)
        record(row)
        _print_row(row, list(impls))
        del q, k, v, ref
        torch.cuda.empty_cache()
    return rows


def _portable_prefill(q, k, v, causal):
    """Our `triton.language` kernel on the same inputs (what runs where the Gluon path does not apply); an FP8 q
    gives a bf16 output."""
    from .kernels.forward import attention_forward
    out = torch.empty((*q.shape[:3], v.shape[-1]), device=q.device,
                      dtype=torch.bfloat16 if q.element_size() == 1 else q.dtype)
    lse = torch.empty(q.shape[0], q.shape[2], q.shape[1], dtype=torch.float32, device=q.device)

    def call():
        attention_forward(q, k, v, out, lse, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=q.shape[1],
                          max_seqlen_k=k.shape[1], softmax_scale=None, window=(-1, 0 if causal else -1),
                          softcap=0.0, alibi_slopes=None, sinks=None, backend="triton")
        return out
    return call


def _error_text(e):
    """One line for a row: the exception's type and the first line of its message."""
    return f"{type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}"


HEAT_S = 1.0                      # seconds of the row's own calls before its first timing (`_heat`)


def _heat(fns, seconds=HEAT_S):
    """Run `fns` round-robin for `seconds`, untimed. Timed straight after a pause, the first implementation of a
    row ran at the clocks of a GPU below its power cap: ours, timed first, read 2-3% above its own later timings
    while cuDNN and FA2 did not move (`benchmarks/probe_drift.py`, NOTES.md fourteenth session). Every row is now
    timed at the capped clocks that a sustained workload runs at."""
    if not fns or not torch.cuda.is_available():
        return
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for fn in fns:
            fn()
        torch.cuda.synchronize()


TIMING_ROUNDS = 3                 # timings of each implementation a row, in interleaved rounds (`_measure`)
HOST_CALLS = 20                   # calls issued back to back for an eager row's host time a call (`_host_us`)


def _host_us(fn, calls=HOST_CALLS):
    """Microseconds of host time a call: `calls` calls issued back to back (fewer than the GPU's launch queue holds, so
    none waits for the GPU), then one synchronisation. An eager timing runs at the GPU's speed only while this stays
    under the GPU's time for the call and do_bench's L2 clear; above it, the timing measures the host (the d = 256 1k
    causal prefill row: NOTES.md, thirty-ninth and fifty-seventh sessions)."""
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    sync()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    elapsed = time.perf_counter() - t0
    sync()
    return elapsed / calls * 1e6


def _time_once(fn, graph, row, name):
    """Seconds per call of one timing: CUDA-graph replays when `graph` (eager if capture fails, then for the row's
    later rounds too; the row says which), else eager calls."""
    if graph and row.get(f"{name}_timing") != "eager":
        try:
            t = bench_gpu_graph(fn)
            row[f"{name}_timing"] = "cuda-graph"
            return t
        except Exception:
            torch.cuda.synchronize()
            row[f"{name}_timing"] = "eager"
    return bench_gpu(fn)


def _measure(row, impls, ref, flops, nbytes, *, ratio_of, graph, to_nhd, rounds=TIMING_ROUNDS, tol=0.05,
             ref_name="ours"):
    """Check each implementation but `ref_name` against `ref`, `ref_name`'s output (ours, or our bf16 path for FP8
    prefill rows, where ours is checked too: same inputs, same answer within `tol`, a number or {name: its
    tolerance} with 0.05 for the names left out, never time a wrong kernel;
    `to_nhd` puts a checked output in `ref`'s layout), time it, and fill
    `row` with TFLOP/s, GB/s and ours / peer on `ratio_of`. A peer that cannot run is reported, not fatal.
    The implementations that pass run for a while untimed first (`_heat`), then are timed `rounds` times in
    interleaved rounds (ours, each peer, ours, ...), and each keeps the median of its timings (all of them in
    `{name}_rounds`, in `ratio_of`'s unit). One timing can read far low when the host stalls (an eager call whose
    host time outlasts the GPU's work leaves the GPU idle): the d = 256 1k causal prefill read 248 TFLOP/s in one
    record against 419 in the next process (NOTES.md, fiftieth session); interleaved, such a stall costs one
    round of one implementation, which the median drops. `graph`: time CUDA-graph replays. An eagerly timed
    implementation's host time a call goes in `{name}_host_us` (`_host_us`)."""
    ok = {}
    for name, fn in impls.items():
        try:
            out = fn()
            out = out[0] if isinstance(out, (tuple, list)) else out     # a torch op returns a list
            if name != ref_name:
                err = (to_nhd(out).float() - ref).abs().max().item()
                if err > (tol.get(name, 0.05) if isinstance(tol, dict) else tol):
                    raise RuntimeError(f"disagrees with {ref_name} (max abs diff {err:.3f})")
            ok[name] = fn
        except Exception as e:
            row[f"{name}_error"] = _error_text(e)
    _heat(list(ok.values()))
    times = {name: [] for name in ok}
    for _ in range(rounds):
        for name in list(times):
            try:
                times[name].append(_time_once(ok[name], graph, row, name))
            except Exception as e:
                row[f"{name}_error"] = _error_text(e)
                del times[name]
    for name in times:
        if not graph or row.get(f"{name}_timing") == "eager":
            try:
                row[f"{name}_host_us"] = _host_us(ok[name])
            except Exception as e:
                row[f"{name}_error"] = _error_text(e)
    work, unit = (flops, 1e12) if ratio_of == "tflops" else (nbytes, 1e9)
    for name, ts in times.items():
        t = statistics.median(ts)
        row[f"{name}_tflops"] = flops / t / 1e12
        row[f"{name}_gbps"] = nbytes / t / 1e9
        row[f"{name}_rounds"] = "/".join(f"{work / x / unit:.1f}" for x in ts)
    for name in impls:
        if name != "ours" and f"{name}_{ratio_of}" in row and f"ours_{ratio_of}" in row:
            row[f"ours_vs_{name}"] = row[f"ours_{ratio_of}"] / row[f"{name}_{ratio_of}"]


def _print_row(row, names):
    head = f"d={row['d']:<3} s={row['s']:<5} b={row['b']:<2} h={row['h']:<2} {'causal' if row['causal'] else 'full  '}"
    cells = []
    for n in names:
        if f"{n}_tflops" in row:
            cells.append(f"{n} {row[f'{n}_tflops']:6.1f}")
        else:
            cells.append(f"{n} n/a")
    ratios = [f"x{n} {row[f'ours_vs_{n}']:.2f}" for n in names if f"ours_vs_{n}" in row]
    host = [f"{n} {row[f'{n}_host_us']:.0f}" for n in names if f"{n}_host_us" in row]
    print(head + " | TFLOP/s " + "  ".join(cells) + " | " + " ".join(ratios) + " | host us " + " ".join(host),
          flush=True)


# ----------------------------------------------------------------------------------------------- decode

# (batch, heads_q, heads_k, seqlen_k, page_size or None for a contiguous cache), d = 128 unless --head-dim says
DECODE_CASES = [(64, 32, 8, 4096, None), (64, 32, 8, 4096, 16), (64, 32, 8, 4096, 64),
                (1, 32, 8, 131072, 64), (4, 32, 8, 131072, 64), (32, 32, 32, 8192, 64)]


def quantize_fp8(x, heads_k):
    """x (b, s, h, d) as float8_e4m3fn with one descale per (batch, KV head), FlashAttention-3's convention (a query
    head group shares its KV head's): `(x8, descale (b, heads_k) fp32)`, each group's largest magnitude mapped to
    e4m3's 448. For `fmha run --dtype fp8` and the FP8 probes."""
    b, s, h, d = x.shape
    groups = x.float().reshape(b, s, heads_k, h // heads_k, d)
    largest = groups.abs().amax(dim=(1, 3, 4)) if s else groups.new_zeros(b, heads_k)     # (s = 0: no value)
    descale = largest.clamp_min(1e-6) / 448.0
    x8 = (groups / descale[:, None, :, None, None]).to(torch.float8_e4m3fn)
    return x8.reshape(b, s, h, d), descale


def paged_copy(page_size, *tensors, perm=None):
    """The same keys as each contiguous `(b, s, h, d)` tensor in paged caches whose pages are stored in one
    shuffled order, or in `perm`'s (page i of the flattened (b, pages) order goes to cache page perm[i]):
    `(*caches, block_table)`. When s is not a multiple of page_size, each sequence's last page holds NaN past s
    (which a kernel must not read)."""
    b, s = tensors[0].shape[:2]
    pages = -(-s // page_size)
    if perm is None:
        perm = torch.randperm(b * pages, device=tensors[0].device)
    caches = []
    for t in tensors:
        # FP8 pages move as bytes: index_put is not implemented for float8 everywhere. 0x7F is e4m3's NaN.
        raw = t.view(torch.uint8) if t.element_size() == 1 else t
        padded = raw
        if pages * page_size > s:
            nan = 0x7F if raw.dtype == torch.uint8 else float("nan")
            padded = raw.new_full((b, pages * page_size, *t.shape[2:]), nan)
            padded[:, :s] = raw
        cache = torch.empty(b * pages, page_size, *t.shape[2:], device=t.device, dtype=raw.dtype)
        cache[perm] = padded.reshape(b * pages, page_size, *t.shape[2:])
        caches.append(cache.view(t.dtype))
    return (*caches, perm.view(b, pages).to(torch.int32))


def bench_decode(args, record):
    """One new token per sequence against a full cache: bytes = K + V read once + Q + O. Every impl is
    timed as CUDA-graph replays (eager if it cannot be captured; the row says which)."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import fmha

    dtype = torch.bfloat16
    for d, (b, hq, hk, sk, page) in itertools.product(args.head_dim or (128,), DECODE_CASES):
        torch.manual_seed(0)
        q = torch.randn(b, 1, hq, d, device="cuda", dtype=dtype)
        k = torch.randn(b, sk, hk, d, device="cuda", dtype=dtype)
        v = torch.randn(b, sk, hk, d, device="cuda", dtype=dtype)
        seqlens = torch.full((b,), sk, dtype=torch.int32, device="cuda")
        table = None
        k_cache, v_cache = k, v
        if page:
            k_cache, v_cache, table = paged_copy(page, k, v)
        nbytes = (2 * k.numel() + 2 * q.numel()) * k.element_size()
        flops = attention_flops(b, 1, sk, hq, d, d)
        impls = {"ours": lambda: fmha.attention_with_kvcache(q, k_cache, v_cache, seqlens, block_table=table)}
        qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)    # SDPA views of the contiguous cache

        def sdpa(backend):
            def call():
                with sdpa_kernel(backend):
                    return F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=hq != hk)
            return call
        impls["cudnn"] = sdpa(SDPBackend.CUDNN_ATTENTION)
        impls["sdpa-fa2"] = sdpa(SDPBackend.FLASH_ATTENTION)
        ref = impls["ours"]().float()
        row = dict(workload="decode", d=d, b=b, hq=hq, hk=hk, sk=sk, page=page or 0)
        _measure(row, impls, ref, flops, nbytes, ratio_of="gbps", graph=True, to_nhd=lambda o: o.transpose(1, 2))
        _read_yardstick(row, k_cache, v_cache, table, sk, nbytes)
        _fp8_cache_row(row, q, k, v, seqlens, table, page, nbytes)
        record(row)
        cells = "  ".join(f"{n} {row[f'{n}_gbps']:7.1f}" for n in (*impls, "read", "ours-fp8") if f"{n}_gbps" in row)
        print(f"d={d:<3} b={b:<3} hq={hq:<2} hk={hk:<2} sk={sk:<6} page={page or '-':<3} | GB/s {cells} | "
              f"ours/read {row.get('ours_vs_read', float('nan')):.3f} | "
              f"copy-bw frac {row.get('ours_frac_copy_bw', float('nan')):.2f} | "
              f"fp8 cache: x{row.get('ours-fp8_vs_ours', float('nan')):.2f} ours' tokens/s, "
              f"{row.get('ours-fp8_vs_read-fp8', float('nan')):.3f} of its read", flush=True)
        del q, k, v, k_cache, v_cache
        torch.cuda.empty_cache()


def _fp8_cache_row(row, q, k, v, seqlens, table, page, nbytes):
    """The row's keys in an FP8 (e4m3) cache with per-(batch, KV head) descales (`quantize_fp8`), paged in the same
    page order: ours on it, checked against the fp32 oracle on the same FP8 values, timed as CUDA-graph replays, and
    the pure read of that cache. GB/s count its own bytes (K and V at one byte a value); `ours-fp8_vs_ours` and
    `ours-fp8_vs_cudnn` are tokens a second against the bf16 cache's calls of this row."""
    import fmha
    from .reference import attention_ref

    hk, sk = k.shape[2], k.shape[1]
    (k8, k_descale), (v8, v_descale) = quantize_fp8(k, hk), quantize_fp8(v, hk)
    k_cache, v_cache = k8, v8
    if page:
        k_cache, v_cache, _ = paged_copy(page, k8, v8, perm=table.flatten().long())

    def call():
        return fmha.attention_with_kvcache(q, k_cache, v_cache, seqlens, block_table=table, k_descale=k_descale,
                                           v_descale=v_descale)
    try:
        ref, _ = attention_ref(q, k8, v8, k_descale=k_descale, v_descale=v_descale)
        err = (call().float() - ref).abs().max().item()
        if err > 3e-2:
            raise RuntimeError(f"disagrees with the oracle (max abs diff {err:.3f})")
        _heat([call])
        t = bench_gpu_graph(call)
    except Exception as e:
        row["ours-fp8_error"] = _error_text(e)
        return
    nbytes8 = nbytes - 2 * k.numel() * (k.element_size() - 1)    # K and V at one byte a value; Q and O as they were
    row["ours-fp8_gbps"] = nbytes8 / t / 1e9
    for name in ("ours", "cudnn"):
        if f"{name}_gbps" in row:
            row[f"ours-fp8_vs_{name}"] = nbytes / row[f"{name}_gbps"] / 1e9 / t
    _read_yardstick(row, k_cache, v_cache, table, sk, nbytes8, read="read-fp8", ours="ours-fp8")


def kv_read_call(k_cache, v_cache, table, keys):
    """The pure read of a cache (same layout, same page order; `kernels.kv_read`): `(call, whole)`, `whole` saying
    whether the call read every word (its fold is the cache's; every page of the cache must be in the table, as in
    `paged_copy`'s caches). Each KV head's keys are cut so the read fills about two programs per SM."""
    from .kernels.kv_read import kv_read, xor_fold
    from .schedule import num_sms

    programs = k_cache.shape[2] * (table.shape[0] if table is not None else k_cache.shape[0])
    splits = 1
    while programs * splits <= num_sms(k_cache.device) and keys % (256 * splits) == 0:
        splits *= 2            # doubling keeps the grid within two programs per SM and whole 128-key steps
    call = kv_read(k_cache, v_cache, table, keys, splits=splits)
    return call, xor_fold(call()) == xor_fold(k_cache) ^ xor_fold(v_cache)


def _read_yardstick(row, k_cache, v_cache, table, keys, nbytes, read="read", ours="ours"):
    """Time the pure read of the very cache `ours` read (`kv_read_call`) and put `ours` / `read` in the row: what no
    decode kernel on this cache can beat by much."""
    call, whole = kv_read_call(k_cache, v_cache, table, keys)
    if not whole:
        row[f"{read}_error"] = "the read's fold differs from the cache's"
        return
    row[f"{read}_gbps"] = nbytes / bench_gpu_graph(call) / 1e9
    row[f"{ours}_vs_{read}"] = row[f"{ours}_gbps"] / row[f"{read}_gbps"] if f"{ours}_gbps" in row else float("nan")


# -------------------------------------------------------------------------------------------------- mla

# FlashMLA's benchmark grid: b = 128, lengths s_k, query heads h_q, s_q (MTP), one latent KV head, 576/512.
MLA_CASES = [(128, sk, hq, sq) for sk in (4096, 8192, 16384) for hq in (16, 32, 64, 128) for sq in (1, 2)]


def mla_peers():
    """name → builder(q, cache, table, seqlens, s_q, h_q) for every MLA decode kernel importable here."""
    peers = {}
    try:
        import flash_mla

        def build_flash_mla(q, cache, table, seqlens, sq, hq):
            meta = flash_mla.get_mla_metadata(seqlens, sq * hq, 1)
            return lambda: flash_mla.flash_mla_with_kvcache(q, cache, table, seqlens, 512, *meta, causal=sq > 1)
        peers["flash_mla"] = build_flash_mla
    except ImportError:
        pass
    return peers


def _portable_mla(q, cache, table, seqlens, meta, splits, causal):
    """Our `triton.language` MLA kernel on the same inputs (where the Gluon path does not apply)."""
    from .kernels.mla_decode import mla_decode_forward
    out = q.new_empty(*q.shape[:3], 512)
    lse = torch.empty(q.shape[0], q.shape[2], q.shape[1], dtype=torch.float32, device=q.device)

    def call():
        mla_decode_forward(q[..., :512], q[..., 512:], cache[..., :512], cache[..., 512:], table, seqlens, meta,
                           splits, out, lse, softmax_scale=576 ** -0.5, causal=causal, backend="triton")
        return out
    return call


def bench_mla(args, record):
    """MLA decode over a paged cache (page 64, pages shuffled), FlashMLA's formulas: FLOPs =
    2 * visible (q, k) pairs * h_q * (576 + 512); bytes = the cache read once + Q + O. CUDA-graph timing, the
    plan (get_mla_metadata) made once outside the timed call, as FlashMLA's own benchmark does."""
    import fmha.mla as ours_mla

    dtype, page = torch.bfloat16, 64
    peers = mla_peers()
    for b, sk, hq, sq in MLA_CASES:
        torch.manual_seed(0)
        q = torch.randn(b, sq, hq, 576, device="cuda", dtype=dtype)
        kv = torch.randn(b, sk, 1, 576, device="cuda", dtype=dtype)
        cache, table = paged_copy(page, kv)
        seqlens = torch.full((b,), sk, dtype=torch.int32, device="cuda")
        meta, splits = ours_mla.get_mla_metadata(seqlens, sq * hq, 1)
        impls = {"ours": lambda: ours_mla.flash_mla_with_kvcache(q, cache, table, seqlens, 512, meta, splits,
                                                                  causal=sq > 1),
                 "ours-triton": _portable_mla(q, cache, table, seqlens, meta, splits, causal=sq > 1)}
        for name, build in peers.items():
            impls[name] = build(q, cache, table, seqlens, sq, hq)
        ref = impls["ours"]()[0].float()
        flops = attention_flops(b, sq, sk, hq, 576, 512, causal=sq > 1)
        nbytes = (kv.numel() + q.numel() + b * sq * hq * 512) * kv.element_size()
        row = dict(workload="mla", b=b, sk=sk, hq=hq, sq=sq, page=page)
        # Memory-bound shapes (h_q * s_q <= 32) are judged by bandwidth, the rest by TFLOP/s.
        _measure(row, impls, ref, flops, nbytes, ratio_of="gbps" if hq * sq <= 32 else "tflops", graph=True,
                 to_nhd=lambda o: o)
        record(row)
        cells = "  ".join(f"{n} {row[f'{n}_tflops']:6.1f} TFLOP/s {row[f'{n}_gbps']:6.0f} GB/s"
                          if f"{n}_tflops" in row else f"{n} n/a {row.get(f'{n}_error', '')}" for n in impls)
        print(f"b={b} sk={sk:<5} hq={hq:<3} sq={sq} | {cells} | matmul frac "
              f"{row.get('ours_frac_matmul_peak', float('nan')):.2f} copy frac "
              f"{row.get('ours_frac_copy_bw', float('nan')):.2f}", flush=True)
        del q, kv, cache, ref
        torch.cuda.empty_cache()


# ----------------------------------------------------------------------------------------------- sparse

# DeepSeek-V3.2/V4 sparse attention, issue 5's rows. Decode: (name, b, h_q, s_q, d_qk, FP8 layout, topk, main page,
# extra topk, extra page); FLOPs count the selected tokens only: 2 * b * s_q * h_q * (topk + extra) * (d_qk + 512).
SPARSE_DECODE_CASES = [("v32-fp8", b, 128, 2, 576, "v32", 2048, 64, 0, 0) for b in (64, 128)] + \
    [("v4-fp8", b, hq, 2, 512, "model1", 128, 256, extra, 64) for hq, extra in ((64, 512), (128, 1024))
     for b in (64, 128)]
# Prefill: (name, s_q, s_kv, h_q, d_qk, topk).
SPARSE_PREFILL_CASES = [("prefill", 4096, 32768, 128, 576, 2048), ("prefill", 4096, 32768, 64, 576, 2048),
                        ("prefill", 4096, 32768, 128, 512, 2048)]
# FlashMLA's figures on this workplace's H100 from SPEC.md (an earlier run, not this one): for a cross-run ratio
# only, keyed by (name, b or s_q, h_q, d_qk).
SPEC_FLASH_MLA_TFLOPS = {("v32-fp8", 64, 128, 576): 398, ("v32-fp8", 128, 128, 576): 411,
                         ("v4-fp8", 64, 64, 512): 236, ("v4-fp8", 128, 64, 512): 269,
                         ("v4-fp8", 64, 128, 512): 370, ("v4-fp8", 128, 128, 512): 383,
                         ("prefill", 4096, 128, 576): 569, ("prefill", 4096, 64, 576): 529,
                         ("prefill", 4096, 128, 512): 578}


def _sparse_cache(b, tokens_per_seq, page, d, layout, g):
    """A shuffled paged cache of b sequences (packed FP8 when `layout`) and each sequence's flat token positions."""
    kv = torch.randn(b, tokens_per_seq, 1, d, device="cuda", dtype=torch.bfloat16, generator=g)
    cache, table = paged_copy(page, kv)
    del kv
    if layout:
        import fmha.mla as ours_mla
        cache = ours_mla.quantize_kv_cache(cache, layout)
    slots = torch.arange(tokens_per_seq, device="cuda")
    positions = table.long()[:, slots // page] * page + slots % page        # (b, tokens_per_seq)
    return cache, positions.to(torch.int32)


def _pick(positions, s_q, topk, g):
    """(b, s_q, topk) distinct random tokens of each sequence."""
    b, n = positions.shape
    order = torch.rand(b, s_q, n, device="cuda", generator=g).argsort(-1)[..., :topk]
    return torch.gather(positions.unsqueeze(1).expand(b, s_q, n), 2, order).to(torch.int32)


def sparse_prefill_inputs(case, g):
    """One SPARSE_PREFILL_CASES row's inputs (q, kv, indices): causal-style selection as in DSA prefill, token i
    picking topk of the keys before it (with repeats)."""
    name, sq, skv, hq, d, topk = case
    q = torch.randn(sq, hq, d, device="cuda", dtype=torch.bfloat16, generator=g)
    kv = torch.randn(skv, 1, d, device="cuda", dtype=torch.bfloat16, generator=g)
    base = torch.arange(sq, device="cuda") + (skv - sq)
    indices = (torch.rand(sq, 1, topk, device="cuda", generator=g) * (base + 1).view(sq, 1, 1)).long()
    return q, kv, indices.to(torch.int32)


def sparse_decode_inputs(case, g):
    """One SPARSE_DECODE_CASES row's inputs: (q, cache, cache_seqlens, attn_sink, the sparse keyword arguments of
    flash_mla_with_kvcache). The extra source is each sequence's last extra_topk tokens, in their own cache."""
    name, b, hq, sq, d, layout, topk, page, extra_topk, extra_page = case
    cache, pos = _sparse_cache(b, 4 * topk if not extra_topk else 8 * topk, page, d, layout, g)
    kw = dict(indices=_pick(pos, sq, topk, g), is_fp8_kvcache=True)
    if extra_topk:
        extra, extra_pos = _sparse_cache(b, extra_topk, extra_page, d, layout, g)
        kw.update(extra_k_cache=extra,
                  extra_indices_in_kvcache=extra_pos.unsqueeze(1).expand(b, sq, extra_topk).contiguous())
    q = torch.randn(b, sq, hq, d, device="cuda", dtype=torch.bfloat16, generator=g)
    sink = torch.randn(hq, device="cuda", generator=g)
    return q, cache, torch.zeros(b, dtype=torch.int32, device="cuda"), sink, kw


def _flash_mla_sparse_peer():
    try:
        import flash_mla
    except ImportError:
        return None
    return flash_mla


def bench_sparse(args, record):
    """FP8 token-sparse decode (V3.2 and V4 with its sliding-window source) and bf16 sparse prefill. Decode is
    timed as CUDA-graph replays, prefill eagerly; FlashMLA runs beside ours when importable, and SPEC.md's
    FlashMLA figure (an earlier run) is recorded for a cross-run ratio."""
    import fmha.mla as ours_mla

    peer = _flash_mla_sparse_peer()
    g = torch.Generator(device="cuda").manual_seed(0)
    for case in SPARSE_DECODE_CASES:
        name, b, hq, sq, d, layout, topk, page, extra_topk, extra_page = case
        q, cache, lens, sink, kw = sparse_decode_inputs(case, g)
        meta, splits = ours_mla.get_mla_metadata(lens, sq * hq, 1, num_heads_q=hq, topk=topk)
        impls = {"ours": lambda: ours_mla.flash_mla_with_kvcache(q, cache, None, lens, 512, meta, splits,
                                                                  attn_sink=sink, **kw)}
        impls["ours-triton"] = _without_gluon(impls["ours"])
        if peer is not None:
            def flash_mla_call(meta_p=peer.get_mla_metadata(lens, sq * hq, 1, num_heads_q=hq, topk=topk,
                                                            is_fp8_kvcache=True)):
                return peer.flash_mla_with_kvcache(q, cache, None, lens, 512, *meta_p, attn_sink=sink, **kw)
            impls["flash_mla"] = flash_mla_call
        selected = topk + extra_topk
        flops = 2 * b * sq * hq * selected * (d + 512)
        nbytes = b * sq * selected * cache.shape[-1] + (q.numel() + b * sq * hq * 512) * 2
        row = dict(workload="sparse", case=name, b=b, hq=hq, sq=sq, d=d, topk=topk, extra_topk=extra_topk,
                   page=page, extra_page=extra_page)
        _sparse_row(row, impls, flops, nbytes, graph=True, key=(name, b, hq, d), record=record)
        del cache, q, kw
        torch.cuda.empty_cache()
    for case in SPARSE_PREFILL_CASES:
        name, sq, skv, hq, d, topk = case
        q, kv, indices = sparse_prefill_inputs(case, g)
        impls = {"ours": lambda: ours_mla.flash_mla_sparse_fwd(q, kv, indices, d ** -0.5, 512)}
        impls["ours-triton"] = _without_gluon(impls["ours"])
        if peer is not None and hasattr(peer, "flash_mla_sparse_fwd"):
            impls["flash_mla"] = lambda: peer.flash_mla_sparse_fwd(q, kv, indices, d ** -0.5, 512)
        flops = 2 * sq * hq * topk * (d + 512)
        nbytes = (sq * topk * d + q.numel() + sq * hq * 512) * 2
        row = dict(workload="sparse", case=name, b=1, hq=hq, sq=sq, d=d, topk=topk, extra_topk=0, skv=skv)
        _sparse_row(row, impls, flops, nbytes, graph=False, key=(name, sq, hq, d), record=record)
        del q, kv, indices
        torch.cuda.empty_cache()


def _without_gluon(fn):
    """fn run with the Gluon paths switched off (FMHA_GLUON=0, read at each call): the portable kernel on the
    same inputs through the same public call."""
    def call():
        saved = os.environ.get("FMHA_GLUON")
        os.environ["FMHA_GLUON"] = "0"
        try:
            return fn()
        finally:
            if saved is None:
                del os.environ["FMHA_GLUON"]
            else:
                os.environ["FMHA_GLUON"] = saved
    return call


def _sparse_row(row, impls, flops, nbytes, *, graph, key, record):
    ref = impls["ours"]()[0].float()
    _measure(row, impls, ref, flops, nbytes, ratio_of="tflops", graph=graph, to_nhd=lambda o: o)
    spec = SPEC_FLASH_MLA_TFLOPS.get(key)
    if spec and "ours_tflops" in row:
        row["flash_mla_spec_tflops"] = spec
        row["ours_vs_flash_mla_spec"] = row["ours_tflops"] / spec
    record(row)
    cells = "  ".join(f"{n} {row[f'{n}_tflops']:6.1f} TFLOP/s" if f"{n}_tflops" in row
                      else f"{n} n/a {row.get(f'{n}_error', '')}" for n in impls)
    print(f"{row['case']:<8} b={row['b']:<3} hq={row['hq']:<3} sq={row['sq']:<4} d={row['d']} topk={row['topk']}"
          f"+{row['extra_topk']} | {cells} | vs FlashMLA (SPEC) {row.get('ours_vs_flash_mla_spec', float('nan')):.2f}"
          f" | matmul frac {row.get('ours_frac_matmul_peak', float('nan')):.2f}", flush=True)


# ------------------------------------------------------------------------------------------------ output

PEER_MODULES = ("flash_mla", "flash_attn", "flash_attn_interface")


def peer_versions():
    """The optional peer packages this run has imported (each workload's peer lookup imports its own; nothing is
    imported here) and where each came from: its version, or the file it loaded from. On the device, FlashMLA and
    FlashAttention-3 are vLLM's builds, put there by benchmarks/peers/fetch_peers.py."""
    return {name: str(getattr(module, "__version__", None) or module.__file__)
            for name in PEER_MODULES if (module := sys.modules.get(name)) is not None}


def _commit(explicit):
    """--commit, else FMHA_COMMIT (a copied tree's git HEAD can be stale), else git's HEAD."""
    explicit = explicit or os.environ.get("FMHA_COMMIT")
    if explicit:
        return explicit
    try:
        return subprocess.check_output(["git", "rev-parse", "--short", "HEAD"], text=True,
                                       stderr=subprocess.DEVNULL).strip()
    except Exception:
        return "unknown"


def load_module_copy(path, package="fmha.kernels"):
    """A copy of one of `package`'s modules at `path` (e.g. a kernel file from an earlier commit), imported as a
    module of that package so that its relative imports work: the tuning scripts' A/B of two kernel versions."""
    import importlib.util

    name = f"{package}._version_" + os.path.splitext(os.path.basename(path))[0]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def outputs_diff(got, ref):
    """The largest absolute difference between two results of one call (a tensor, or a tuple of them: out and its
    LSE, max_logits, ...), over every output: an A/B of kernel versions must not pass a version that gets out right
    and another output wrong (the hundred-and-eighteenth session's lazy-max copy wrote a stale max_logits). Values
    that are not finite must match exactly, at the same places; inf when they do not."""
    got, ref = ((t,) if isinstance(t, torch.Tensor) else tuple(t) for t in (got, ref))
    if len(got) != len(ref):
        return float("inf")
    worst = 0.0
    for g, r in zip(got, ref):
        g, r = g.float(), r.float()
        if g.shape != r.shape:
            return float("inf")
        finite = torch.isfinite(r)
        if not torch.equal(finite, torch.isfinite(g)) or not torch.equal(g[~finite], r[~finite]):
            return float("inf")
        if finite.any():
            worst = max(worst, (g[finite] - r[finite]).abs().max().item())
    return worst


def use_mla_kernels(module, routes=None):
    """Route the package's MLA calls to `module` (`kernels/mla_decode_sm90.py` or a copy of it, `load_module_copy`)
    with `routes` as their kept launch plans (new ones when None): a call key's kept plan is made by its module and
    runs only with it. Returns what it replaced, (module, routes), for swapping back."""
    from . import kernels
    from .kernels import launch, mla_decode
    old = kernels.mla_decode_sm90, mla_decode._ROUTES
    kernels.mla_decode_sm90, mla_decode._ROUTES = module, launch.Plans() if routes is None else routes
    return old


def add_probe_row(rows, row, base, names):
    """A probe script's row: `{base}_vs_{name}` for every other name's `_tflops`, appended and printed on one line."""
    for name in names:
        if name != base:
            row[f"{base}_vs_{name}"] = row[f"{base}_tflops"] / row[f"{name}_tflops"]
    rows.append(row)
    print(" ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()), flush=True)


def probe_row(rows, row, impls, flops, *, compare, timer=bench_gpu, tol=0.05):
    """A probe script's row: `ours`'s output against each impl named in `compare` (max abs error, each under `tol`,
    else RuntimeError), then every impl's TFLOP/s for `flops` as timed by `timer`, appended and printed
    (`add_probe_row`)."""
    ours = impls["ours"]().float()
    for name in compare:
        row[f"max_err_vs_{name}"] = (ours - impls[name]().float()).abs().max().item()
    if not all(row[f"max_err_vs_{name}"] < tol for name in compare):
        raise RuntimeError(f"outputs disagree: {row}")
    for name, fn in impls.items():
        row[f"{name}_tflops"] = flops / timer(fn) / 1e12
    add_probe_row(rows, row, "ours", impls)


def save_sweep(path, rows):
    """A tuning sweep's rows as JSON, with the GPU, date and commit (FMHA_COMMIT or git) recorded."""
    with open(path, "w") as f:
        json.dump(dict(gpu=torch.cuda.get_device_name(), date=datetime.date.today().isoformat(),
                       commit=_commit(os.environ.get("FMHA_COMMIT")), rows=rows), f, indent=1)


def _write(path, payload):
    with open(path, "w") as f:
        json.dump(payload, f, indent=1)
    stem = os.path.splitext(path)[0]
    keys = sorted({k for r in payload["rows"] for k in r})
    with open(stem + ".csv", "w") as f:
        f.write(",".join(keys) + "\n")
        for r in payload["rows"]:
            f.write(",".join(str(r.get(k, "")) for k in keys) + "\n")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    rows = payload["rows"]
    names = [n for n in ("ours", "ours-triton", "cudnn", "sdpa-fa2", "flex", "flash_attn2", "fa3", "flash_mla")
             if any(f"{n}_tflops" in r for r in rows)]
    if payload["workload"] == "sparse":
        labels = [f"{r['case']} b{r['b']} h{r['hq']} d{r['d']}" for r in rows]
        metric, unit, peak = "tflops", "TFLOP/s", payload["gpu"].get("matmul_tflops")
    elif payload["workload"] == "mla":
        labels = [f"h{r['hq']} sq{r['sq']} s{r['sk'] // 1024}k" for r in rows]
        metric, unit, peak = "tflops", "TFLOP/s", payload["gpu"].get("matmul_tflops")
    elif payload["workload"] == "decode":
        labels = [f"b{r['b']} h{r['hq']}/{r['hk']} s{r['sk'] // 1024}k p{r['page']}" for r in rows]
        metric, unit, peak = "gbps", "GB/s", payload["gpu"].get("copy_gbps")
    else:
        labels = [f"d{r['d']} s{r['s'] // 1024}k{' c' if r['causal'] else ''}" for r in rows]
        metric, unit, peak = "tflops", "TFLOP/s", payload["gpu"].get("matmul_tflops")
    fig, ax = plt.subplots(figsize=(max(8, len(rows) * 0.7), 4.5))
    width = 0.8 / max(1, len(names))
    for i, n in enumerate(names):
        ax.bar([x + i * width for x in range(len(rows))], [r.get(f"{n}_{metric}", 0) for r in rows], width, label=n)
    if peak:
        ceiling = "copy bandwidth" if metric == "gbps" else "bf16 matmul peak"
        ax.axhline(peak, color="k", ls="--", lw=0.8, label=f"{ceiling} (measured)")
    ax.set_xticks([x + 0.4 - width / 2 for x in range(len(rows))])
    ax.set_xticklabels(labels, rotation=60, fontsize=7)
    ax.set_ylabel(unit)
    ax.set_title(f"fmha bench {payload['workload']} — {payload['gpu']['name']}")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(stem + ".png", dpi=120)
    plt.close(fig)


def main(argv):
    from ._validate import check_head_dim

    p = argparse.ArgumentParser(prog="fmha bench", description=__doc__.splitlines()[0])
    p.add_argument("workload", choices=("prefill", "decode", "mla", "sparse"))
    p.add_argument("--out", default=None, help="JSON path (a .csv and .png are written beside it)")
    p.add_argument("--commit", default=None, help="commit to record (default: git rev-parse HEAD)")
    p.add_argument("--head-dim", type=int, nargs="*", default=None,
                   help="prefill: only these head dims (192: DeepSeek's 192 / 128, not run by default); "
                        "decode: these head dims in place of 128")
    p.add_argument("--dtype", choices=("bf16", "fp8"), default="bf16",
                   help="prefill: fp8 times ours on e4m3 inputs against the bf16 peers on the same values")
    args = p.parse_args(argv)
    for d in args.head_dim or ():      # before the GPU's ceilings are measured, not at that head dim's first row
        try:
            check_head_dim("--head-dim", d)
        except ValueError as error:
            p.error(str(error))
    if not torch.cuda.is_available():
        print("fmha bench needs a CUDA GPU (peers and timings are GPU-only)")
        return 2
    fp8 = args.dtype == "fp8"
    gpu = dict(name=torch.cuda.get_device_name(), **gpu_ceilings(fp8=fp8))
    print(f"{gpu['name']}: bf16 matmul {gpu['matmul_tflops']:.0f} TFLOP/s, copy {gpu['copy_gbps']:.0f} GB/s "
          f"(measured now)", flush=True)
    payload = dict(workload=args.workload, gpu=gpu, date=datetime.datetime.now().isoformat(timespec="seconds"),
                   commit=_commit(args.commit), torch=torch.__version__,
                   triton=__import__("triton").__version__, peers={}, rows=[])

    def record(row):
        # Written after every row, so a run cut off by a time limit still leaves what it measured.
        if "ours_tflops" in row:
            row["ours_frac_matmul_peak"] = row["ours_tflops"] / gpu["matmul_tflops"]
            if fp8:
                row["ours_frac_fp8_matmul_peak"] = row["ours_tflops"] / gpu["fp8_matmul_tflops"]
            row["ours_frac_copy_bw"] = row["ours_gbps"] / gpu["copy_gbps"]
        payload["rows"].append(row)
        payload["peers"] = peer_versions()
        if args.out:
            _write(args.out, payload)

    dict(prefill=bench_prefill, decode=bench_decode, mla=bench_mla, sparse=bench_sparse)[args.workload](args, record)
    if args.out:
        print(f"wrote {args.out}")
    return 0
