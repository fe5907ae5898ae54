"""Random cases against the fp32 oracles: shapes and options drawn together from a seeded generator, so that
combinations the hand-written tests do not list (a head_dim with a GQA ratio, a window with Sq > Sk, a page size
with splits and a short sequence, ...) are exercised too. Inputs and caches carry NaN wherever the kernel must not
read.
Each case is one seed; a failure names its seed and prints the case, so it can be replayed alone."""
import math
import os
import random

import pytest
import torch

import fmha
import fmha.mla as flash_mla
from fmha._kv_fp8 import LAYOUTS
from fmha.reference import (attention_ref, attention_varlen_ref, mla_decode_ref, mla_sparse_decode_ref,
                            mla_sparse_prefill_ref, rotary_ref)
from test_kvcache import (_appended, _assert_appended, _cache, _descales, _engine_layout, _from_starts, _in_rows,
                          _oracle, _slots)
from test_mla import (D_QK, D_V, _check, _dequantized, _paged_cache, _sparse_source, _union_of_sources,
                      _check_sparse_prefill, _poison_unread_rows)
from utils import TARGETS, assert_matches, assert_matches_fp8_p, paged_packed, poisoned

# Seeds per test and target: the GPU runs real sizes, the interpreter a few small cases. For a longer hunt,
# FMHA_FUZZ_GPU_CASES / FMHA_FUZZ_CPU_CASES raise the counts and FMHA_FUZZ_FIRST_SEED starts past the seeds
# already run (a test taking half the cases takes half the seeds from there too).
GPU_CASES = int(os.environ.get("FMHA_FUZZ_GPU_CASES", 24))
CPU_CASES = int(os.environ.get("FMHA_FUZZ_CPU_CASES", 6))
FIRST_SEED = int(os.environ.get("FMHA_FUZZ_FIRST_SEED", 0))


def _seeds(n_gpu, n_cpu):
    return [pytest.param(t.values[0], s, marks=t.marks, id=f"{t.id}-{s}") for t in TARGETS
            for s in range(FIRST_SEED, FIRST_SEED + (n_cpu if t.values[0][0] == "cpu" else n_gpu))]


def _head_dims(r, device):
    """(d_qk, d_v): mostly the fast-path sizes, sometimes any multiple of 8, 512, or DeepSeek's unequal pairs."""
    if device == "cpu":
        return r.choice([(16, 16), (32, 32), (40, 24), (64, 64)])
    return r.choice([(64, 64), (128, 128), (256, 256), (8 * r.randint(1, 32),) * 2, (192, 128), (512, 512)])


def _options(r, hq, device):
    """A random mix of the options SPEC.md defines (window, softcap, ALiBi, sinks, scale)."""
    opts = {}
    if r.random() < 0.5:
        opts["causal"] = True
    elif r.random() < 0.3:
        opts["window"] = (r.choice([-1, 0, 5, 100]), r.choice([-1, 0, 3, 64]))
    if r.random() < 0.2:
        opts["softcap"] = r.choice([5.0, 30.0])
    if r.random() < 0.2:
        opts["alibi_slopes"] = torch.rand(hq, device=device) * 0.2
    if r.random() < 0.25:
        sinks = torch.randn(hq, device=device) * 2
        sinks[0] = r.choice([math.inf, -math.inf, 0.0])
        opts["sinks"] = sinks
    if r.random() < 0.2:
        opts["softmax_scale"] = r.choice([0.05, 0.3])
    return opts


def _per_sequence_window(r, opts, batch, longest, device, chance):
    """With probability `chance`, opts' window becomes one left bound a sequence (negative: none, up to `longest`)
    with one right bound for all, as varlen and KV-cache engines pass sliding windows."""
    if r.random() < chance:
        lefts = [r.choice([-1, 0, r.randint(1, longest)]) for _ in range(batch)]
        opts.pop("causal", None)
        opts["window"] = (torch.tensor(lefts, dtype=torch.int32, device=device), r.choice([-1, 0, 7]))
        _show(lefts=lefts)


def _show(opts=None, **case):
    """Print the drawn case (pytest shows it when the test fails), the options' tensors left out."""
    print(dict(case, **{n: o for n, o in (opts or {}).items() if not isinstance(o, torch.Tensor)}))


def _dense_case(r, device):
    """A random padded-batch attention case: (b, sq, sk, hq, hk, d, dv) and options."""
    d, dv = _head_dims(r, device)
    hk = r.choice([1, 2, 4])
    hq = hk * r.choice([1, 2, 4, 8] if device == "cuda" else [1, 2])
    big = 2100 if device == "cuda" else 90
    b = r.randint(1, 3)
    sq = r.choice([1, r.randint(1, 64), r.randint(1, big)])
    sk = r.choice([sq, r.randint(1, big)])
    opts = _options(r, hq, device)
    _per_sequence_window(r, opts, b, big, device, 0.15)
    _show(opts, b=b, sq=sq, sk=sk, hq=hq, hk=hk, d=d, dv=dv)
    return (b, sq, sk, hq, hk, d, dv), opts


@pytest.mark.parametrize("target,seed", _seeds(GPU_CASES, CPU_CASES))
def test_fuzz_attention(target, seed):
    device, dtype = target
    (b, sq, sk, hq, hk, d, dv), opts = _dense_case(random.Random(1000 + seed), device)
    torch.manual_seed(seed)
    q = poisoned((b, sq, hq, d), sq, dtype, device)
    k = poisoned((b, sk, hk, d), sk, dtype, device)
    v = poisoned((b, sk, hk, dv), sk, dtype, device)
    out = torch.full((b, sq, hq, dv), float("nan"), dtype=dtype, device=device)
    got, lse = fmha.attention(q, k, v, return_lse=True, out=out, **opts)
    assert_matches(got, lse, attention_ref(q, k, v, **opts), dtype)


@pytest.mark.parametrize("target,seed", _seeds(GPU_CASES // 2, CPU_CASES // 2))
def test_fuzz_split_merge(target, seed):
    """An external merge, as a context-parallel or two-source engine runs one: the keys cut into 1-4 ranges (some
    empty, sometimes all), each attended alone without sinks (`return_lse`, the output in q's dtype or fp32), the
    parts merged (`merge_attention_states`, or the list form), then `apply_attention_sink` once. Equal to one
    attention over all the keys, sinks included; options that do not depend on positions (softcap, scale)."""
    device, dtype = target
    r = random.Random(9000 + seed)
    d, dv = _head_dims(r, device)
    hk = r.choice([1, 2, 4])
    hq = hk * r.choice([1, 2, 4])
    big = 3000 if device == "cuda" else 90
    b, sq = r.randint(1, 3), r.choice([1, r.randint(1, 300 if device == "cuda" else 20)])
    sk = r.choice([0, r.randint(1, 64), r.randint(1, big), r.randint(1, big)])      # 0: every part empty
    cuts = sorted([0, sk] + [r.choice([0, sk, r.randint(0, sk)]) for _ in range(r.randint(0, 3))])
    opts = {}
    if r.random() < 0.3:
        opts["softcap"] = r.choice([5.0, 30.0])
    if r.random() < 0.3:
        opts["softmax_scale"] = r.choice([0.05, 0.3])
    sinks = None
    if r.random() < 0.5:
        sinks = torch.randn(hq, device=device) * 2
        sinks[0] = r.choice([math.inf, -math.inf, 0.0])
    partial = r.choice([dtype, torch.float32])
    _show(opts, b=b, sq=sq, sk=sk, hq=hq, hk=hk, d=d, dv=dv, cuts=cuts, sinks=sinks is not None, partial=partial)
    torch.manual_seed(seed)
    q = poisoned((b, sq, hq, d), sq, dtype, device)
    k = poisoned((b, sk, hk, d), sk, dtype, device)
    v = poisoned((b, sk, hk, dv), sk, dtype, device)
    outs, lses = [], []
    for lo, hi in zip(cuts, cuts[1:]):
        out = torch.full((b, sq, hq, dv), math.nan, dtype=partial, device=device)
        o, lse = fmha.attention(q, k[:, lo:hi], v[:, lo:hi], return_lse=True, out=out, **opts)
        outs.append(o)
        lses.append(lse.transpose(1, 2))            # (b, sq, hq): o's shape without its last dim
    if len(outs) == 2:
        o, lse = fmha.merge_attention_states(outs[0], lses[0], outs[1], lses[1])
    else:
        o, lse = fmha.merge_attention_states_list(outs, lses)
    if sinks is not None:
        o = fmha.apply_attention_sink(o, lse, sinks)
    assert o.dtype == partial
    assert_matches(o.to(dtype), lse.transpose(1, 2), attention_ref(q, k, v, sinks=sinks, **opts), dtype)


@pytest.mark.parametrize("target,seed", _seeds(GPU_CASES // 2, CPU_CASES // 2))
def test_fuzz_attention_fp8(target, seed):
    """FP8 inputs on random cases: float8_e4m3fn q/k/v (bf16 out) or k/v beside the target's q (on the CPU, fp16 or
    bf16: see `test_fuzz_kvcache_fp8`), random descales (some left out)."""
    device, dtype = target
    r = random.Random(1500 + seed)
    (b, sq, sk, hq, hk, d, dv), opts = _dense_case(r, device)
    all_fp8 = r.random() < 0.5
    names = [n for n in ("q_descale", "k_descale", "v_descale") if (all_fp8 or n != "q_descale") and r.random() < 0.8]
    if device == "cpu":
        dtype = r.choice([torch.float16, torch.bfloat16])
    _show(all_fp8=all_fp8, descales=names, q_dtype=dtype)
    torch.manual_seed(seed)
    f8 = torch.float8_e4m3fn
    q = poisoned((b, sq, hq, d), sq, f8 if all_fp8 else dtype, device, scale=4.0 if all_fp8 else 1.0)
    k = poisoned((b, sk, hk, d), sk, f8, device, scale=4.0)
    v = poisoned((b, sk, hk, dv), sk, f8, device, scale=4.0)
    descales = {n: torch.rand(b, hk, device=device) * 0.4 + 0.05 for n in names}
    got, lse = fmha.attention(q, k, v, return_lse=True, **opts, **descales)
    assert_matches(got, lse, attention_ref(q, k, v, **opts, **descales), torch.bfloat16 if all_fp8 else dtype)


def _varlen_case(r, device, dims=None):
    """A random packed-sequences case: (lens_q, lens_k, hq, hk, d, dv), cu_seqlens_q / _k and options. `dims`: the
    (d, dv) pairs to draw from, and then at least one query row (otherwise any, and all sequences may be empty)."""
    d, dv = r.choice(dims) if dims else _head_dims(r, device)
    hk = r.choice([1, 2])
    hq = hk * r.choice([1, 2, 4, 8] if device == "cuda" else [1, 2, 4])
    big = 1500 if device == "cuda" else 60
    # decodes, speculative decodes / short tails (2-40 rows: the short launch's forms over a cache), longer ones
    lens_q = [r.choice([0, 1, r.randint(2, 40), r.randint(1, big)]) for _ in range(r.randint(1, 5))]
    if dims and not any(lens_q):
        lens_q[0] = r.randint(1, big)
    lens_k = [r.choice([n, r.randint(0, big)]) for n in lens_q]
    opts = _options(r, hq, device)
    _per_sequence_window(r, opts, len(lens_q), big, device, 0.25)
    _show(opts, lens_q=lens_q, lens_k=lens_k, hq=hq, hk=hk, d=d, dv=dv)
    cu_q, cu_k = (torch.tensor([0] + n, device=device).cumsum(0).to(torch.int32) for n in (lens_q, lens_k))
    return (lens_q, lens_k, hq, hk, d, dv), (cu_q, cu_k), opts


@pytest.mark.parametrize("target,seed", _seeds(GPU_CASES // 2, CPU_CASES))
def test_fuzz_attention_varlen(target, seed):
    device, dtype = target
    (lens_q, lens_k, hq, hk, d, dv), (cu_q, cu_k), opts = _varlen_case(random.Random(2000 + seed), device)
    torch.manual_seed(seed)
    q = poisoned((sum(lens_q), hq, d), sum(lens_q), dtype, device, dim=0)
    k = poisoned((sum(lens_k), hk, d), sum(lens_k), dtype, device, dim=0)
    v = poisoned((sum(lens_k), hk, dv), sum(lens_k), dtype, device, dim=0)
    got, lse = fmha.attention_varlen(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), return_lse=True, **opts)
    assert_matches(got, lse, attention_varlen_ref(q, k, v, cu_q, cu_k, **opts), dtype)


@pytest.mark.parametrize("target,seed", _seeds(GPU_CASES // 2, CPU_CASES))
def test_fuzz_attention_varlen_paged(target, seed):
    """Packed queries over a paged cache (FlashAttention's `block_table` varlen call: vLLM's mixed batches), each
    sequence's key count from `seqused_k` or `cu_seqlens_k`, pages shuffled, NaN past every count and in the pages
    no sequence uses. On Hopper a batch with 64 query rows or more takes the Gluon kernel for its longer sequences
    and the portable one, keys split as planned, for its decodes."""
    device, dtype = target
    r = random.Random(2700 + seed)
    (lens_q, lens_k, hq, hk, d, dv), (cu_q, cu_k), opts = _varlen_case(r, device)
    page = r.choice([16, 64, 256] if device == "cuda" else [16, 32])
    by_cu = r.random() < 0.3
    _show(page=page, key_counts="cu_seqlens_k" if by_cu else "seqused_k")
    torch.manual_seed(seed)
    cap = max(max(lens_k), 1)
    q = poisoned((sum(lens_q), hq, d), sum(lens_q), dtype, device, dim=0)
    k, v = (torch.randn(sum(lens_k), hk, n, device=device).to(dtype) for n in (d, dv))
    k_cache, v_cache, table = paged_packed(page, k, v, cu_k)
    spare = [torch.full((3, *t.shape[1:]), math.nan, device=device, dtype=dtype) for t in (k_cache, v_cache)]
    k_cache, v_cache = torch.cat([k_cache, spare[0]]), torch.cat([v_cache, spare[1]])      # pages no one uses
    counts = dict(cu_seqlens_k=cu_k) if by_cu else dict(cu_seqlens_k=None, seqused_k=cu_k[1:] - cu_k[:-1])
    got, lse = fmha.attention_varlen(q, k_cache, v_cache, cu_q, max_seqlen_q=max(lens_q), max_seqlen_k=cap,
                                     block_table=table, return_lse=True, **counts, **opts)
    assert_matches(got, lse, attention_varlen_ref(q, k, v, cu_q, cu_k, **opts), dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("seed", range(FIRST_SEED, FIRST_SEED + GPU_CASES // 2))
def test_fuzz_attention_varlen_fp8_aligned(seed):
    """FP8 packed sequences with 16-byte aligned rows (16 NaN columns past each head, NaN rows past the last key)
    and the Gluon kernel's head dims, so that on Hopper every case takes its e4m3 path with V's copy at
    per-sequence 16-aligned columns; one descale row a sequence; the FP8 bounds of `assert_matches_fp8_p`."""
    r = random.Random(2500 + seed)
    dims = [(64, 64), (128, 128), (256, 256), (192, 128)]
    (lens_q, lens_k, hq, hk, d, dv), (cu_q, cu_k), opts = _varlen_case(r, "cuda", dims)
    names = [n for n in ("q_descale", "k_descale", "v_descale") if r.random() < 0.8]
    _show(descales=names)
    torch.manual_seed(seed)
    f8 = torch.float8_e4m3fn
    tq, tk = sum(lens_q), sum(lens_k)
    q = poisoned((tq, hq, d), tq, f8, "cuda", dim=0, pad_cols=16, scale=2.0)
    k = poisoned((tk + 37, hk, d), tk, f8, "cuda", dim=0, pad_cols=16, scale=2.0)
    v = poisoned((tk + 37, hk, dv), tk, f8, "cuda", dim=0, pad_cols=16, scale=2.0)
    descales = {n: torch.rand(len(lens_q), hk, device="cuda") * 0.4 + 0.05 for n in names}
    got, lse = fmha.attention_varlen(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), return_lse=True, **opts,
                                     **descales)
    assert got.dtype == torch.bfloat16
    ref = attention_varlen_ref(q, k[:tk], v[:tk], cu_q, cu_k, **opts, **descales)
    assert_matches_fp8_p(got, lse, ref, q, k[:tk], v[:tk], descales, softmax_scale=opts.get("softmax_scale"))


def _kvcache_case(r, device):
    """A random KV-cache case: head dims, heads, page size, capacity, lengths, query length, splits, options."""
    d, dv = _head_dims(r, device) if r.random() < 0.3 else ((128, 128) if device == "cuda" else (64, 64))
    hk = r.choice([1, 2, 8])
    hq = hk * r.choice([1, 4, 8] if device == "cuda" else [1, 2])
    page = r.choice([None, 16, 32, 48, 64, 128, 256] if device == "cuda" else [None, 16, 32])
    capacity = (page or 16) * r.randint(1, 4096 // (page or 16) if device == "cuda" else 4)
    b = r.randint(1, 6)
    seqlens = [r.choice([0, capacity, r.randint(0, capacity)]) for _ in range(b)]
    # On the GPU also chunks of 64 rows and more (chunked prefill), mostly unsplit: the Hopper kernel takes those.
    sq = r.choice([1, 1, 2, r.randint(1, 40)] + ([r.randint(64, 400)] if device == "cuda" else []))
    splits = r.choice([0, 1, 1, 2] if sq >= 64 else [0, 0, 1, 2, 5])
    opts = _options(r, hq, device)
    _per_sequence_window(r, opts, b, capacity, device, 0.2)
    _show(opts, seqlens=seqlens, capacity=capacity, page=page, sq=sq, splits=splits, hq=hq, hk=hk, d=d, dv=dv)
    return dict(d=d, dv=dv, hk=hk, hq=hq, page=page, capacity=capacity, seqlens=seqlens, sq=sq, splits=splits), opts


def _laid_out_by_seed(k_cache, v_cache, page, d, dv, seed):
    """Half the paged caches of equal head dims laid out as engines hold them (`_engine_layout`: K and V pages side
    by side, or heads-major pages), drawn apart from the case so that a seed's other draws stay as they were."""
    if page is None or d != dv:
        return k_cache, v_cache
    layout = random.Random(9000 + seed).choice([None, None, "kv_pages", "hnd"])
    _show(layout=layout)
    return _engine_layout(k_cache, v_cache, layout) if layout else (k_cache, v_cache)


def _run_kvcache(c, opts, cache_dtype, q_dtype, device, seed, descales=None):
    """Run case `c` on a cache of `cache_dtype` (NaN past the lengths and in unused pages, sometimes in an engine's
    layout: `_laid_out_by_seed`) and check it."""
    k_cache, v_cache, table, k, v = _cache(c["seqlens"], c["capacity"], c["hk"], c["d"], c["dv"], cache_dtype, device,
                                           c["page"], seed=seed)
    k_cache, v_cache = _laid_out_by_seed(k_cache, v_cache, c["page"], c["d"], c["dv"], seed)
    torch.manual_seed(seed)
    q = torch.randn(len(c["seqlens"]), c["sq"], c["hq"], c["d"], device=device, dtype=q_dtype)
    lens = torch.tensor(c["seqlens"], dtype=torch.int32, device=device)
    descales = descales or {}
    got, lse = fmha.attention_with_kvcache(q, k_cache, v_cache, lens, block_table=table, num_splits=c["splits"],
                                           return_lse=True, **opts, **descales)
    assert_matches(got, lse, _oracle(q, k, v, c["seqlens"], **opts, **descales), q_dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("seed", range(FIRST_SEED, FIRST_SEED + GPU_CASES // 2))
def test_fuzz_attention_fp8_aligned(seed):
    """FP8 q, k and v on random cases with 16 NaN columns past each head, so that rows and heads are 16-byte aligned
    and, on Hopper, every case of a head_dim the Gluon kernel runs takes its e4m3 path (the NaN columns of
    `test_fuzz_attention_fp8` send FP8 calls to the portable kernel); the FP8 bounds of `assert_matches_fp8_p`."""
    r = random.Random(1700 + seed)
    (b, sq, sk, hq, hk, d, dv), opts = _dense_case(r, "cuda")
    names = [n for n in ("q_descale", "k_descale", "v_descale") if r.random() < 0.8]
    _show(descales=names)
    torch.manual_seed(seed)
    f8 = torch.float8_e4m3fn
    q = poisoned((b, sq, hq, d), sq, f8, "cuda", pad_cols=16, scale=2.0)
    k = poisoned((b, sk, hk, d), sk, f8, "cuda", pad_cols=16, scale=2.0)
    v = poisoned((b, sk, hk, dv), sk, f8, "cuda", pad_cols=16, scale=2.0)
    descales = {n: torch.rand(b, hk, device="cuda") * 0.4 + 0.05 for n in names}
    got, lse = fmha.attention(q, k, v, return_lse=True, **opts, **descales)
    assert got.dtype == torch.bfloat16
    assert_matches_fp8_p(got, lse, attention_ref(q, k, v, **opts, **descales), q, k, v, descales,
                         softmax_scale=opts.get("softmax_scale"))


@pytest.mark.parametrize("target,seed", _seeds(GPU_CASES, CPU_CASES))
def test_fuzz_kvcache(target, seed):
    device, dtype = target
    c, opts = _kvcache_case(random.Random(3000 + seed), device)
    _run_kvcache(c, opts, dtype, dtype, device, seed)


@pytest.mark.parametrize("target,seed", _seeds(GPU_CASES // 2, CPU_CASES // 2))
def test_fuzz_kvcache_fp8(target, seed):
    """An FP8 cache (float8_e4m3fn) beside the target's queries on random cases, with random k / v descales (some
    left out). On the CPU half the cases take bf16 queries: beside an FP8 cache those are only loaded, rescaled
    and rounded into the output, which the interpreter gets right (the math is fp16, as for fp16 queries)."""
    device, dtype = target
    r = random.Random(3500 + seed)
    c, opts = _kvcache_case(r, device)
    b = len(c["seqlens"])
    descales = {n: torch.rand(b, c["hk"], device=device) + 0.1 for n in ("k_descale", "v_descale") if r.random() < 0.8}
    q_dtype = dtype if device == "cuda" else r.choice([torch.float16, torch.bfloat16])
    _show(q_dtype=q_dtype)
    _run_kvcache(c, opts, torch.float8_e4m3fn, q_dtype, device, seed, descales)


@pytest.mark.parametrize("target,seed", _seeds(GPU_CASES // 2, CPU_CASES // 2))
def test_fuzz_kvcache_new_tokens(target, seed):
    """attention_with_kvcache's FlashAttention options on `_kvcache_case`'s shapes and masks: k / v appended in place
    (contiguous or paged caches, sometimes FP8), rotary (the whole head or its first half, either pairing, tables in
    fp32 or q's dtype; sometimes on q alone), and on contiguous caches cache_leftpad and cache_batch_idx. The oracle
    attends to each sequence's keys from its start, its new (rotated) keys after its old ones; afterwards the caches
    hold the new rows where they belong (rotated keys within a rounding of the oracle's) and every other byte as
    before (NaN included)."""
    device, dtype = target
    r = random.Random(7000 + seed)
    c, opts = _kvcache_case(r, device)
    b, hk, d, dv, page, cap = len(c["seqlens"]), c["hk"], c["d"], c["dv"], c["page"], c["capacity"]
    sq = min(c["sq"], cap)
    n_new = sq if r.random() < 0.8 else 0
    fp8 = n_new > 0 and r.random() < 0.2
    rotary = not fp8 and r.random() < 0.6
    leftpad, batch_idx = page is None and r.random() < 0.4, page is None and r.random() < 0.3
    left, right = opts.get("window", (-1, -1))               # q's rotary positions step only under a mask
    masked = opts.get("causal", False) or isinstance(left, torch.Tensor) or (left, right) != (-1, -1)
    _show(sq=sq, n_new=n_new, fp8=fp8, rotary=rotary, leftpad=leftpad, batch_idx=batch_idx, masked=masked)
    kv_dtype = torch.float8_e4m3fn if fp8 else dtype
    lens = [min(n, cap - n_new) for n in c["seqlens"]]                  # room for the new keys
    k_cache, v_cache, table, k, v = _cache(lens, cap, hk, d, dv, kv_dtype, device, page, seed=seed)
    k, v = k.clone(), v.clone()                    # on the CPU a contiguous cache is the logical tensor itself
    k_cache, v_cache = _laid_out_by_seed(k_cache, v_cache, page, d, dv, seed)
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, sq, c["hq"], d, generator=g).to(dtype)
    k_new, v_new = (torch.randn(b, n_new, hk, dim, generator=g).to(kv_dtype) for dim in (d, dv))
    new, q_seen, k_seen = {}, q, k_new
    if rotary:
        half = d // (2 * r.choice([1, 2]))
        # Positions reach lens[b] + sq - 1 (q's, under a mask), up to cap + sq - 1 when nothing is appended.
        angles = torch.arange(cap + sq)[:, None] * r.choice([0.37, 1.9]) / (1 + torch.arange(half))
        cos, sin = (t.to(r.choice([torch.float32, dtype])) for t in (angles.cos(), angles.sin()))
        interleaved = r.random() < 0.5
        new.update(rotary_cos=cos, rotary_sin=sin, rotary_interleaved=interleaved)
        start = torch.tensor(lens)[:, None]
        q_seen = rotary_ref(q, cos.float(), sin.float(), start + torch.arange(sq) * masked,
                            interleaved=interleaved).to(dtype)
        k_seen = rotary_ref(k_new, cos.float(), sin.float(), start + torch.arange(n_new),
                            interleaved=interleaved).to(dtype)
    if n_new:
        new.update(k=k_new, v=v_new)
    starts = [0] * b
    if leftpad:
        starts = [r.choice([0, r.randint(0, n + n_new), n + n_new + r.randint(0, 3)]) for n in lens]
        for i, s in enumerate(starts):
            k_cache[i, :s], v_cache[i, :s] = math.nan, math.nan          # before its start: never read
    rows = None
    if batch_idx:
        rows = torch.randperm(b + 2, generator=g)[:b]
        k_cache, v_cache = (t.to(device) for t in _in_rows(k_cache, v_cache, rows, b + 2))
    want_k, want_v = _appended(k_cache, v_cache, k, v, lens, k_seen, v_new, table, rows)
    counts = [max(n + n_new - s, 0) for n, s in zip(lens, starts)]
    seen_k, seen_v = _from_starts(k, v, starts, counts)
    descales = _descales(b, hk, device) if fp8 and r.random() < 0.7 else {}
    lens_t = torch.tensor(lens, dtype=torch.int32, device=device)
    to = lambda t: t.to(device) if isinstance(t, torch.Tensor) else t      # noqa: E731
    got, lse = fmha.attention_with_kvcache(
        q.to(device), k_cache, v_cache, lens_t, block_table=table, num_splits=c["splits"], return_lse=True,
        cache_leftpad=torch.tensor(starts, dtype=torch.int32, device=device) if leftpad else None,
        cache_batch_idx=rows.to(torch.int32).to(device) if batch_idx else None,
        **{n: to(t) for n, t in new.items()}, **opts, **descales)
    assert lens_t.tolist() == lens, "cache_seqlens: changed"
    if rotary:
        # The kernel rotates the new keys in fp32 (contracted multiply-adds on a GPU) before rounding them to the
        # cache's dtype, the oracle with torch's complex product: a rounding apart (1 in 512 GPU cases, seed 382).
        # Every other byte of the caches is checked exactly.
        for i, j, at in _slots(lens, n_new, k_cache.shape[1], table, rows):
            written = k_cache[at].cpu()
            torch.testing.assert_close(written.float(), k_seen[i, j].float(), rtol=torch.finfo(dtype).eps, atol=1e-5)
            want_k[at] = written
    _assert_appended(k_cache, v_cache, want_k, want_v)
    assert_matches(got, lse, _oracle(q_seen.to(device), seen_k, seen_v, counts, **opts, **descales), dtype)


@pytest.mark.parametrize("target,seed", _seeds(GPU_CASES // 2, CPU_CASES))
def test_fuzz_mla(target, seed):
    device, dtype = target
    r = random.Random(4000 + seed)
    h_q = r.choice([1, 4, 8, 16, 32, 64, 128] if device == "cuda" else [16, 32])
    s_q = r.randint(1, 4)
    page = r.choice([64, 64, 16, 32, 48, 128])
    b = r.randint(1, 40 if device == "cuda" else 3)
    top = 6000 if device == "cuda" else 200
    seqlens = [r.choice([0, r.randint(1, 64), r.randint(0, top)]) for _ in range(b)]
    causal = s_q > 1 and r.random() < 0.7
    _show(h_q=h_q, s_q=s_q, page=page, seqlens=seqlens, causal=causal)
    cache, table = _paged_cache(seqlens, page, 1, D_QK, dtype, device, seed)
    lens = torch.tensor(seqlens, dtype=torch.int32, device=device)
    q = torch.randn(b, s_q, h_q, D_QK, generator=torch.Generator().manual_seed(seed)).to(dtype).to(device)
    meta, splits = flash_mla.get_mla_metadata(lens, s_q * h_q, 1)
    out, lse = flash_mla.flash_mla_with_kvcache(q, cache, table, lens, D_V, meta, splits, causal=causal)
    _check(out, lse, *mla_decode_ref(q, cache, table, lens, D_V, causal=causal), dtype)


@pytest.mark.parametrize("target,seed", _seeds(GPU_CASES // 2, CPU_CASES // 2))
def test_fuzz_mla_decode(target, seed):
    """`mla_decode` (vLLM's form: latent and rope parts in their own tensors) on the shapes the API takes beyond
    DeepSeek's: a latent width of 2 x a power of two (32-512), a rope part of 0 or a power of two (16-64), several KV
    heads, 3-D (s_q = 1) or 4-D tensors, caches as two allocations or two views of one, a plan passed in or made
    here, causal, a scale, sinks. NaN past every length and in unused pages (`test_mla._paged_cache`)."""
    device, dtype = target
    gpu = device == "cuda"
    r = random.Random(8000 + seed)
    d_lat, d_rope = r.choice([(512, 64), (512, 64), (512, 0), (256, 64), (128, 64), (128, 32), (64, 16), (32, 0)])
    h_k = r.choice([1, 1, 2, 4])
    h_q = h_k * r.choice([1, 4, 16, 32] if gpu else [1, 4, 8])
    squeeze = r.random() < 0.3
    s_q = 1 if squeeze else r.randint(1, 4)
    page = r.choice([64, 16, 32, 128])
    b = r.randint(1, 24 if gpu else 3)
    top = 5000 if gpu else 150
    seqlens = [r.choice([0, r.randint(1, 64), r.randint(0, top)]) for _ in range(b)]
    causal = s_q > 1 and r.random() < 0.6
    one_tensor, planned = r.random() < 0.5, r.random() < 0.5
    scale = r.choice([None, None, 0.05])
    sink = (torch.randn(h_q) * 2).to(device) if r.random() < 0.3 else None
    _show(d_lat=d_lat, d_rope=d_rope, h_k=h_k, h_q=h_q, s_q=s_q, squeeze=squeeze, page=page, seqlens=seqlens,
          causal=causal, one_tensor=one_tensor, planned=planned, scale=scale, sink=sink is not None)
    cache, table = _paged_cache(seqlens, page, h_k, d_lat + d_rope, dtype, device, seed)
    lens = torch.tensor(seqlens, dtype=torch.int32, device=device)
    q = torch.randn(b, s_q, h_q, d_lat + d_rope, generator=torch.Generator().manual_seed(seed)).to(dtype).to(device)
    kv_lat, k_rope = cache[..., :d_lat], cache[..., d_lat:]
    if not one_tensor:
        kv_lat, k_rope = kv_lat.contiguous(), k_rope.contiguous()
    q_lat, q_rope = q[..., :d_lat].contiguous(), q[..., d_lat:].contiguous()
    if squeeze:
        q_lat, q_rope = q_lat[:, 0], q_rope[:, 0]
        if h_k == 1:
            kv_lat, k_rope = kv_lat[:, :, 0], k_rope[:, :, 0]
    if not d_rope:
        q_rope = k_rope = None
    plan = {}
    if planned:
        plan = dict(zip(("tile_scheduler_metadata", "num_splits"),
                        flash_mla.get_mla_metadata(lens, s_q * h_q // h_k, h_k)))
    out, lse = flash_mla.mla_decode(q_lat, q_rope, kv_lat, k_rope, table, lens, causal=causal, softmax_scale=scale,
                                    attn_sink=sink, **plan)
    ref, ref_lse = mla_decode_ref(q, cache, table, lens, d_lat, causal=causal, softmax_scale=scale, attn_sink=sink)
    if squeeze:
        ref, ref_lse = ref[:, 0], ref_lse[..., 0]
    _check(out, lse, ref, ref_lse, dtype)


@pytest.mark.parametrize("target,seed", _seeds(GPU_CASES // 2, CPU_CASES))
def test_fuzz_sparse_decode(target, seed):
    """Token-sparse decode with a random cache type (bf16 576 / 512, V3.2 or V4 FP8), page sizes, topk, -1
    entries, trimmed lengths, an optional second source and sink: the oracle attends to the union of both
    sources' selected tokens, dequantised as the kernels compute with them (`test_mla._dequantized`)."""
    device, dtype = target
    r = random.Random(5000 + seed)
    layout = r.choice([None, None, "v32", "model1"])
    d = LAYOUTS[layout][0] if layout else r.choice([D_QK, 512])
    h_q = (r.choice([8, 64, 128]) if d == 512 else r.choice([2, 8, 16, 32, 64, 128])) if device == "cuda" else 16
    s_q = r.randint(1, 3)
    b = r.randint(1, 20 if device == "cuda" else 3)
    topk = r.choice([64, 128, 200, 512, 2048]) if device == "cuda" else r.choice([40, 64])
    page = r.choice([64, 256, 61, 2])
    extra = r.random() < 0.5
    extra_topk, extra_page = r.choice([64, 128, 512]), r.choice([64, 16, 33])
    sink = (torch.randn(h_q) * 2).to(device) if r.random() < 0.5 else None
    _show(layout=layout, d=d, h_q=h_q, s_q=s_q, b=b, topk=topk, page=page, extra=extra and (extra_topk, extra_page),
          sink=sink is not None)
    g = torch.Generator().manual_seed(seed)
    tokens = 4000 if device == "cuda" else 300
    sources = [_sparse_source(b, s_q, topk, tokens, page, d, dtype, device, g)]
    if extra:
        sources.append(_sparse_source(b, s_q, extra_topk, tokens // 2, extra_page, d, dtype, device, g))
    caches, refs = [], []
    for cache, _, _ in sources:
        if layout:
            cache = flash_mla.quantize_kv_cache(torch.nan_to_num(cache.bfloat16(), nan=1e4), layout)
            refs.append(_dequantized(cache, layout, dtype))
        else:
            refs.append(cache)
        caches.append(cache)
    q = torch.randn(b, s_q, h_q, d, generator=g).to(dtype).to(device)
    lens = torch.zeros(b, dtype=torch.int32, device=device)
    meta, splits = flash_mla.get_mla_metadata(lens, s_q * h_q, 1, num_heads_q=h_q, topk=topk,
                                              is_fp8_kvcache=layout is not None)
    more = {}
    if extra:
        more = dict(extra_k_cache=caches[1], extra_indices_in_kvcache=sources[1][1], extra_topk_length=sources[1][2])
    out, lse = flash_mla.flash_mla_with_kvcache(q, caches[0], None, lens, D_V, meta, splits, indices=sources[0][1],
                                                topk_length=sources[0][2], attn_sink=sink,
                                                is_fp8_kvcache=layout is not None, **more)
    both, joined = _union_of_sources(refs, [(indices, length) for _, indices, length in sources])
    _check(out, lse, *mla_sparse_decode_ref(q, both, joined, D_V, attn_sink=sink), dtype)


@pytest.mark.parametrize("target,seed", _seeds(GPU_CASES // 2, CPU_CASES // 2))
def test_fuzz_sparse_prefill(target, seed):
    """flash_mla_sparse_fwd on random cases: token counts, heads (mostly one KV head, the Gluon kernel's; two run
    the portable one), 576 or V4's 512 columns, any topk, invalid (-1 and past the end) and repeated indices,
    trimmed lengths, a sink with an infinite entry, a scale; NaN in every kv row no counted index names."""
    device, dtype = target
    gpu = device == "cuda"
    r = random.Random(6000 + seed)
    d = r.choice([D_QK, D_QK, 512])
    h_kv = r.choice([1, 1, 1, 2])
    h_q = r.choice(([16, 32, 64, 128] if d == D_QK else [64, 128]) if gpu else [16])
    s_q = r.choice([1, r.randint(1, 64), r.randint(64, 700)] if gpu else [1, r.randint(1, 5)])
    s_kv = r.choice([r.randint(1, 200), r.randint(1, 20000)] if gpu else [r.randint(1, 40), r.randint(1, 300)])
    topk = r.choice([64, 128, 512, 2048, r.randint(1, 300)] if gpu else [16, 40, 64])
    invalid, past, repeated = r.choice([0.0, 0.1, 0.6]), r.choice([0.0, 0.1]), r.random() < 0.3
    trimmed, with_sink = r.random() < 0.5, r.random() < 0.4
    scale = r.choice([None, None, 0.05, 0.1])
    _show(d=d, h_q=h_q, h_kv=h_kv, s_q=s_q, s_kv=s_kv, topk=topk, invalid=invalid, past=past, repeated=repeated,
          trimmed=trimmed, sink=with_sink, scale=scale)
    g = torch.Generator().manual_seed(seed)
    # Repeated: drawn from a few rows only, so most rows hold the same index many times (each one counts).
    indices = torch.randint(0, min(s_kv, 6) if repeated else s_kv, (s_q, h_kv, topk), generator=g, dtype=torch.int32)
    indices[torch.rand(s_q, h_kv, topk, generator=g) < invalid] = -1
    indices[torch.rand(s_q, h_kv, topk, generator=g) < past] = s_kv + r.randint(0, 100)
    topk_length = torch.randint(-2, topk + 4, (s_q,), generator=g, dtype=torch.int32) if trimmed else None
    kv = torch.randn(s_kv, h_kv, d, generator=g).to(dtype)
    _poison_unread_rows(kv, indices, topk_length)
    q = torch.randn(s_q, h_q, d, generator=g).to(dtype).to(device)
    sink = None
    if with_sink:
        sink = torch.randn(h_q, generator=g) * 2
        sink[0] = r.choice([math.inf, -math.inf, 0.0])
        sink = sink.to(device)
    kv, indices = kv.to(device), indices.to(device)
    topk_length = None if topk_length is None else topk_length.to(device)
    got = flash_mla.flash_mla_sparse_fwd(q, kv, indices, scale, d_v=D_V, attn_sink=sink, topk_length=topk_length)
    _check_sparse_prefill(got, mla_sparse_prefill_ref(q, kv, indices, D_V, sm_scale=scale, attn_sink=sink,
                                                     topk_length=topk_length), dtype)
