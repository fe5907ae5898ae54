"""attention_with_kvcache: contiguous and paged caches (shuffled pages, NaN everywhere the kernel must not
read), split and unsplit paths, against the fp32 oracle run on each sequence's valid keys."""

import inspect
import itertools
import math

import pytest
import torch

import fmha
from fmha.reference import attention_ref, rotary_ref
from fmha.bench import paged_copy
from fmha.schedule import plan_num_splits
from utils import TARGETS, assert_matches, far_pages, garbled_table, poison, spy

NAN = float("nan")


def _cache(seqlens, capacity, hk, d, dv, dtype, device, page_size=None, seed=0):
    """Logical K/V (b, capacity, hk, d) with NaN past each length, and the cache the kernel sees: the same
    tensors, or pages scattered in shuffled order among NaN-filled unused pages."""
    g = torch.Generator().manual_seed(seed)
    b = len(seqlens)
    k = torch.full((b, capacity, hk, d), NAN, dtype=dtype)
    v = torch.full((b, capacity, hk, dv), NAN, dtype=dtype)
    for i, n in enumerate(seqlens):
        k[i, :n] = torch.randn(n, hk, d, generator=g).to(dtype)
        v[i, :n] = torch.randn(n, hk, dv, generator=g).to(dtype)
    if page_size is None:
        return k.to(device), v.to(device), None, k, v
    pages_per_seq = capacity // page_size
    num_pages = b * pages_per_seq + 5                       # 5 pages nobody uses, NaN-filled
    order = torch.randperm(num_pages, generator=g)[: b * pages_per_seq].view(b, pages_per_seq)
    k_cache = torch.full((num_pages, page_size, hk, d), NAN, dtype=dtype)
    v_cache = torch.full((num_pages, page_size, hk, dv), NAN, dtype=dtype)
    for i in range(b):
        for p in range(pages_per_seq):
            k_cache[order[i, p]] = k[i, p * page_size:(p + 1) * page_size]
            v_cache[order[i, p]] = v[i, p * page_size:(p + 1) * page_size]
    return k_cache.to(device), v_cache.to(device), order.to(torch.int32).to(device), k, v


def _descales(b, hk, device):
    """Per-(batch, KV head) k and v descales of an FP8 cache, in [0.2, 1.2)."""
    return dict(k_descale=torch.rand(b, hk, device=device) + 0.2, v_descale=torch.rand(b, hk, device=device) + 0.2)


def _appended(k_cache, v_cache, k, v, lens, k_new, v_new, table=None, rows=None):
    """An append of k_new / v_new `(b, n_new, ...)` at cache_seqlens `lens`: the logical k / v (CPU) take the new
    rows in place, and the caches as the append must leave them are returned (on the CPU), key j of sequence b at
    position lens[b] + j of its pages (`table`), of cache row rows[b] (cache_batch_idx), or of row b."""
    want_k, want_v = k_cache.cpu().clone(), v_cache.cpu().clone()
    n_new = k_new.shape[1]
    for i, n in enumerate(lens):
        k[i, n:n + n_new], v[i, n:n + n_new] = k_new[i], v_new[i]
    for i, j, at in _slots(lens, n_new, k_cache.shape[1], table, rows):
        want_k[at], want_v[at] = k_new[i, j], v_new[i, j]
    return want_k, want_v


def _slots(lens, n_new, page, table=None, rows=None):
    """(i, j, index into the cache) of new key j of sequence i, an append at cache_seqlens `lens` (as `_appended`)."""
    for i, n in enumerate(lens):
        row = i if rows is None else int(rows[i])
        for j in range(n_new):
            p = n + j
            yield i, j, ((int(table[i, p // page]), p % page) if table is not None else (row, p))


def _assert_appended(k_cache, v_cache, want_k, want_v):
    """The caches hold `_appended`'s bytes: the new rows, and every other byte (NaN included) as before."""
    for name, cache, want in (("k_cache", k_cache, want_k), ("v_cache", v_cache, want_v)):
        assert torch.equal(cache.cpu().view(torch.uint8), want.view(torch.uint8)), f"{name}: not as appended"


def _from_starts(k, v, starts, counts):
    """Each sequence's `counts[b]` keys and values from row `starts[b]` on (cache_leftpad), NaN after them."""
    seen_k, seen_v = torch.full_like(k, NAN), torch.full_like(v, NAN)
    for i, (s, n) in enumerate(zip(starts, counts)):
        seen_k[i, :n], seen_v[i, :n] = k[i, s:s + n], v[i, s:s + n]
    return seen_k, seen_v


def _in_rows(k_cache, v_cache, rows, total):
    """Contiguous caches (on the CPU) placed at rows `rows` of caches of `total` rows, NaN in the others (the caches
    cache_batch_idx names rows of)."""
    big = [torch.full((total,) + tuple(t.shape[1:]), NAN).to(t.dtype) for t in (k_cache, v_cache)]
    big[0][rows], big[1][rows] = k_cache.cpu(), v_cache.cpu()
    return big


def _oracle(q, k, v, seqlens, **options):
    options = {n: (o.cpu() if isinstance(o, torch.Tensor) else o) for n, o in options.items()}
    outs, lses = [], []
    for i, n in enumerate(seqlens):
        # FP8 descales are (batch, heads_k): sequence i's row; a (batch,) tensor of left window bounds: its own.
        own = {name: o[i:i + 1] if name.endswith("_descale") else o for name, o in options.items()}
        if isinstance(own.get("window", (0,))[0], torch.Tensor):
            own["window"] = (max(int(own["window"][0][i]), -1), own["window"][1])
        o, lse = attention_ref(q[i:i + 1].cpu(), k[i:i + 1, :n].cpu(), v[i:i + 1, :n].cpu(), **own)
        outs.append(o)
        lses.append(lse)
    return torch.cat(outs).to(q.device), torch.cat(lses).to(q.device)


def _case(target):
    if target[0] == "cpu":
        return dict(seqlens=[70, 0, 33, 128], capacity=128, hq=4, hk=2, d=64)
    return dict(seqlens=[3000, 0, 17, 4096, 1500, 64], capacity=4096, hq=32, hk=8, d=128)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("page_size", [None, 16, 32, 64], ids=lambda p: f"page{p}" if p else "contiguous")
@pytest.mark.parametrize("seqlen_q,num_splits", [(1, 1), (1, 3), (1, 0), (4, 2), (9, 1)])
def test_kvcache(target, page_size, seqlen_q, num_splits):
    device, dtype = target
    c = _case(target)
    torch.manual_seed(seqlen_q)
    k_cache, v_cache, table, k, v = _cache(c["seqlens"], c["capacity"], c["hk"], c["d"], c["d"], dtype, device,
                                           page_size, seed=seqlen_q)
    q = torch.randn(len(c["seqlens"]), seqlen_q, c["hq"], c["d"], device=device, dtype=dtype)
    seqlens = torch.tensor(c["seqlens"], dtype=torch.int32, device=device)
    if table is not None:          # past each sequence's pages, no page: as engines pad the table
        table = garbled_table(table, c["seqlens"], page_size)
    options = dict(causal=seqlen_q > 1)
    got, lse = fmha.attention_with_kvcache(q, k_cache, v_cache, seqlens, block_table=table, num_splits=num_splits,
                                           return_lse=True, **options)
    assert_matches(got, lse, _oracle(q, k, v, c["seqlens"], **options), dtype)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("page_size", [None, 16], ids=lambda p: f"page{p}" if p else "contiguous")
def test_kvcache_launch_plan_reuse(target, page_size, monkeypatch):
    """The portable kernel's launch plan (`forward._PLANS`) serves later calls of its key with their own tensors:
    three calls of one key on new caches, queries, lengths and tables (a decode loop's), each against the oracle,
    one plan made; a patched tile table makes a new key."""
    from fmha.kernels import forward
    device, dtype = target
    c = _case(target)
    plans = []
    real = forward._portable_plan
    monkeypatch.setattr(forward, "_portable_plan", lambda *a, **kw: plans.append(1) or real(*a, **kw))
    for seed in range(3):
        torch.manual_seed(seed)
        lens = [max(1, n - 7 * seed) for n in c["seqlens"]]
        k_cache, v_cache, table, k, v = _cache(lens, c["capacity"], c["hk"], c["d"], c["d"], dtype, device,
                                               page_size, seed=seed)
        q = torch.randn(len(lens), 1, c["hq"], c["d"], device=device, dtype=dtype)
        got, lse = fmha.attention_with_kvcache(q, k_cache, v_cache, torch.tensor(lens, dtype=torch.int32,
                                               device=device), block_table=table, num_splits=2, return_lse=True)
        assert_matches(got, lse, _oracle(q, k, v, lens), dtype)
    assert len(plans) == 1
    tiles = (16, 64, 4, 2)                     # interpreter and GPU tables alike: a new key, a new plan
    monkeypatch.setattr(forward, "_INTERPRET_TILES", tiles)
    for table_ in forward._GPU_DECODE_TABLES:
        monkeypatch.setitem(table_, 128, tiles)
    got, lse = fmha.attention_with_kvcache(q, k_cache, v_cache, torch.tensor(lens, dtype=torch.int32, device=device),
                                           block_table=table, num_splits=2, return_lse=True)
    assert_matches(got, lse, _oracle(q, k, v, lens), dtype)
    assert len(plans) == 2


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("num_splits", [1, 4])
def test_kvcache_options(target, num_splits):
    """Window, softcap, ALiBi and sinks through the split merge (the sink is applied after merging)."""
    device, dtype = target
    c = _case(target)
    k_cache, v_cache, table, k, v = _cache(c["seqlens"], c["capacity"], c["hk"], c["d"], c["d"], dtype, device, 16)
    q = torch.randn(len(c["seqlens"]), 3, c["hq"], c["d"], device=device, dtype=dtype)
    seqlens = torch.tensor(c["seqlens"], dtype=torch.int32, device=device)
    sinks = torch.randn(c["hq"], device=device)
    sinks[:2] = torch.tensor([math.inf, -math.inf])          # +inf silences a head, -inf has no effect
    options = dict(window=(40, 0), softcap=10.0, alibi_slopes=torch.rand(c["hq"], device=device) * 0.1,
                   sinks=sinks)
    got, lse = fmha.attention_with_kvcache(q, k_cache, v_cache, seqlens, block_table=table, num_splits=num_splits,
                                           return_lse=True, **options)
    assert_matches(got, lse, _oracle(q, k, v, c["seqlens"], **options), dtype)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("page_size", [1, 8, 24])
@pytest.mark.parametrize("num_splits,seqlen_q", [(1, 2), (0, 2), (1, 96)])
def test_kvcache_small_pages(target, page_size, num_splits, seqlen_q, monkeypatch):
    """Pages that are not multiples of 16 (SGLang's page of one token; power-of-two pages inside a key tile; a page
    size that divides nothing), shuffled, split or not; and a chunk of 96 queries unsplit, which on a Hopper GPU
    the dispatch keeps off the Gluon kernel for these pages (`forward._gluon_takes`): a launch there fails it."""
    device, dtype = target
    if device == "cpu" and seqlen_q > 2:
        pytest.skip("the chunk case checks a GPU dispatch; the CPU runs the same kernel with 2 queries")
    if device == "cuda":
        from fmha.kernels import forward_sm90

        def refuse(*args, **kwargs):
            raise AssertionError("a page of other than a multiple of 16 keys reached the Gluon kernel")
        monkeypatch.setattr(forward_sm90, "attention_forward_sm90", refuse)
    c = _case(target)
    capacity = min(c["capacity"], 256 * page_size) // page_size * page_size     # <= 256 pages a sequence
    seqlens = [min(n, capacity) for n in c["seqlens"]]
    k_cache, v_cache, table, k, v = _cache(seqlens, capacity, c["hk"], c["d"], c["d"], dtype, device, page_size,
                                           seed=page_size)
    q = torch.randn(len(seqlens), seqlen_q, c["hq"], c["d"], device=device, dtype=dtype)
    lens = torch.tensor(seqlens, dtype=torch.int32, device=device)
    got, lse = fmha.attention_with_kvcache(q, k_cache, v_cache, lens, block_table=table, num_splits=num_splits,
                                           causal=True, return_lse=True)
    assert_matches(got, lse, _oracle(q, k, v, seqlens, causal=True), dtype)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("page_size", [None, 16], ids=lambda p: f"page{p}" if p else "contiguous")
@pytest.mark.parametrize("seqlen_q,num_splits", [(1, 0), (1, 3), (4, 1), (6, 0), (8, 2)])
def test_kvcache_fp8(target, page_size, seqlen_q, num_splits):
    """An FP8 KV cache (float8_e4m3fn, NaN past every length and in unused pages) beside fp16/bf16 queries, with
    per-(batch, KV head) k and v descales, split or not: the attention of the descaled cache. On the GPU 4 or 16
    packed rows take the 16-row tables, 24 and 32 rows the 32-row ones."""
    device, dtype = target
    c = _case(target)
    k_cache, v_cache, table, k, v = _cache(c["seqlens"], c["capacity"], c["hk"], c["d"], c["d"],
                                           torch.float8_e4m3fn, device, page_size, seed=40 + seqlen_q)
    b = len(c["seqlens"])
    q = torch.randn(b, seqlen_q, c["hq"], c["d"], device=device, dtype=dtype)
    seqlens = torch.tensor(c["seqlens"], dtype=torch.int32, device=device)
    descales = _descales(b, c["hk"], device)
    options = dict(causal=seqlen_q > 1)
    got, lse = fmha.attention_with_kvcache(q, k_cache, v_cache, seqlens, block_table=table, num_splits=num_splits,
                                           return_lse=True, **options, **descales)
    oracle = _oracle(q, k, v, c["seqlens"], **options, **descales)
    assert got.dtype == dtype
    assert_matches(got, lse, oracle, dtype)


def _engine_layout(k_cache, v_cache, layout):
    """The same paged caches as views of one KV tensor, as engines allocate them: "kv_pages" FlashInfer's NHD
    `(num_pages, 2, page, heads_k, d)` (K and V of a page side by side), "hnd" its HND `(num_pages, 2, heads_k,
    page, d)` (a head's keys of a page together: head stride page * d, key stride d); each cache's values unchanged."""
    both = torch.stack([k_cache, v_cache], 1)
    if layout == "hnd":
        both = both.transpose(2, 3).contiguous().transpose(2, 3)
    return both[:, 0], both[:, 1]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("layout", ["kv_pages", "hnd"])
@pytest.mark.parametrize("page_size", [16, 64])
@pytest.mark.parametrize("fp8", [False, True], ids=["cache_dtype", "fp8"])
def test_kvcache_cache_layouts(target, layout, page_size, fp8, monkeypatch):
    """Paged caches laid out as engines hold them (`_engine_layout`: K and V pages interleaved in one tensor, or the
    heads-major HND page), in q's dtype or FP8 with descales: a decode (one query token) and a causal chunk (64
    packed query rows a KV head on the GPU, 8 on the CPU), split as planned and in 3: the oracle's answer each time.
    On the GPU an FP8 chunk goes to the Gluon FP8 decode (`fp8_decode_sm90`), whose TMA views step pages and heads
    by the caches' own strides."""
    from fmha.kernels import fp8_decode_sm90
    calls = spy(monkeypatch, fp8_decode_sm90, "fp8_decode_forward_sm90")
    device, dtype = target
    c = _case(target)
    b = len(c["seqlens"])
    k_cache, v_cache, table, k, v = _cache(c["seqlens"], c["capacity"], c["hk"], c["d"], c["d"],
                                           torch.float8_e4m3fn if fp8 else dtype, device, page_size, seed=page_size)
    k_cache, v_cache = _engine_layout(k_cache, v_cache, layout)
    seqlens = torch.tensor(c["seqlens"], dtype=torch.int32, device=device)
    options = _descales(b, c["hk"], device) if fp8 else {}
    group = c["hq"] // c["hk"]
    for seqlen_q, num_splits in itertools.product((1, (64 if device == "cuda" else 8) // group), (0, 3)):
        q = torch.randn(b, seqlen_q, c["hq"], c["d"], device=device, dtype=dtype)
        got, lse = fmha.attention_with_kvcache(q, k_cache, v_cache, seqlens, block_table=table, causal=True,
                                               num_splits=num_splits, return_lse=True, **options)
        assert_matches(got, lse, _oracle(q, k, v, c["seqlens"], causal=True, **options), dtype)
    assert len(calls) == (2 if fp8 and device == "cuda" else 0)        # the chunk, split as planned and in 3


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("page_size", [None, 64], ids=lambda p: f"page{p}" if p else "contiguous")
@pytest.mark.parametrize("d", [64, 256])
@pytest.mark.parametrize("fp8", [False, True], ids=["cache_dtype", "fp8"])
def test_kvcache_head_dims(target, page_size, d, fp8):
    """A KV cache (q's dtype or FP8) at head dims 64 and 256, decode (4 packed rows), 4 and 8 causal queries (16, 32
    rows): on the GPU the 16-row tables' entries for those head dims and, at 32 rows, the 17-32-row tables' (FP8;
    a 16-bit cache's at d = 64, the 64-row forms at d = 256), split by the planner."""
    device, dtype = target
    c = _case(target)
    k_cache, v_cache, table, k, v = _cache(c["seqlens"], c["capacity"], c["hk"], d, d,
                                           torch.float8_e4m3fn if fp8 else dtype, device, page_size, seed=d)
    b = len(c["seqlens"])
    seqlens = torch.tensor(c["seqlens"], dtype=torch.int32, device=device)
    descales = _descales(b, c["hk"], device) if fp8 else {}
    for seqlen_q in (1, 4, 8):
        q = torch.randn(b, seqlen_q, c["hq"], d, device=device, dtype=dtype)
        got, lse = fmha.attention_with_kvcache(q, k_cache, v_cache, seqlens, block_table=table, return_lse=True,
                                               causal=True, **descales)
        assert_matches(got, lse, _oracle(q, k, v, c["seqlens"], causal=True, **descales), dtype)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("page_size", [None, 16, 64], ids=lambda p: f"page{p}" if p else "contiguous")
@pytest.mark.parametrize("d", [64, 128])
def test_kvcache_head_pairs(target, page_size, d, monkeypatch):
    """`forward.HEAD_PAIRS` forced on (by default `_pairs_pay`'s calls only): adjacent KV heads run as one head of
    twice the width, q's rows zero outside their own head's half and only that half of the output stored. GQA and
    MHA, one and two causal queries, split and not, with window, softcap, ALiBi and sinks: the oracle's answer, and
    the pairs taken."""
    from fmha.kernels import forward, launch
    monkeypatch.setattr(forward, "HEAD_PAIRS", True)
    monkeypatch.setattr(launch, "RECORD", [])
    device, dtype = target
    c = _case(target)
    b = len(c["seqlens"])
    seqlens = torch.tensor(c["seqlens"], dtype=torch.int32, device=device)
    for hq, seqlen_q, num_splits, opts in ((c["hq"], 1, 0, False), (c["hk"], 2, 3, True), (c["hq"], 2, 1, True)):
        k_cache, v_cache, table, k, v = _cache(c["seqlens"], c["capacity"], c["hk"], d, d, dtype, device, page_size,
                                               seed=hq + seqlen_q)
        q = torch.randn(b, seqlen_q, hq, d, device=device, dtype=dtype)
        options = dict(causal=True)
        if opts:
            sinks = torch.randn(hq, device=device)
            options.update(window=(40, 0), softcap=10.0, alibi_slopes=torch.rand(hq, device=device) * 0.1,
                           sinks=sinks)
        launch.RECORD.clear()
        got, lse = fmha.attention_with_kvcache(q, k_cache, v_cache, seqlens, block_table=table,
                                               num_splits=num_splits, return_lse=True, **options)
        assert [meta.get("PAIR") for name, _, meta in launch.RECORD if name == "attn_fwd_kernel"] == [True]
        assert_matches(got, lse, _oracle(q, k, v, c["seqlens"], **options), dtype)


@pytest.mark.cpu
def test_forward_kernel_pick():
    """`forward._forward_kernel`: 64-row tiles with a seqlen_q of 1 (16-bit or FP8 cache) launch one twin of
    `attn_fwd_kernel`, the same function jitted apart (with seqlen_q unspecialised on a GPU), made once and followed
    when `attn_fwd_kernel` is swapped for another kernel; every other launch `attn_fwd_kernel`."""
    from fmha.kernels import forward
    twin = forward._forward_kernel(64, 1)
    assert all(forward._forward_kernel(rows, n) is forward.attn_fwd_kernel
               for rows, n in ((16, 1), (32, 1), (64, 16), (64, 2), (128, 4096)))
    assert twin is not forward.attn_fwd_kernel and twin.fn is forward.attn_fwd_kernel.fn
    assert forward._forward_kernel(128, 1) is twin
    other = forward._UNSPECIALISED_Q.pop(forward.attn_fwd_kernel)
    try:
        assert forward._forward_kernel(64, 1) is not other       # a new twin when none is kept
    finally:
        forward._UNSPECIALISED_Q[forward.attn_fwd_kernel] = other


@pytest.mark.cpu
def test_register_cap_rule():
    """Which portable launches compile under a register cap (`forward._register_cap`): the GPU tables' 4-warp
    64-row forms of 64-key tiles at d = 64 (paged or not, whatever the cache's dtype: the tables key them by rows),
    at 128, and the FP8 contiguous 32-row form at d = 64 at 160 (FP8 caches only); not the 128-key 64-row form, other
    head dims' 64-row forms, the narrow forms, a short launch with further forms, nor the interpreter."""
    from fmha.kernels.forward import _register_cap, _tile_config
    rows64 = [_tile_config(64, 64, False, rows=64, paged=paged, kv_fp8=fp8) for paged in (False, True)
              for fp8 in (False, True)]
    assert {tiles[:3] for tiles in rows64} == {(64, 64, 4)}
    assert all(_register_cap(64, 64, tiles, None, False) == 128 for tiles in rows64)
    assert _register_cap(48, 64, (64, 64, 4, 7), None, False) == 128          # padded to 64; split stages
    assert _register_cap(64, 64, rows64[0], None, True) is None                 # interpreter
    assert _register_cap(64, 64, rows64[0], ((64, 64, 4, 3),), False) is None   # a short launch's further forms
    assert _register_cap(64, 64, (64, 128, 4, 3), None, False) is None
    fp8_32 = _tile_config(64, 64, False, rows=32, paged=False, kv_fp8=True)
    assert fp8_32[:3] == (32, 64, 2)
    assert _register_cap(64, 64, fp8_32, None, False, True) == 160
    assert _register_cap(64, 64, fp8_32, None, False) is None                    # a 16-bit cache on those tiles
    assert _register_cap(64, 64, fp8_32, None, True, True) is None               # interpreter
    assert all(_register_cap(64, 64, tiles, None, False, True) == 128 for tiles in rows64)
    for fp8, capped in ((False, {(64, 64, 4)}), (True, {(64, 64, 4), (32, 64, 2)})):
        for d in (16, 32, 64, 128, 256):
            for rows in (16, 32, 64, None):
                for paged in (False, True):
                    tiles = _tile_config(d, d, False, rows=rows, paged=paged, kv_fp8=fp8)
                    if d != 64 or tiles[:3] not in capped:
                        assert _register_cap(d, d, tiles, None, False, fp8) is None, (d, rows, paged, fp8, tiles)


def _call_compiled(seqlens, seqlen_q, heads_q, kv_dtype, page_size, kernel, seed, num_splits=1, causal=False):
    """One `attention_with_kvcache` call at d = 64 over 2 KV heads (NaN past each length, descales for an FP8
    cache), checked against the oracle; returns this call's compiles of `kernel` as (binary, meta) pairs."""
    from fmha.kernels import launch
    fp8 = kv_dtype == torch.float8_e4m3fn
    k_cache, v_cache, table, k, v = _cache(seqlens, 4096, 2, 64, 64, kv_dtype, "cuda", page_size, seed=seed)
    q = torch.randn(len(seqlens), seqlen_q, heads_q, 64, device="cuda", dtype=torch.bfloat16)
    lens = torch.tensor(seqlens, dtype=torch.int32, device="cuda")
    options = dict(causal=causal, **(_descales(len(seqlens), 2, "cuda") if fp8 else {}))
    launch._COMPILED.clear()          # only this call's compiles (a cache: later launches compile again)
    got, lse = fmha.attention_with_kvcache(q, k_cache, v_cache, lens, block_table=table, num_splits=num_splits,
                                           return_lse=True, **options)
    assert_matches(got, lse, _oracle(q, k, v, seqlens, **options), torch.bfloat16)
    return [(binary, dict(items)) for (fn, _, _, items), (binary, _) in launch._COMPILED.items() if fn is kernel]


@pytest.mark.gpu
@pytest.mark.parametrize("page_size,seqlen_q,fp8", [(None, 1, False), (64, 1, False), (None, 1, True), (64, 1, True),
                                                    (16, 16, False), (None, 16, True)], ids=str)
def test_kvcache_64_rows_d64(page_size, seqlen_q, fp8, monkeypatch):
    """64 packed query rows at d = 64 (one token of 64 heads a KV head, or 16 causal tokens of 4: the 64-row decode
    forms), bf16 or FP8, unsplit: the oracle's answer, compiled to at most 128 registers a thread, four programs an
    SM: under the `forward._GPU_MAXNREG` cap (uncapped, ptxas took an FP8 cache to 140-159 and 16 causal tokens on
    16-key pages to 150: three), and for one token from the twin kernel with seqlen_q unspecialised
    (`forward._forward_kernel`; as a constant 1, seqlen_q took the paged bf16 form to 142). An FP8 cache with the
    Gluon paths off (FMHA_GLUON=0): on Hopper `fp8_decode_sm90` takes these calls, the portable form runs elsewhere."""
    from fmha.kernels import forward
    if fp8:
        monkeypatch.setenv("FMHA_GLUON", "0")
    kernel = forward._forward_kernel(64, seqlen_q)
    assert (kernel is forward.attn_fwd_kernel) == (seqlen_q > 1)
    compiled = _call_compiled([3000, 16 if seqlen_q > 1 else 0, 17, 4096], seqlen_q, 128 // seqlen_q,
                              torch.float8_e4m3fn if fp8 else torch.bfloat16, page_size, kernel, 64,
                              causal=seqlen_q > 1)
    assert [(m["BLOCK_M"], m["HEAD_DIM_QK"], m["SPLIT"], m["PAGED"], m.get("maxnreg")) for _, m in compiled] == [
        (64, 64, False, page_size is not None, 128)]
    assert compiled[0][0].n_regs <= 128, compiled[0][0].n_regs


@pytest.mark.parametrize("target", TARGETS)
def test_out_past_2g_elements(target):
    """`out` a caller's view whose query-row, head or batch stride is 2^30, in a buffer just past 2^31 elements of
    which only the view's rows are touched: each stride fits int32, its product with the index does not. The
    portable kernel's head offsets and the combine's row and head offsets were 32-bit products, which wrapped (a
    segfault in the interpreter); over an FP8 cache with 64 packed rows (on Hopper the Gluon FP8 decode,
    `fp8_decode_sm90`), the batch's offset, now 64-bit when a call reaches past 2^31 elements (`OFFSETS_64`).
    Split (3) and not. The cases run one after another, each buffer freed before the next: a 4 GiB buffer a case
    (on the GPU real memory), and the GPU suite's shards run at once."""
    device, dtype = target
    torch.manual_seed(9)
    for axis, num_splits in itertools.product((1, 2, 0), (1, 3)):
        # (b, sq, hq, hk, d): the strided axis 3 long (rows / heads) or the batch 3 (FP8, 64 packed rows a KV head)
        b, sq, hq, hk, d = {1: (1, 3, 4, 2, 64), 2: (1, 2, 3, 1, 64), 0: (3, 4, 32, 2, 128)}[axis]
        fp8, sk = axis == 0, 300
        q = torch.randn(b, sq, hq, d, dtype=dtype, device=device)
        k, v = (torch.randn(b, sk, hk, d, device=device).to(torch.float8_e4m3fn if fp8 else dtype) for _ in range(2))
        lens = torch.tensor([sk - 41, sk, 7][:b], dtype=torch.int32, device=device)
        shape = (b, sq, hq, d)
        strides = [sq * hq * d, hq * d, d, 1]
        strides[axis] = 1 << 30
        if axis:                              # the batch stride past the other axes' extents
            strides[0] = sum((n - 1) * st for n, st in zip(shape[1:], strides[1:])) + 1
        buf = torch.empty(sum((n - 1) * st for n, st in zip(shape, strides)) + 1, dtype=dtype, device=device)
        assert buf.numel() > 2 ** 31
        out = buf.as_strided(shape, strides)
        out.fill_(float("nan"))
        got, lse = fmha.attention_with_kvcache(q, k, v, lens, causal=True, num_splits=num_splits, return_lse=True,
                                               out=out)
        assert got.data_ptr() == out.data_ptr()
        assert_matches(got, lse, _oracle(q, k, v, lens.tolist(), causal=True), dtype)
        del got, out, buf
        if device == "cuda":
            torch.cuda.empty_cache()


@pytest.mark.gpu
@pytest.mark.parametrize("seqlen_q,heads_q,heads_k,num_splits", [(16384, 32, 8, 2), (8192, 128, 1, 3)], ids=str)
def test_forced_split_past_grid_axis(seqlen_q, heads_q, heads_k, num_splits):
    """A chunk of 16k queries with 32 heads (or 8k with 128, MQA) on its own keys, split by `num_splits`: the combine
    merges 512k-1M rows of one batch, more blocks of rows than a launch grid's second axis holds (65535), which
    failed the launch ("invalid argument") before the combine numbered them along the first. The oracle on the last
    and first 64 queries (bottom-right causal: the last rows see every key, the first see themselves), whose rows are
    the combine's last and first blocks of every KV head."""
    dtype, d, rows = torch.bfloat16, 64, 64
    q, k, v = (torch.randn(1, seqlen_q, h, d, device="cuda", dtype=dtype) for h in (heads_q, heads_k, heads_k))
    lens = torch.full((1,), seqlen_q, dtype=torch.int32, device="cuda")
    out, lse = fmha.attention_with_kvcache(q, k, v, lens, causal=True, num_splits=num_splits, return_lse=True)
    assert_matches(out[:, -rows:], lse[..., -rows:], attention_ref(q[:, -rows:], k, v, causal=True), dtype)
    assert_matches(out[:, :rows], lse[..., :rows], attention_ref(q[:, :rows], k[:, :rows], v[:, :rows], causal=True),
                   dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8"])
def test_most_forced_splits(fp8):
    """num_splits at its bound, 65535 (`schedule.MAX_FORCED_SPLITS`: the portable kernel's launch grid holds that
    many programs on the axis that numbers the splits), over short caches (a 64-row chunk of an FP8 cache: the
    Gluon FP8 decode): almost every split without a key, the merged answer the oracle's."""
    from fmha.schedule import MAX_FORCED_SPLITS
    torch.manual_seed(13)
    b, sq, hq, hk, d = 2, (8 if fp8 else 1), 16, 2, 64
    lens = [100, 37]
    k, v = (torch.randn(b, 128, hk, d, device="cuda").to(torch.float8_e4m3fn if fp8 else torch.bfloat16)
            for _ in range(2))
    q = torch.randn(b, sq, hq, d, device="cuda", dtype=torch.bfloat16)
    seqlens = torch.tensor(lens, dtype=torch.int32, device="cuda")
    got, lse = fmha.attention_with_kvcache(q, k, v, seqlens, causal=True, num_splits=MAX_FORCED_SPLITS,
                                           return_lse=True)
    assert_matches(got, lse, _oracle(q, k, v, lens, causal=True), torch.bfloat16)


@pytest.mark.gpu
def test_fp8_decode_split_parts_past_2g(monkeypatch):
    """The Gluon FP8 decode (`fp8_decode_sm90`) split in 64, as a caller may force, over 4200 sequences of 64 packed
    rows (MQA: 64 query heads, d = 128): its fp32 partial outputs are 64 slots of 34M elements, and the last slot's
    offset passes 2^31. The split's offset was a 32-bit product, which wrapped: that slot's part went 8.5 GB before
    the buffer, and the slot kept what its memory held. The allocator's block is NaN-filled first, so such a slot
    turns every output NaN (a part with no key weighs 0, but 0 x NaN is NaN). Every output finite, and the oracle's
    on a sample of sequences (lengths 0-64 keys, one shuffled page each)."""
    from fmha.kernels import fp8_decode_sm90
    calls = spy(monkeypatch, fp8_decode_sm90, "fp8_decode_forward_sm90")
    b, h_q, d, page, splits = 4200, 64, 128, 64, 64
    assert (splits - 1) * b * h_q * d > 2 ** 31             # the last slot's offset
    g = torch.Generator(device="cuda").manual_seed(12)
    lens = torch.randint(0, page + 1, (b,), generator=g, device="cuda", dtype=torch.int32)
    lens[:2] = torch.tensor([0, page])
    past = torch.arange(page, device="cuda")[None, :] >= lens[:, None]
    k, v = ((torch.randn(b, page, 1, d, generator=g, device="cuda") * 2).masked_fill(past[..., None, None], NAN)
            .to(torch.float8_e4m3fn) for _ in range(2))
    k_cache, v_cache, table = paged_copy(page, k, v, perm=torch.randperm(b, generator=g, device="cuda"))
    q = torch.randn(b, 1, h_q, d, generator=g, device="cuda").to(torch.bfloat16)
    descales = _descales(b, 1, "cuda")
    torch.cuda.empty_cache()
    # NaN where the call's buffers will be: the parts' block and 256 MB for the output, LSE and parts' LSE
    poison = torch.full((splits * b * h_q * d + (64 << 20),), NAN, device="cuda")
    del poison
    got, lse = fmha.attention_with_kvcache(q, k_cache, v_cache, lens, block_table=table, num_splits=splits,
                                           return_lse=True, **descales)
    assert len(calls) == 1 and torch.isfinite(got).all()
    sample = torch.tensor([0, 1, 2, 3, b // 2, b - 2, b - 1], device="cuda")
    oracle = _oracle(q[sample], k[sample], v[sample], lens[sample].tolist(),
                     **{name: t[sample] for name, t in descales.items()})
    assert_matches(got[sample], lse[sample], oracle, torch.bfloat16)
    del got, lse
    torch.cuda.empty_cache()


@pytest.mark.cpu
def test_fp8_decode_gluon_rule(monkeypatch):
    """Which KV-cache calls go to the Gluon decode over an FP8 cache (`forward._fp8_decode_takes`, then
    `fp8_decode_sm90.supported`, here as on an sm_90 GPU): 33-64 packed rows, head dims 64 / 128 / 256, a 16-bit q
    beside e4m3 caches of its head dim, caches whose strides TMA takes (engines' layouts too; unpaged at d = 128 /
    256), pages whole boxes of a key tile; no window but the causal one, no softcap, ALiBi, sinks, key starts, q
    descale or overrides; and its split planning (`plan_num_splits(per_sm=1)`)."""
    from fmha.kernels import fp8_decode_sm90
    from fmha.kernels.forward import _fp8_decode_takes, _overridden
    monkeypatch.setattr(fp8_decode_sm90, "on_hopper", lambda t: True)
    f8 = torch.float8_e4m3fn

    def takes(left=-1, right=-1, window_lefts=None, softcap=0.0, alibi=None, sinks=None, descales=(None,) * 3,
              k_starts=None, pack_gqa=None, use_tma=None, tiles=None, backend=None, short_rows=0):
        return _fp8_decode_takes(left, right, window_lefts, softcap, alibi, sinks, descales, k_starts,
                                 _overridden(pack_gqa, use_tma, tiles, backend, short_rows))

    one = torch.ones(1)
    assert takes() and takes(right=0) and takes(descales=(None, one, one))
    assert not any([takes(left=5), takes(right=3), takes(window_lefts=one), takes(softcap=30.0), takes(alibi=one),
                    takes(sinks=one), takes(descales=(one, None, None)), takes(k_starts=one), takes(pack_gqa=True),
                    takes(use_tma=False), takes(tiles=(64, 64, 4, 3)), takes(backend="triton"), takes(short_rows=8)])

    def supported(rows=64, d=128, q_dtype=torch.bfloat16, kv_dtype=f8, page=64, dk=None, table_stride=1, gap=False,
                  layout=None):
        q = torch.zeros(2, 1, 8, d, dtype=q_dtype)
        k = torch.zeros(9, page or 256, 2, (dk or d) + gap, dtype=kv_dtype)[..., :dk or d]
        if layout is not None:
            k = _engine_layout(k, k, layout)[1]
        table = None if page is None else torch.zeros(2, 4 * table_stride, dtype=torch.int32)[:, ::table_stride]
        return fp8_decode_sm90.supported(q, k, k, q, table, rows)

    assert supported() and supported(rows=33) and supported(d=64) and supported(d=256) and supported(page=None)
    assert supported(layout="kv_pages") and supported(layout="hnd") and supported(d=64, page=16, layout="hnd")
    assert supported(q_dtype=torch.float16) and all(supported(page=p) for p in (16, 32, 128, 256, 512))
    assert not supported(d=64, page=None) and supported(d=256, page=None)         # contiguous: d = 128 / 256
    assert not any([supported(rows=32), supported(rows=65), supported(d=96), supported(q_dtype=torch.float32),
                    supported(kv_dtype=torch.bfloat16), supported(d=128, dk=64), supported(page=48),
                    supported(table_stride=2), supported(gap=True), supported(page=None, gap=True)])
    # its splits: one wave of (batch, KV head, split) items, one program an SM
    assert [plan_num_splits(items, 131072, 128, 132, per_sm=1) for items in (8, 32, 64, 132, 512)] == [16, 4, 2, 1, 1]
    assert plan_num_splits(32, 2048, 128, 132, per_sm=1) == 4 and plan_num_splits(32, 1024, 128, 132, per_sm=1) == 2


BF16, FP16 = torch.bfloat16, torch.float16


@pytest.mark.gpu
# (head dim, page size or None, seqlen_q, query heads, KV heads, causal, num_splits, descales, q's dtype, q's
# magnitude): 33-64 packed rows a KV head (seqlen_q x group), odd counts among them
@pytest.mark.parametrize("case", [
    (128, 64, 1, 512, 8, False, 0, True, BF16, 1.0), (128, 16, 8, 64, 8, True, 1, True, BF16, 1.0),
    (128, None, 8, 64, 8, True, 3, False, FP16, 1.0), (128, 256, 2, 256, 8, True, 0, True, BF16, 1.0),
    (128, 32, 5, 56, 7, True, 2, True, BF16, 2.0 ** 20), (64, 64, 4, 64, 4, True, 0, True, BF16, 1.0),
    (64, 32, 1, 48, 1, False, 1, False, BF16, 2.0 ** -20), (256, 128, 8, 32, 4, True, 0, True, BF16, 1.0),
    (256, 16, 3, 44, 4, True, 2, True, FP16, 1.0), (256, None, 8, 64, 8, True, 0, True, BF16, 1.0)], ids=str)
def test_kvcache_fp8_gluon_decode(case, monkeypatch):
    """The Gluon decode over an FP8 cache (`fp8_decode_sm90`): head dims 64 / 128 / 256, pages of 16-256 keys
    (boxes of a key tile, whole tiles of a page) or none (d = 128 / 256), 33-64 packed rows, causal or not, split as
    planned, unsplit or split as given (the parts merged by `combine`), descales or none, bf16 or fp16 queries,
    some 2^20 or 2^-20 times the usual (softmax_scale undoing it: q's power of two into fp16), lengths 0 to the
    capacity with NaN past each and in unused pages: the oracle's answer, and the call went to that kernel."""
    from fmha.kernels import fp8_decode_sm90
    d, page_size, seqlen_q, hq, hk, causal, num_splits, with_descales, dtype, magnitude = case
    calls = spy(monkeypatch, fp8_decode_sm90, "fp8_decode_forward_sm90")
    seqlens = [3000, 0, 17, 4096, 1, 64 + seqlen_q]
    k_cache, v_cache, table, k, v = _cache(seqlens, 4096, hk, d, d, torch.float8_e4m3fn, "cuda", page_size, seed=d)
    q = (torch.randn(len(seqlens), seqlen_q, hq, d, device="cuda") * magnitude).to(dtype)
    lens = torch.tensor(seqlens, dtype=torch.int32, device="cuda")
    options = dict(causal=causal, softmax_scale=d ** -0.5 / magnitude,
                   **(_descales(len(seqlens), hk, "cuda") if with_descales else {}))
    got, lse = fmha.attention_with_kvcache(q, k_cache, v_cache, lens, block_table=table, num_splits=num_splits,
                                           return_lse=True, **options)
    assert calls == [1]
    assert got.dtype == dtype
    assert_matches(got, lse, _oracle(q, k, v, seqlens, **options), dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("seqlen_q,causal,num_splits", [(4, True, 1), (4, False, 1), (4, True, 3), (1, False, 1)],
                         ids=str)
def test_kvcache_fp8_32_rows_d64(seqlen_q, causal, num_splits):
    """32 packed query rows at d = 64 over a contiguous FP8 cache (4 tokens of a GQA group of 8, or one token of 32
    heads a KV head: the FP8 contiguous table's (32, 64, 2, 4)), split or not: the oracle's answer, compiled under
    the FP8 register cap (`forward._GPU_MAXNREG`) to at most 160 registers a thread (uncapped, ptxas took the
    causal form to 168 and 8 bytes of stack, and it read 1-5% slower)."""
    from fmha.kernels import forward
    compiled = _call_compiled([3000, 0, 17, 4096], seqlen_q, 64 // seqlen_q, torch.float8_e4m3fn, None,
                              forward.attn_fwd_kernel, 32, num_splits=num_splits, causal=causal)
    assert [(m["BLOCK_M"], m["BLOCK_N"], m["num_warps"], m["SPLIT"], m.get("maxnreg")) for _, m in compiled] == [
        (32, 64, 2, num_splits > 1, 160)]
    assert compiled[0][0].n_regs <= 160, compiled[0][0].n_regs


@pytest.mark.cpu
def test_head_pairs_rule():
    """Which calls `forward.HEAD_PAIRS` takes: a 16-bit cache at d = 64 / 128 with an even number of KV heads side by
    side, both heads' rows within 16; not FP8, odd head counts, other head dims, longer chunks or varlen calls."""
    from fmha.kernels.forward import _pairs_heads
    none = (None,) * 3

    def pairs(hq=32, hk=8, d=128, seqlen_q=1, kv_dtype=torch.float16, cache=True, varlen=False, descales=none,
              heads_apart=False):
        q = torch.zeros(2, seqlen_q, hq, d, dtype=torch.float16)
        k = torch.zeros(2, 64, hk, 2 * d if heads_apart else d, dtype=kv_dtype)[..., :d]
        lens = torch.ones(2, dtype=torch.int32) if cache else None
        return _pairs_heads(q, k, k, lens, varlen, seqlen_q, hq // hk, descales)

    assert pairs() and pairs(d=64) and pairs(hq=8, hk=8, seqlen_q=8) and pairs(seqlen_q=2)
    assert not pairs(seqlen_q=3)                              # 2 x 4 x 3 = 24 rows
    assert pairs(hq=12, hk=4, seqlen_q=2) and not pairs(hq=12, hk=4, seqlen_q=3)      # 12 rows, 18 rows
    assert not pairs(hq=7, hk=7)                              # odd KV heads
    assert not pairs(d=256) and not pairs(d=96)
    assert not pairs(kv_dtype=torch.float8_e4m3fn)
    assert not pairs(descales=(None, torch.ones(2, 8), None))
    assert not pairs(cache=False) and not pairs(varlen=True)
    assert not pairs(heads_apart=True)                        # a head's values not next to its neighbour's


@pytest.mark.cpu
def test_head_pairs_pay(monkeypatch):
    """`forward.HEAD_PAIRS`' default rule (`_pairs_pay`), on a 132-SM GPU's plan: d = 128 GQA decode whose one-head
    grid runs unsplit (b = 64 x 8 KV heads at 4k keys, contiguous or paged) takes the pairs; a split grid (b = 4 at
    131k), MHA, d = 64, a forced split count and a 64-row chunk do not."""
    from fmha.kernels import forward
    monkeypatch.setattr(forward, "num_sms", lambda device: 132)

    def pay(b=64, hq=32, hk=8, d=128, sk=4096, seqlen_q=1, paged=False, num_splits=0):
        q = torch.zeros(b, seqlen_q, hq, d, dtype=torch.float16)
        k = torch.zeros(b, 1, hk, d, dtype=torch.float16)
        tiles = forward._tile_config(d, d, False, rows=seqlen_q * (hq // hk), paged=paged)     # the call's own
        return forward._pairs_pay(q, k, tiles, hq // hk, sk, num_splits)

    assert pay() and pay(paged=True) and pay(b=32) and pay(seqlen_q=2)
    assert not pay(b=4, sk=131072) and not pay(b=1, sk=131072, paged=True)
    assert not pay(hq=32, hk=32) and not pay(d=64) and not pay(num_splits=1) and not pay(num_splits=2)


class _Planned(Exception):
    """Raised by a test's stand-in for `forward.launch` with the plan's split count (and, where the test asks, its
    num_stages and BLOCK_N): nothing runs."""


@pytest.mark.cpu
def test_split_tiles(monkeypatch):
    """`forward._GPU_SPLIT_TILES` in a 132-SM GPU's plans (speculative decodes of 16 rows, GQA 4: 64 packed rows, the
    64-row decode tiles): the paged d = 64 and d = 256 and contiguous d = 32 tiles launch their table's 3 stages unsplit
    and the rule's 7 / 5 / 4 when the keys are split, planned or forced; tiles the rule does not name keep their
    stages split (paged d = 64 at 32 rows, the 17-32-row table's (32, 64, 2, 6), among them). One token of a GQA
    group of 8 at d = 128 (the 16-row tiles): paged, 128-key tiles in 3 stages unsplit and 64-key ones in 6 split;
    contiguous, its 128-key tiles either way."""
    from fmha.kernels import forward
    monkeypatch.setattr(forward, "num_sms", lambda device: 132)
    monkeypatch.setattr(forward, "programs_per_sm", lambda *args: 8)      # as many as the planner counts: no refit

    def launch(kernel, grid, args, meta, fixed):
        raise _Planned(grid[2], meta["num_stages"], meta["BLOCK_N"])
    monkeypatch.setattr(forward, "launch", launch)

    def planned(d, paged, b, max_k, num_splits=0, hq=32, hk=8, seqlen_q=16, block_n=False):
        q = torch.zeros(b, seqlen_q, hq, d, dtype=torch.float16)
        k = torch.zeros((2, 64, hk, d) if paged else (b, 64, hk, d), dtype=torch.float16)    # the plan reads max_k
        table = torch.zeros(b, max_k // 64, dtype=torch.int32) if paged else None
        with pytest.raises(_Planned) as e:
            forward.attention_forward(q, k, k, torch.empty_like(q), torch.empty(b, hq, seqlen_q), cu_seqlens_q=None,
                                      cu_seqlens_k=None, max_seqlen_q=seqlen_q, max_seqlen_k=max_k,
                                      softmax_scale=None, window=(-1, -1), softcap=0.0, alibi_slopes=None, sinks=None,
                                      cache_seqlens=torch.full((b,), max_k, dtype=torch.int32), block_table=table,
                                      num_splits=num_splits)
        return e.value.args if block_n else e.value.args[:2]

    assert planned(64, True, 64, 4096) == (1, 3) and planned(64, True, 64, 4096, num_splits=2) == (2, 7)
    splits, stages = planned(64, True, 4, 131072)
    assert splits > 1 and stages == 7
    assert planned(64, True, 64, 4096, seqlen_q=8) == (1, 6) and planned(64, True, 4, 131072, num_splits=8,
                                                                         seqlen_q=8) == (8, 6)
    assert planned(32, False, 64, 4096) == (1, 3) and planned(32, False, 32, 8192, hk=32) == (1, 3)
    splits, stages = planned(32, False, 4, 131072)
    assert splits > 1 and stages == 4
    assert planned(64, False, 4, 131072, num_splits=8) == (8, 3)          # contiguous d = 64: no rule
    assert planned(128, True, 4, 131072, num_splits=8) == (8, 5)          # paged d = 128: the table's 5
    assert planned(32, True, 4, 131072, num_splits=8) == (8, 5)           # paged d = 32: the table's 5
    assert planned(256, True, 64, 4096) == (1, 3) and planned(256, True, 4, 131072, num_splits=4) == (4, 5)
    assert planned(256, False, 4, 131072, num_splits=4) == (4, 4)         # contiguous d = 256: the table's 4
    # every split tile keeps the rows and warps its split was planned on
    assert all((split[0], split[2]) == (tiles[0], tiles[2])
               for (_, _, tiles), split in forward._GPU_SPLIT_TILES.items())
    one_kv = dict(d=128, max_k=4096, hq=8, hk=1, seqlen_q=1, block_n=True)
    assert planned(paged=True, b=256, **one_kv) == (1, 3, 128) and planned(paged=True, b=64, **one_kv) == (4, 6, 64)
    assert planned(paged=True, b=256, num_splits=2, **one_kv) == (2, 6, 64)
    assert planned(paged=False, b=256, **one_kv) == (1, 3, 128) and planned(paged=False, b=64, **one_kv) == (4, 3, 128)


def test_split_plan_fitted(monkeypatch):
    """A planned split whose compile fits fewer programs on an SM than `plan_num_splits` counts (`forward._fitted`) is
    planned again on what fits; one that fits as many keeps its plan; a forced split is never refitted. A 132-SM
    GPU's plans of one KV head's decode (8 query heads, 4k keys, b = 64 / 16 / 128), what fits given: nothing runs."""
    from fmha.kernels import forward
    monkeypatch.setattr(forward, "num_sms", lambda device: 132)
    fits = []

    def programs_per_sm(fn, grid, args, meta):
        o_part = list(inspect.signature(fn.fn).parameters).index("O_PART")
        assert meta["SPLIT"] and args[o_part].dtype == torch.float32   # the split plan's arguments: its fp32 slab
        fits.append(grid)
        return fit

    def launch(kernel, grid, args, meta, fixed):
        raise _Planned(grid[2])
    monkeypatch.setattr(forward, "programs_per_sm", programs_per_sm)
    monkeypatch.setattr(forward, "launch", launch)

    def planned(b, max_k, num_splits=0):
        q = torch.zeros(b, 1, 8, 128, dtype=torch.float16)
        k = torch.zeros(b, max_k, 1, 128, dtype=torch.float16)
        with pytest.raises(_Planned) as e:
            forward.attention_forward(q, k, k, torch.empty_like(q), torch.empty(b, 8, 1), cu_seqlens_q=None,
                                      cu_seqlens_k=None, max_seqlen_q=1, max_seqlen_k=max_k, softmax_scale=None,
                                      window=(-1, -1), softcap=0.0, alibi_slopes=None, sinks=None,
                                      cache_seqlens=torch.full((b,), max_k, dtype=torch.int32), num_splits=num_splits)
        return e.value.args[0]

    fit = 2                                     # the planner's count for 4-warp programs
    assert planned(64, 4096) == 4 and len(fits) == 1
    fit = 1
    assert [planned(64, 4096 + 64), planned(16, 8192), planned(128, 2048)] == [2, 8, 1]
    assert planned(64, 4096 + 128, num_splits=4) == 4 and len(fits) == 4      # forced: not asked


@pytest.mark.gpu
@pytest.mark.parametrize("page_size", [None, 64], ids=lambda p: f"page{p}" if p else "contiguous")
def test_split_plan_fits_sm(page_size, monkeypatch):
    """On the device, a planned split decode (one KV head of 8 query heads, b = 64, lengths up to 4k, NaN past them)
    asks what its compile fits on an SM (`launch.programs_per_sm`), launches one wave of that many programs an SM at
    most, and gives the oracle's answer."""
    from fmha.kernels import forward, launch
    monkeypatch.setattr(forward, "_PLANS", forward.Plans())           # planned here, not taken from an earlier test
    monkeypatch.setattr(launch, "RECORD", [])
    seqlens = [4096 - 61 * i for i in range(64)]
    k_cache, v_cache, table, k, v = _cache(seqlens, 4096, 1, 128, 128, torch.bfloat16, "cuda", page_size, seed=5)
    q = torch.randn(64, 1, 8, 128, device="cuda", dtype=torch.bfloat16)
    real = forward.programs_per_sm
    got_fits = []
    monkeypatch.setattr(forward, "programs_per_sm", lambda *a: got_fits.append(real(*a)) or got_fits[-1])
    got, lse = fmha.attention_with_kvcache(q, k_cache, v_cache, torch.tensor(seqlens, dtype=torch.int32,
                                           device="cuda"), block_table=table, return_lse=True)
    assert_matches(got, lse, _oracle(q, k, v, seqlens), torch.bfloat16)
    grids = [grid for name, grid, meta in launch.RECORD if name == "attn_fwd_kernel"]
    assert len(grids) == 1 and len(got_fits) == 1
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    assert 1 <= got_fits[0] and math.prod(grids[0]) <= sms * got_fits[0] and grids[0][2] > 1


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("page_size", [None, 16], ids=lambda p: f"page{p}" if p else "contiguous")
def test_kvcache_fp8_odd_v(target, page_size):
    """An FP8 V cache at an odd address with odd strides (a view one byte into rows of d + 1, the byte before each
    row NaN): the decode forms read such a V byte by byte, not as 16-bit words (`forward._fp8_word_halves`)."""
    device, dtype = target
    c = _case(target)
    k_cache, v_cache, table, k, v = _cache(c["seqlens"], c["capacity"], c["hk"], c["d"], c["d"],
                                           torch.float8_e4m3fn, device, page_size, seed=3)
    wide = torch.full((*v_cache.shape[:-1], c["d"] + 1), NAN, dtype=torch.float8_e4m3fn, device=device)
    wide[..., 1:] = v_cache
    v_odd = wide[..., 1:]
    assert v_odd.data_ptr() % 2 == 1 and v_odd.stride(-2) % 2 == 1
    b = len(c["seqlens"])
    q = torch.randn(b, 1, c["hq"], c["d"], device=device, dtype=dtype)
    seqlens = torch.tensor(c["seqlens"], dtype=torch.int32, device=device)
    descales = _descales(b, c["hk"], device)
    got, lse = fmha.attention_with_kvcache(q, k_cache, v_odd, seqlens, block_table=table, return_lse=True,
                                           **descales)
    assert_matches(got, lse, _oracle(q, k, v, c["seqlens"], **descales), dtype)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("page_size", [None, 16], ids=lambda p: f"page{p}" if p else "contiguous")
@pytest.mark.parametrize("magnitude", [2.0 ** 20, 2.0 ** -20, None, 2.0 ** -131],
                         ids=["huge", "tiny", "mixed", "subnormal"])
def test_kvcache_fp8_query_magnitude(target, page_size, magnitude):
    """bf16 queries beside an FP8 cache run in fp16 after a power-of-two rescale of each program's query rows: q
    far outside fp16's range (2^20 times, 2^-20 times the usual, softmax_scale undoing it) and query heads of one
    KV head 2^12 apart in magnitude give the oracle's answer, as do subnormal ones. bf16 on the CPU as well (that path is bf16-only;
    its bf16 is the loads and the output rounding, which the interpreter gets right)."""
    device, dtype = target[0], torch.bfloat16
    c = _case(target)
    k_cache, v_cache, table, k, v = _cache(c["seqlens"], c["capacity"], c["hk"], c["d"], c["d"],
                                           torch.float8_e4m3fn, device, page_size, seed=7)
    b = len(c["seqlens"])
    q = torch.randn(b, 1, c["hq"], c["d"], device=device)
    if magnitude is None:
        magnitude = 1.0
        q[:, :, 0::2] *= 2.0 ** 6                           # heads sharing a KV head, 2^12 apart
        q[:, :, 1::2] *= 2.0 ** -6
    q = (q * magnitude).to(dtype)
    seqlens = torch.tensor(c["seqlens"], dtype=torch.int32, device=device)
    # bf16 subnormal queries (all |q| < 2^-126): scores of ~0 at the usual scale (1 / magnitude would overflow).
    scale = c["d"] ** -0.5 / (magnitude if magnitude > 2.0 ** -126 else 1.0)
    options = dict(softmax_scale=scale, k_descale=torch.rand(b, c["hk"], device=device) + 0.2)
    got, lse = fmha.attention_with_kvcache(q, k_cache, v_cache, seqlens, block_table=table, return_lse=True,
                                           **options)
    assert_matches(got, lse, _oracle(q, k, v, c["seqlens"], **options), dtype)


def _far_contiguous(k_cache, v_cache, past=2 ** 31):
    """Contiguous caches re-laid with a batch stride that puts the last two sequences past `past` elements of one
    buffer (K's rows, then V's), the rest of it never written (NaN on the GPU)."""
    b, row = k_cache.shape[0], k_cache[0].numel()
    stride_b = -(-past // max(b - 2, 1) // 1024) * 1024
    buf = torch.empty((b - 1) * stride_b + 2 * row, dtype=k_cache.dtype, device=k_cache.device)
    if buf.is_cuda:
        poison(buf)
    views = []
    for i, cache in enumerate((k_cache, v_cache)):
        view = buf[i * row:].as_strided(cache.shape, (stride_b,) + cache.stride()[1:])
        view.copy_(cache)
        views.append(view)
    assert views[0][-1].storage_offset() >= past
    return views


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("page_size", [None, 16], ids=lambda p: f"page{p}" if p else "contiguous")
@pytest.mark.parametrize("seqlen_q,num_splits,fp8", [(1, 0, False), (4, 2, False), (64, 1, False), (1, 3, True),
                                                     (4, 1, True)], ids=str)
def test_kvcache_past_2g_elements(target, page_size, seqlen_q, num_splits, fp8):
    """Caches whose keys sit more than 2^31 elements into their tensor, as a serving engine's one-tensor KV pool
    does: every cache address must be 64-bit, although each stride and page index alone fits int32. Paged: the
    pages moved past 2^31 elements (`far_pages`); contiguous: a batch stride that puts the last two sequences
    there. Decode, speculative rows, a forced-unsplit 64-row chunk (the Hopper prefill kernel on the GPU), FP8."""
    device, dtype = target
    c = _case(target)
    kv_dtype = torch.float8_e4m3fn if fp8 else dtype
    k_cache, v_cache, table, k, v = _cache(c["seqlens"], c["capacity"], c["hk"], c["d"], c["d"], kv_dtype, device,
                                           page_size, seed=seqlen_q)
    if page_size is None:
        k_cache, v_cache = _far_contiguous(k_cache, v_cache)
    else:
        (k_cache, v_cache), table, _ = far_pages(table, k_cache, v_cache)
    b = len(c["seqlens"])
    q = torch.randn(b, seqlen_q, c["hq"], c["d"], device=device, dtype=dtype)
    seqlens = torch.tensor(c["seqlens"], dtype=torch.int32, device=device)
    options = dict(causal=seqlen_q > 1, **(_descales(b, c["hk"], device) if fp8 else {}))
    got, lse = fmha.attention_with_kvcache(q, k_cache, v_cache, seqlens, block_table=table, num_splits=num_splits,
                                           return_lse=True, **options)
    assert_matches(got, lse, _oracle(q, k, v, c["seqlens"], **options), dtype)
    del k_cache, v_cache


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("page_size", [None, 16], ids=lambda p: f"page{p}" if p else "contiguous")
@pytest.mark.parametrize("seqlen_new,num_splits,fp8", [(1, 0, False), (3, 2, False), (2, 1, True)], ids=str)
def test_kvcache_append(target, page_size, seqlen_new, num_splits, fp8):
    """FlashAttention's k / v: the new keys and values written into the caches in place at cache_seqlens[b] + i
    (through the block table when paged), every other byte of the caches unchanged (NaN stays NaN), and attended
    with the cache: the oracle on each sequence's old keys followed by the new ones. cache_seqlens is unchanged."""
    device, dtype = target
    c = _case(target)
    kv_dtype = torch.float8_e4m3fn if fp8 else dtype
    lens = [min(n, c["capacity"] - seqlen_new) for n in c["seqlens"]]          # room for the new keys
    k_cache, v_cache, table, k, v = _cache(lens, c["capacity"], c["hk"], c["d"], c["d"], kv_dtype, device,
                                           page_size, seed=7 + seqlen_new)
    k, v = k.clone(), v.clone()                    # on the CPU a contiguous cache is the logical tensor itself
    b = len(lens)
    k_new, v_new = (torch.randn(b, seqlen_new, c["hk"], c["d"]).to(kv_dtype) for _ in range(2))
    want_k, want_v = _appended(k_cache, v_cache, k, v, lens, k_new, v_new, table)
    seqlens = torch.tensor(lens, dtype=torch.int32, device=device)
    q = torch.randn(b, seqlen_new, c["hq"], c["d"], device=device, dtype=dtype)
    options = dict(causal=True, **(_descales(b, c["hk"], device) if fp8 else {}))
    got, lse = fmha.attention_with_kvcache(q, k_cache, v_cache, seqlens, k=k_new.to(device), v=v_new.to(device),
                                           block_table=table, num_splits=num_splits, return_lse=True, **options)
    assert seqlens.tolist() == lens
    _assert_appended(k_cache, v_cache, want_k, want_v)
    assert_matches(got, lse, _oracle(q, k, v, [n + seqlen_new for n in lens], **options), dtype)


@pytest.mark.gpu
def test_kvcache_cuda_graph():
    """A steady-state decode step (automatic splits) captures into a CUDA graph and replays correctly."""
    c = _case(("cuda",))
    dtype = torch.bfloat16
    k_cache, v_cache, table, k, v = _cache(c["seqlens"], c["capacity"], c["hk"], c["d"], c["d"], dtype, "cuda", 64)
    seqlens = torch.tensor(c["seqlens"], dtype=torch.int32, device="cuda")
    q = torch.randn(len(c["seqlens"]), 1, c["hq"], c["d"], device="cuda", dtype=dtype)
    out = torch.empty_like(q)
    fmha.attention_with_kvcache(q, k_cache, v_cache, seqlens, block_table=table, out=out)   # warm-up / compile
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fmha.attention_with_kvcache(q, k_cache, v_cache, seqlens, block_table=table, out=out)
    q.copy_(torch.randn_like(q))
    graph.replay()
    torch.cuda.synchronize()
    ref, _ = _oracle(q, k, v, c["seqlens"])
    from utils import assert_close
    assert_close("out", out, ref, dtype)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("seqlen_q,num_splits,append", [(1, 0, False), (1, 3, True), (4, 1, True), (64, 1, False)],
                         ids=str)
def test_kvcache_batch_idx(target, seqlen_q, num_splits, append):
    """FlashAttention's cache_batch_idx: sequence b reads (and, with k / v, appends to) row cache_batch_idx[b] of a
    contiguous cache with more rows than the batch, in any order; the rows nobody names are NaN and stay so."""
    device, dtype = target
    c = _case(target)
    lens = [min(n, c["capacity"] - seqlen_q) for n in c["seqlens"]]
    b = len(lens)
    k_cache, v_cache, _, k, v = _cache(lens, c["capacity"], c["hk"], c["d"], c["d"], dtype, "cpu", seed=seqlen_q)
    rows = torch.randperm(b + 3, generator=torch.Generator().manual_seed(seqlen_q))[:b]
    big_k, big_v = (t.to(device) for t in _in_rows(k_cache, v_cache, rows, b + 3))
    k, v = k.clone(), v.clone()
    q = torch.randn(b, seqlen_q, c["hq"], c["d"], device=device, dtype=dtype)
    new = {}
    if append:
        new = dict(k=torch.randn(b, seqlen_q, c["hk"], c["d"], device=device, dtype=dtype),
                   v=torch.randn(b, seqlen_q, c["hk"], c["d"], device=device, dtype=dtype))
        for i, n in enumerate(lens):
            k[i, n:n + seqlen_q], v[i, n:n + seqlen_q] = new["k"][i].cpu(), new["v"][i].cpu()
    seqlens = torch.tensor(lens, dtype=torch.int32, device=device)
    got, lse = fmha.attention_with_kvcache(q, big_k, big_v, seqlens, cache_batch_idx=rows.to(torch.int32).to(device),
                                           num_splits=num_splits, causal=seqlen_q > 1, return_lse=True, **new)
    unused = torch.ones(b + 3, dtype=torch.bool)
    unused[rows] = False
    assert big_k.cpu()[unused].isnan().all() and big_v.cpu()[unused].isnan().all()
    added = seqlen_q if append else 0
    assert_matches(got, lse, _oracle(q, k, v, [n + added for n in lens], causal=seqlen_q > 1), dtype)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("seqlen_q,num_splits,variant", [(1, 0, ""), (1, 3, "append"), (4, 1, "rotary"),
                                                         (64, 0, ""), (64, 1, "batch_idx"), (3, 2, "fp8")], ids=str)
def test_kvcache_leftpad(target, seqlen_q, num_splits, variant):
    """FlashAttention's cache_leftpad: sequence b's keys are cache rows cache_leftpad[b] .. cache_seqlens[b] - 1
    (NaN before them, never read), a start at or past the end leaving no key; with k / v the new rows go at
    cache_seqlens[b] + i and rotary positions are row numbers (FlashAttention's rule); with cache_batch_idx the
    rows are those of the named cache row. 64-row chunks take the Gluon kernel on Hopper (contiguous, and one page
    a sequence for cache_batch_idx). Against the oracle on each sequence's keys from its start."""
    device, dtype = target
    c = _case(target)
    kv_dtype = torch.float8_e4m3fn if variant == "fp8" else dtype
    append = variant in ("append", "rotary", "fp8")
    lens = [min(n, c["capacity"] - seqlen_q) for n in c["seqlens"]]
    b, d = len(lens), c["d"]
    g = torch.Generator().manual_seed(seqlen_q)
    starts = [int(torch.randint(0, n + 1, (), generator=g)) for n in lens]
    starts[-1] = lens[-1] if append else lens[-1] // 2          # all keys padded away (with the new ones left)
    starts[1] = lens[1] + seqlen_q * append + 5                 # past the end: no key at all
    k_cache, v_cache, _, k, v = _cache(lens, c["capacity"], c["hk"], d, d, kv_dtype, "cpu", seed=3 + seqlen_q)
    for i, s in enumerate(starts):
        k_cache[i, :s], v_cache[i, :s] = NAN, NAN
    counts = [max(n + seqlen_q * append - s, 0) for n, s in zip(lens, starts)]
    k, v = k.clone(), v.clone()
    q = torch.randn(b, seqlen_q, c["hq"], d, generator=g).to(dtype)
    new, options = {}, dict(causal=seqlen_q > 1)
    if variant == "fp8":
        options.update(_descales(b, c["hk"], device))
    if append:
        new = dict(k=torch.randn(b, seqlen_q, c["hk"], d, generator=g).to(kv_dtype),
                   v=torch.randn(b, seqlen_q, c["hk"], d, generator=g).to(kv_dtype))
        k_new = new["k"]
        if variant == "rotary":
            angles = torch.arange(c["capacity"])[:, None] * 0.37 / (1 + torch.arange(d // 2))
            new.update(rotary_cos=angles.cos(), rotary_sin=angles.sin())
            at = torch.tensor(lens)[:, None] + torch.arange(seqlen_q)
            k_new = rotary_ref(new["k"], new["rotary_cos"], new["rotary_sin"], at).to(dtype)
            q_seen = rotary_ref(q, new["rotary_cos"], new["rotary_sin"], at).to(dtype)
        for i, n in enumerate(lens):
            k[i, n:n + seqlen_q], v[i, n:n + seqlen_q] = k_new[i], new["v"][i]
    seen_k, seen_v = _from_starts(k, v, starts, counts)
    rows = None
    if variant == "batch_idx":
        rows = torch.randperm(b + 2, generator=g)[:b]
        k_cache, v_cache = _in_rows(k_cache, v_cache, rows, b + 2)
        rows = rows.to(torch.int32).to(device)
    to = lambda t: t.to(device) if isinstance(t, torch.Tensor) else t      # noqa: E731
    got, lse = fmha.attention_with_kvcache(
        q.to(device), k_cache.to(device), v_cache.to(device), torch.tensor(lens, dtype=torch.int32, device=device),
        cache_leftpad=torch.tensor(starts, dtype=torch.int32, device=device), cache_batch_idx=rows,
        num_splits=num_splits, return_lse=True, **{n: to(t) for n, t in new.items()}, **options)
    q_ref = q_seen if variant == "rotary" else q
    assert_matches(got, lse, _oracle(q_ref.to(device), seen_k, seen_v, counts, **options), dtype)


@pytest.mark.cpu
def test_rotary_ref():
    """The rotary oracle on cases worked by hand: a quarter turn moves (1, 0) to (0, 1); GPT-NeoX pairs (i, i + 2),
    GPT-J pairs (2i, 2i + 1); values past rotary_dim pass through; positions pick the table's rows."""
    x = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0]).view(1, 1, 1, 5)
    cos, sin = torch.tensor([[1.0, 1.0], [0.0, 0.0]]), torch.tensor([[0.0, 0.0], [1.0, 1.0]])
    assert rotary_ref(x, cos, sin, [[0]]).flatten().tolist() == [1, 2, 3, 4, 5]
    assert rotary_ref(x, cos, sin, [[1]]).flatten().tolist() == [-3, -4, 1, 2, 5]
    assert rotary_ref(x, cos, sin, [[1]], interleaved=True).flatten().tolist() == [-2, 1, -4, 3, 5]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("page_size", [None, 16], ids=lambda p: f"page{p}" if p else "contiguous")
@pytest.mark.parametrize("seqlen_new,causal,interleaved,rotary_part", [(1, False, False, 1), (3, True, True, 1),
                                                                       (3, False, False, 2), (2, True, False, 2)],
                         ids=str)
def test_kvcache_rotary(target, page_size, seqlen_new, causal, interleaved, rotary_part):
    """FlashAttention's rotary_cos / rotary_sin with the append: the new keys are rotated at cache_seqlens[b] + i
    before they are written; q at the same positions under a causal mask, else every query at cache_seqlens[b];
    the whole head (rotary_part 1) or its first half (2), GPT-NeoX or GPT-J pairs. Against `rotary_ref` and the
    attention oracle; the cache holds the rotated keys."""
    device, dtype = target
    c = _case(target)
    lens = [min(n, c["capacity"] - seqlen_new) for n in c["seqlens"]]
    k_cache, v_cache, table, k, v = _cache(lens, c["capacity"], c["hk"], c["d"], c["d"], dtype, device, page_size,
                                           seed=11 + seqlen_new)
    k, v = k.clone(), v.clone()
    b, d = len(lens), c["d"]
    g = torch.Generator().manual_seed(seqlen_new)
    angles = torch.arange(c["capacity"] + 8)[:, None] * 0.37 / (1 + torch.arange(d // (2 * rotary_part)))
    cos, sin = angles.cos(), angles.sin()
    k_new, v_new = (torch.randn(b, seqlen_new, c["hk"], d, generator=g).to(dtype) for _ in range(2))
    q = torch.randn(b, seqlen_new, c["hq"], d, generator=g).to(dtype)
    steps = torch.arange(seqlen_new)[None, :]
    starts = torch.tensor(lens)[:, None]
    k_rot = rotary_ref(k_new, cos, sin, starts + steps, interleaved=interleaved).to(dtype)
    q_rot = rotary_ref(q, cos, sin, starts + steps * causal, interleaved=interleaved).to(dtype)
    for i, n in enumerate(lens):
        k[i, n:n + seqlen_new], v[i, n:n + seqlen_new] = k_rot[i], v_new[i]
    seqlens = torch.tensor(lens, dtype=torch.int32, device=device)
    got, lse = fmha.attention_with_kvcache(q.to(device), k_cache, v_cache, seqlens, k=k_new.to(device),
                                           v=v_new.to(device), rotary_cos=cos.to(device), rotary_sin=sin.to(device),
                                           rotary_interleaved=interleaved, block_table=table, causal=causal,
                                           return_lse=True)
    for i, n in enumerate(lens):
        rows = k_cache[i, n:n + seqlen_new] if table is None else torch.stack(
            [k_cache[table[i, (n + j) // page_size], (n + j) % page_size] for j in range(seqlen_new)])
        torch.testing.assert_close(rows.cpu().float(), k_rot[i].float(), atol=1e-2, rtol=1e-2)
    assert_matches(got, lse, _oracle(q_rot.to(device), k, v, [n + seqlen_new for n in lens], causal=causal), dtype)


@pytest.mark.gpu
def test_kvcache_append_cuda_graph():
    """A decode step that appends its new key (k / v) captures into a CUDA graph: replayed with new queries, keys
    and lengths, it writes where the new lengths say and attends to them."""
    c = _case(("cuda",))
    dtype = torch.bfloat16
    lens = [n - 1 if n == c["capacity"] else n for n in c["seqlens"]]
    k_cache, v_cache, table, k, v = _cache(lens, c["capacity"], c["hk"], c["d"], c["d"], dtype, "cuda", 64)
    b = len(lens)
    seqlens = torch.tensor(lens, dtype=torch.int32, device="cuda")
    q = torch.randn(b, 1, c["hq"], c["d"], device="cuda", dtype=dtype)
    k_new, v_new = (torch.randn(b, 1, c["hk"], c["d"], device="cuda", dtype=dtype) for _ in range(2))
    out = torch.empty_like(q)
    step = lambda: fmha.attention_with_kvcache(q, k_cache, v_cache, seqlens, k=k_new, v=v_new,  # noqa: E731
                                               block_table=table, out=out)
    step()                                           # warm-up / compile (writes position lens[b], rewritten below)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    lens = [max(n - 2, 0) for n in lens]             # shorter now: the replay overwrites positions lens[b]
    seqlens.copy_(torch.tensor(lens, dtype=torch.int32))
    for t in (q, k_new, v_new):
        t.copy_(torch.randn_like(t))
    graph.replay()
    torch.cuda.synchronize()
    k, v = k.clone(), v.clone()
    for i, n in enumerate(lens):
        k[i, n], v[i, n] = k_new[i, 0].cpu(), v_new[i, 0].cpu()
    ref, _ = _oracle(q, k, v, [n + 1 for n in lens])
    from utils import assert_close
    assert_close("out", out, ref, dtype)


def test_planner():
    assert plan_num_splits(programs=2000, max_seqlen_k=8192, block_n=128, sms=132) == 1
    assert plan_num_splits(programs=8, max_seqlen_k=131072, block_n=128, sms=132) == 33
    assert plan_num_splits(programs=32, max_seqlen_k=131072, block_n=128, sms=132) == 8    # one wave, not 1.1
    assert plan_num_splits(programs=8, max_seqlen_k=256, block_n=128, sms=132) == 1   # too short to split
    assert plan_num_splits(programs=1, max_seqlen_k=10 ** 7, block_n=128, sms=132) == 64
    assert plan_num_splits(programs=0, max_seqlen_k=0, block_n=128, sms=132) == 1
    # 2-warp programs (the FP8 paged tiles) take four slots an SM, 8-warp ones still two
    assert plan_num_splits(programs=32, max_seqlen_k=131072, block_n=64, sms=132, num_warps=2) == 16
    assert plan_num_splits(programs=32, max_seqlen_k=131072, block_n=64, sms=132, num_warps=8) == 8


def test_kvcache_bad_input():
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    q = torch.randn(2, 1, 4, 64, device=dev, dtype=torch.float16)
    kc = torch.randn(10, 16, 2, 64, device=dev, dtype=torch.float16)
    table = torch.zeros(2, 3, dtype=torch.int32, device=dev)
    lens = torch.tensor([5, 7], dtype=torch.int32, device=dev)
    with pytest.raises(TypeError, match="cache_seqlens: expected dtype"):
        fmha.attention_with_kvcache(q, kc, kc, lens.long(), block_table=table)
    with pytest.raises(ValueError, match="cache_seqlens: expected shape"):
        fmha.attention_with_kvcache(q, kc, kc, lens[:1], block_table=table)
    with pytest.raises(ValueError, match="cache_seqlens: expected a length >= 0"):
        fmha.attention_with_kvcache(q, kc, kc, -1, block_table=table)
    with pytest.raises(TypeError, match="cache_seqlens: expected a torch.Tensor"):
        fmha.attention_with_kvcache(q, kc, kc, 5.0, block_table=table)
    with pytest.raises(ValueError, match="block_table: expected"):
        fmha.attention_with_kvcache(q, kc, kc, lens, block_table=table[:1])
    with pytest.raises(ValueError, match="k_cache: batch"):
        fmha.attention_with_kvcache(q, kc, kc, lens)
    with pytest.raises(ValueError, match="num_splits"):
        fmha.attention_with_kvcache(q, kc, kc, lens, block_table=table, num_splits=-1)
    # New keys to append (k / v): checked before anything is written; the cache is left as it was.
    new = torch.ones(2, 1, 2, 64, device=dev, dtype=torch.float16)
    before = kc.clone()
    bad = [(ValueError, "v: k and v are appended together", dict(k=new)),
           (ValueError, "k: k and v are appended together", dict(v=new)),
           (TypeError, "k: expected dtype", dict(k=new.float(), v=new)),
           (ValueError, "v: expected shape", dict(k=new, v=new[:, :, :1])),
           (ValueError, "k: expected shape", dict(k=new[:1], v=new)),
           (ValueError, "v: expected seqlen_new", dict(k=new, v=torch.cat([new, new], 1))),
           (ValueError, "num_splits", dict(k=new, v=new, num_splits=-1))]
    cos = torch.ones(64, 16, device=dev, dtype=torch.float16)
    bad += [(ValueError, "rotary_sin: rotary_cos and rotary_sin come together", dict(rotary_cos=cos)),
            (ValueError, "rotary_cos: rotary_cos and rotary_sin come together", dict(rotary_sin=cos)),
            (TypeError, "rotary_sin: expected dtype", dict(rotary_cos=cos, rotary_sin=cos.double())),
            (ValueError, "rotary_sin: expected rotary_cos's shape", dict(rotary_cos=cos, rotary_sin=cos[:, :8])),
            (ValueError, "rotary_sin: expected rotary_cos's shape",
             dict(rotary_cos=cos.repeat(1, 3), rotary_sin=cos.repeat(1, 3))),
            (TypeError, "rotary_interleaved: expected a bool",
             dict(k=new, v=new, rotary_cos=cos, rotary_sin=cos, rotary_interleaved=1))]
    for error, message, kw in bad:
        with pytest.raises(error, match=message):
            fmha.attention_with_kvcache(q, kc, kc, lens, block_table=table, **kw)
    assert torch.equal(kc, before)
    idx = torch.tensor([1, 0], dtype=torch.int32, device=dev)
    with pytest.raises(ValueError, match="cache_batch_idx: for contiguous caches only"):
        fmha.attention_with_kvcache(q, kc, kc, lens, block_table=table, cache_batch_idx=idx)
    with pytest.raises(TypeError, match="cache_batch_idx: expected dtype"):
        fmha.attention_with_kvcache(q, kc, kc, lens, cache_batch_idx=idx.long())
    with pytest.raises(ValueError, match="cache_batch_idx: expected shape"):
        fmha.attention_with_kvcache(q, kc, kc, lens, cache_batch_idx=idx[:1])
    pad = torch.tensor([1, 0], dtype=torch.int32, device=dev)
    for error, message, kw in [(ValueError, "cache_leftpad: for contiguous caches only", dict(block_table=table)),
                               (TypeError, "cache_leftpad: expected dtype", dict(cache_batch_idx=idx)),
                               (ValueError, "cache_leftpad: expected shape", dict(cache_batch_idx=idx))]:
        with pytest.raises(error, match=message):
            fmha.attention_with_kvcache(q, kc, kc, lens, k=new, v=new, **kw,
                                        cache_leftpad=pad.long() if "dtype" in message else
                                        pad[:1] if "shape" in message else pad)
    assert torch.equal(kc, before)
    k8 = kc.to(torch.float8_e4m3fn)
    with pytest.raises(ValueError, match="rotary_cos: rotary embedding needs a 16-bit cache"):
        fmha.attention_with_kvcache(q, k8, k8, lens, block_table=table, rotary_cos=cos, rotary_sin=cos,
                                    k_descale=torch.ones(2, 2, device=dev), v_descale=torch.ones(2, 2, device=dev))


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("num_splits", [1, 3])
def test_kvcache_window_per_sequence(target, num_splits):
    """A sliding-window decode branch with one window length per sequence (a (batch,) tensor, -1 = unbounded),
    causal, over a paged cache, through the split merge."""
    device, dtype = target
    c = _case(target)
    k_cache, v_cache, table, k, v = _cache(c["seqlens"], c["capacity"], c["hk"], c["d"], c["d"], dtype, device, 16)
    seqlen_q = 3
    lefts = [5, -1, 0, 40, 1024, 7][:len(c["seqlens"])]
    q = torch.randn(len(c["seqlens"]), seqlen_q, c["hq"], c["d"], device=device, dtype=dtype)
    seqlens = torch.tensor(c["seqlens"], dtype=torch.int32, device=device)
    got, lse = fmha.attention_with_kvcache(q, k_cache, v_cache, seqlens, block_table=table, num_splits=num_splits,
                                           causal=True, window=(torch.tensor(lefts, dtype=torch.int32, device=device),
                                                                -1), return_lse=True)
    outs, lses = zip(*(_oracle(q[i:i + 1], k[i:i + 1], v[i:i + 1], [n], causal=True, window=(lefts[i], -1))
                       for i, n in enumerate(c["seqlens"])))
    assert_matches(got, lse, (torch.cat(outs), torch.cat(lses)), dtype)


@pytest.mark.cpu
def test_page_tile():
    """Keys of a key tile that share a page: the whole tile inside a page, whole power-of-two pages inside the
    tile (their numbers loaded as one vector), or 0 (a lookup per key: pages that do not tile the tile evenly)."""
    from fmha.kernels.forward import _page_tile
    assert _page_tile(64, 64) == 64 and _page_tile(256, 64) == 64
    assert _page_tile(16, 64) == 16 and _page_tile(32, 64) == 32
    assert _page_tile(48, 64) == 0 and _page_tile(24, 64) == 0 and _page_tile(96, 64) == 0


def _gpu_decode_tiles():
    """(tiles, FP8 cache) of every GPU decode table (`forward._DECODE_LOOKUP`; an FP8-only table's on an FP8
    cache; the head pairs' own), one a tile shape: the interpreter runs BLOCK_M x BLOCK_N alone (warps and stages
    are the compiler's; the test forces its splits, so the planner, which reads the warps, does not run)."""
    from fmha.kernels import forward
    tiles = ({(t, fp8_only) for fp8_only, _, _, table in forward._DECODE_LOOKUP for t in table.values()}
             | {(t, False) for table in forward._GPU_PAIR_DECODE_TILES.values() for t in table.values()})
    return sorted({(t[:2], fp8): (t, fp8) for t, fp8 in sorted(tiles)}.values())


@pytest.mark.cpu
@pytest.mark.parametrize("tiles,fp8", _gpu_decode_tiles(),
                         ids=lambda t: ("fp8" if t else "bf16") if isinstance(t, bool) else "x".join(map(str, t)))
@pytest.mark.parametrize("page_size", [16, 64, 256, None])
@pytest.mark.parametrize("seqlen_q,num_splits", [(1, 1), (1, 3), (4, 2)])
def test_kvcache_gpu_tile_shapes(tiles, fp8, page_size, seqlen_q, num_splits, monkeypatch):
    """The interpreter runs its own small tiles; this runs the tile shapes the GPU tables pick for decode (16-row
    tiles of 32 to 128 keys, 32-row ones of 64 keys and 64-row ones of 32 to 128, so 1 to 8 pages per key tile, or a
    tile inside one page, or a contiguous cache; and the FP8 tables' tiles on an FP8 cache with descales) on a GQA
    group of 4 (4 or, with 4 causal query tokens, 16 packed rows) with shuffled pages and NaN in every slot the
    kernel must not read."""
    from fmha.kernels import forward
    monkeypatch.setattr(forward, "_INTERPRET_TILES", tiles)
    seqlens = [300, 0, 17, 512]
    k_cache, v_cache, table, k, v = _cache(seqlens, 512, 2, 128, 128, torch.float8_e4m3fn if fp8 else torch.float16,
                                           "cpu", page_size, seed=(page_size or 0) + fp8)
    q = torch.randn(len(seqlens), seqlen_q, 8, 128, dtype=torch.float16)
    descales = _descales(len(seqlens), 2, "cpu") if fp8 else {}
    got, lse = fmha.attention_with_kvcache(q, k_cache, v_cache, torch.tensor(seqlens, dtype=torch.int32),
                                           block_table=table, num_splits=num_splits, causal=seqlen_q > 1,
                                           return_lse=True, **descales)
    assert_matches(got, lse, _oracle(q, k, v, seqlens, causal=seqlen_q > 1, **descales), torch.float16)


@pytest.mark.cpu
def test_gluon_cache_dispatch_rule(monkeypatch):
    """Which KV-cache calls the Hopper Gluon kernel takes (`forward._gluon_takes`) on a 132-SM GPU: chunks from 64
    query rows whose 128-row work items fill most of their waves, or any forced unsplit; never a forced split, nor
    pages of other than a multiple of 16 keys."""
    from fmha.kernels import forward
    monkeypatch.setattr(forward, "num_sms", lambda device: 132)
    lens = torch.zeros(4, dtype=torch.int32)
    takes = lambda splits, b, hq, sq: forward._gluon_takes(lens, splits, b, hq, sq, None)   # noqa: E731
    assert not takes(0, 4, 32, forward.GLUON_CACHE_MIN_ROWS - 1)      # decode, speculative decoding: portable
    assert takes(0, 4, 32, 64)                                        # 128 items, one wave 97% full
    assert not takes(0, 1, 32, 128)                                   # 32 items: the split path fills the GPU
    assert takes(1, 1, 32, 128)                                       # forced unsplit
    assert not takes(2, 4, 32, 512)                                   # forced split
    assert not takes(0, 1, 140, 64) and takes(0, 1, 140, 256)         # 140 items in two waves; 280 in three
    assert forward._gluon_takes(None, 1, 1, 1, 1, None) and not forward._gluon_takes(None, 2, 1, 1, 1, None)
    # Paged: pages of a multiple of 16 keys only; SGLang's one-key pages and the like stay portable.
    assert forward._gluon_takes(lens, 1, 4, 32, 256, None, 48)
    assert not any(forward._gluon_takes(lens, 1, 4, 32, 256, None, p) for p in (1, 8, 24))


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("page_size", [None, 16], ids=lambda p: f"page{p}" if p else "contiguous")
@pytest.mark.parametrize("seqlen_q,num_splits", [(1, 2), (1, 3), (4, 2), (1, 40)])
def test_split_merge_in_kernel(target, page_size, seqlen_q, num_splits, monkeypatch):
    """A split launch whose parts one round of `combine.merge_parts` holds merges them in the kernel (MERGE_PARTS:
    the last split of each block to finish; no `combine` launch), with a sink applied after the merge, and more
    parts go to `combine`: both against the oracle, NaN past every length. The kernel leaves the counters it
    used zeroed for the next launch on its stream (`launch.zeroed_counter`)."""
    from fmha.kernels import forward, launch
    monkeypatch.setattr(forward, "_PLANS", forward.Plans())
    monkeypatch.setattr(launch, "RECORD", [])
    device, dtype = target
    c = _case(target)
    k_cache, v_cache, table, k, v = _cache(c["seqlens"], c["capacity"], c["hk"], c["d"], c["d"], dtype, device,
                                           page_size, seed=num_splits)
    q = torch.randn(len(c["seqlens"]), seqlen_q, c["hq"], c["d"], device=device, dtype=dtype)
    seqlens = torch.tensor(c["seqlens"], dtype=torch.int32, device=device)
    options = dict(causal=seqlen_q > 1, sinks=torch.randn(c["hq"], device=device))
    for _ in range(2):            # the second call on the counters the first left
        got, lse = fmha.attention_with_kvcache(q, k_cache, v_cache, seqlens, block_table=table,
                                               num_splits=num_splits, return_lse=True, **options)
        assert_matches(got, lse, _oracle(q, k, v, c["seqlens"], **options), dtype)
    names = [name for name, _, meta in launch.RECORD]
    merged = [meta.get("MERGE_PARTS", 0) for name, _, meta in launch.RECORD if name == "attn_fwd_kernel"]
    assert len(merged) == 2 and merged[0] == merged[1]
    assert (merged[0] > 0) == (num_splits < 40) and ("combine_kernel" in names) == (num_splits == 40)
    if device == "cuda":
        assert all(not counter.any() for counter in launch._COUNTERS.values())


@pytest.mark.gpu
def test_split_merge_counter_grows(monkeypatch):
    """`launch.zeroed_counter` growing under queued work: on a fresh stream, a split launch of few blocks (a
    64-word buffer), one of more blocks than that holds (a larger buffer replaces it while the first launch may
    still be running), and the small one again, queued back to back with no synchronisation; each merged in the
    kernel and checked against the oracle, and the stream's counters zeroed at the end."""
    from fmha.kernels import forward, launch
    monkeypatch.setattr(forward, "_PLANS", forward.Plans())
    monkeypatch.setattr(launch, "RECORD", [])
    dtype, hk, cases = torch.bfloat16, 8, {}
    for batch in (2, 40):
        seqlens = [(1000 + 37 * i) % 2048 + 1 for i in range(batch)]
        k_cache, v_cache, table, k, v = _cache(seqlens, 2048, hk, 128, 128, dtype, "cuda", 16, seed=batch)
        q = torch.randn(batch, 1, 4 * hk, 128, device="cuda", dtype=dtype)
        cases[batch] = (q, k_cache, v_cache, torch.tensor(seqlens, dtype=torch.int32, device="cuda"), table,
                        _oracle(q, k, v, seqlens))
    calls = [cases[2], cases[40], cases[2]]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        outs = [fmha.attention_with_kvcache(q, kc, vc, lens, block_table=t, num_splits=3, return_lse=True)
                for q, kc, vc, lens, t, _ in calls]
    side.synchronize()
    for (got, lse), call in zip(outs, calls):
        assert_matches(got, lse, call[-1], dtype)
    words = [grid[0] * grid[1] for name, grid, meta in launch.RECORD if "MERGE_PARTS" in meta]
    assert len(words) == 3 and words[0] <= 64 < words[1]
    with torch.cuda.stream(side):
        counter = launch.zeroed_counter(calls[0][0].device, 1)      # the stream's buffer as it is, not regrown
    assert counter.numel() >= words[1] and not counter.any()
