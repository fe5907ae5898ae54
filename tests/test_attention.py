"""fmha.attention / fmha.attention_varlen against the fp32 oracle, with NaN-poisoned memory around every input."""
import math

import pytest
import torch

import fmha
from fmha.kernels.forward import attention_forward
from fmha.reference import attention_ref, attention_varlen_ref
from utils import (TARGETS, assert_close, assert_forward_only, assert_lse_close, assert_matches, paged_packed,
                   poisoned, spy)

# (batch, seqlen_q, seqlen_k, heads_q, heads_k, head_dim_qk, head_dim_v): small for the interpreter.
CPU_SHAPES = [
    (2, 50, 70, 4, 2, 64, 64),      # GQA, lengths off every tile
    (1, 70, 50, 4, 1, 64, 64),      # MQA, Sq > Sk: under causal the first rows see nothing
    (1, 1, 70, 8, 2, 128, 128),     # decode-like: Sq = 1, heads packed into the M tile
    (1, 33, 33, 2, 2, 40, 40),      # head_dim not a power of two
    (1, 16, 40, 3, 3, 8, 8),        # the smallest head_dim
    (1, 17, 45, 2, 1, 96, 64),      # dqk != dv, 96 = 64 + 32 split
    (1, 20, 40, 2, 2, 192, 128),    # DeepSeek prefill shape
    (1, 12, 40, 6, 2, 256, 256),
    (1, 9, 33, 2, 2, 512, 512),     # DeepSeek-V4 head_dim
    (1, 9, 40, 2, 1, 576, 512),     # MLA shape
]
GPU_SHAPES = [
    (2, 1000, 1500, 16, 4, 128, 128),
    (1, 2048, 2048, 8, 8, 128, 128),
    (4, 1, 4096, 32, 8, 128, 128),
    (2, 700, 900, 8, 1, 64, 64),
    (2, 513, 1027, 4, 4, 256, 256),
    (1, 333, 777, 4, 2, 96, 64),
    (1, 500, 800, 8, 8, 192, 128),
    (1, 64, 2000, 64, 1, 512, 512),
    (1, 130, 1500, 16, 1, 576, 512),
    (1, 200, 300, 2, 2, 8, 8),
]
MASKS = [
    dict(),
    dict(causal=True),
    dict(window=(8, 0)),
    dict(window=(5, 3)),
    dict(window=(-1, 4)),
]


def _shapes(target):
    return CPU_SHAPES if target[0] == "cpu" else GPU_SHAPES


def _dense_inputs(shape, dtype, device):
    b, sq, sk, hq, hk, dqk, dv = shape
    q = poisoned((b, sq, hq, dqk), sq, dtype, device)
    k = poisoned((b, sk, hk, dqk), sk, dtype, device)
    v = poisoned((b, sk, hk, dv), sk, dtype, device)
    return q, k, v


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("mask", MASKS, ids=lambda m: "-".join(f"{k}{v}" for k, v in m.items()) or "full")
@pytest.mark.parametrize("shape_index", range(len(CPU_SHAPES)))
def test_dense(target, mask, shape_index):
    device, dtype = target
    torch.manual_seed(shape_index)
    shape = _shapes(target)[shape_index]
    q, k, v = _dense_inputs(shape, dtype, device)
    out = torch.full((*q.shape[:-1], v.shape[-1]), float("nan"), dtype=dtype, device=device)
    got, lse = fmha.attention(q, k, v, return_lse=True, out=out, **mask)
    assert got is out
    assert_matches(got, lse, attention_ref(q, k, v, **mask), dtype)


OPTIONS = [
    dict(softcap=5.0),
    dict(alibi_slopes=True),
    dict(sinks=True),
    dict(softcap=8.0, alibi_slopes=True, sinks=True, causal=True),
    dict(softmax_scale=0.3, window=(6, 2), sinks=True),
]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: "-".join(o))
@pytest.mark.parametrize("shape_index", [0, 2, 5])
def test_options(target, options, shape_index):
    device, dtype = target
    torch.manual_seed(100 + shape_index)
    shape = _shapes(target)[shape_index]
    q, k, v = _dense_inputs(shape, dtype, device)
    hq = shape[3]
    options = dict(options)
    if options.get("alibi_slopes"):
        options["alibi_slopes"] = torch.rand(hq, device=device) * 0.5
    if options.get("sinks"):
        options["sinks"] = torch.randn(hq, device=device) * 2
    got, lse = fmha.attention(q, k, v, return_lse=True, **options)
    assert_matches(got, lse, attention_ref(q, k, v, **options), dtype)


@pytest.mark.parametrize("target", TARGETS)
def test_sink_limits(target, monkeypatch):
    """+inf sink → output 0; -inf sink → no effect; LSE excludes the sink either way. Compared bit for bit,
    so every call runs the same (portable) kernel: on Hopper a call without sinks would take the Gluon one."""
    monkeypatch.setenv("FMHA_GLUON", "0")
    device, dtype = target
    q, k, v = _dense_inputs(_shapes(target)[0], dtype, device)
    hq = q.shape[2]
    plain, plain_lse = fmha.attention(q, k, v, return_lse=True)
    inf_sink = torch.full((hq,), math.inf, device=device)
    got, lse = fmha.attention(q, k, v, return_lse=True, sinks=inf_sink)
    assert torch.equal(got, torch.zeros_like(got)) and torch.equal(lse, plain_lse)
    got = fmha.attention(q, k, v, sinks=-inf_sink)
    assert torch.equal(got, plain)


def _varlen_lengths(target):
    if target[0] == "cpu":
        return [37, 0, 5, 64, 1], [50, 3, 0, 64, 19]
    return [1000, 0, 17, 2048, 1, 513], [1500, 31, 0, 2048, 700, 513]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("mask", MASKS[:4], ids=lambda m: "-".join(f"{k}{v}" for k, v in m.items()) or "full")
@pytest.mark.parametrize("heads,dims", [((4, 2), (64, 64)), ((6, 1), (96, 64)), ((2, 2), (576, 512))],
                         ids=["gqa-64", "mqa-96-64", "mla-576"])
def test_varlen(target, mask, heads, dims):
    device, dtype = target
    torch.manual_seed(7)
    len_q, len_k = _varlen_lengths(target)
    hq, hk = heads
    dqk, dv = dims
    cu_q = torch.tensor([0] + list(torch.tensor(len_q).cumsum(0)), dtype=torch.int32, device=device)
    cu_k = torch.tensor([0] + list(torch.tensor(len_k).cumsum(0)), dtype=torch.int32, device=device)
    tq, tk = int(cu_q[-1]), int(cu_k[-1])
    q = poisoned((tq, hq, dqk), tq, dtype, device, dim=0)
    k = poisoned((tk, hk, dqk), tk, dtype, device, dim=0)
    v = poisoned((tk, hk, dv), tk, dtype, device, dim=0)
    got, lse = fmha.attention_varlen(q, k, v, cu_q, cu_k, max(len_q), max(len_k), return_lse=True, **mask)
    assert_matches(got, lse, attention_varlen_ref(q, k, v, cu_q, cu_k, **mask), dtype)


def _varlen_kv_inputs(target, form, mask):
    """Packed queries and keys in `form` (`test_varlen_kv_forms`), NaN in every key slot past each count: (q, k, v,
    cu_seqlens_q, cu_seqlens_k or None, the longest query and key counts, the call's other arguments, the oracle's
    (out, lse)), all on the CPU."""
    device, dtype = target
    g = torch.Generator().manual_seed(len(form))
    len_q, len_k = _varlen_lengths(target)
    used = [min(n, max(m, 1) + 4) if form == "packed-seqused" else n for n, m in zip(len_k, len_q)]
    used[0] = len_k[0] // 2 if form == "packed-seqused" else used[0]
    b, hq, hk, d = len(len_q), 4, 2, 64
    cu_q = torch.tensor([0] + list(torch.tensor(len_q).cumsum(0)), dtype=torch.int32)
    cu_k = torch.tensor([0] + list(torch.tensor(len_k).cumsum(0)), dtype=torch.int32)
    q = torch.randn(int(cu_q[-1]), hq, d, generator=g).to(dtype)
    k_used, v_used = (torch.randn(sum(used), hk, d, generator=g) for _ in range(2))
    kv_dtype = torch.float8_e4m3fn if form == "paged-fp8" else dtype
    k_used, v_used = k_used.to(kv_dtype), v_used.to(kv_dtype)
    cu_used = torch.tensor([0] + list(torch.tensor(used).cumsum(0)), dtype=torch.int32)
    options = dict(mask)
    if form == "paged-fp8":
        options.update(k_descale=torch.rand(b, hk) + 0.5, v_descale=torch.rand(b, hk) + 0.5)
    call = dict(seqused_k=torch.tensor(used, dtype=torch.int32))
    if form == "packed-seqused":               # each sequence's keys, its used ones first, the rest NaN
        k = torch.full((int(cu_k[-1]) + 3, hk, d), math.nan).to(kv_dtype)
        v = k.clone()
        for i, n in enumerate(used):
            k[cu_k[i]:cu_k[i] + n], v[cu_k[i]:cu_k[i] + n] = k_used[cu_used[i]:cu_used[i + 1]], \
                v_used[cu_used[i]:cu_used[i + 1]]
        cu_arg = cu_k
    else:
        pages = -(-max(used) // 16)
        k, v, table = paged_packed(16, k_used, v_used, cu_used, perm=torch.randperm(b * pages, generator=g))
        call["block_table"] = table
        cu_arg = None
        if form == "paged-cu":
            cu_arg = cu_used
            del call["seqused_k"]
    ref = attention_varlen_ref(q, k_used, v_used, cu_q, cu_used, **options)
    return q, k, v, cu_q, cu_arg, max(len_q), max(used), {**call, **options}, ref


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("mask", [dict(causal=True), dict(), dict(window=(8, 0))], ids=["causal", "full", "window"])
@pytest.mark.parametrize("form", ["paged-seqused", "paged-cu", "packed-seqused", "paged-fp8"])
def test_varlen_kv_forms(target, mask, form):
    """FlashAttention's varlen keys in other forms (vLLM's call for a batch mixing prefills and decodes): a paged
    cache (`block_table`, 16-key pages, shuffled) with each sequence's key count from `seqused_k` or from
    `cu_seqlens_k`, an FP8 one, and packed keys of which each sequence uses its first `seqused_k`. NaN in every
    key slot past each count. Against the varlen oracle on each sequence's used keys. (On the GPU the paged 16-bit
    forms take the Gluon kernel for the sequences of over `forward._short_tiles`' rows and the portable one for the
    others.)"""
    device, dtype = target
    q, k, v, cu_q, cu_k, max_q, max_k, call, ref = _varlen_kv_inputs(target, form, mask)
    to = lambda t: t.to(device) if isinstance(t, torch.Tensor) else t      # noqa: E731
    got, lse = fmha.attention_varlen(to(q), to(k), to(v), to(cu_q), to(cu_k), max_q, max_k, return_lse=True,
                                     **{n: to(t) for n, t in call.items()})
    assert_matches(got, lse, tuple(t.to(device) for t in ref), dtype)


def _assert_sequences(out, lse, cu_q, mine, ref, dtype):
    """Packed output and LSE rows against the oracle's `ref` (out, lse; on the CPU) for the sequences a launch runs
    (`mine`), still NaN for the others."""
    for i, run in enumerate(mine):
        rows = slice(int(cu_q[i]), int(cu_q[i + 1]))
        if run:
            assert_matches(out[rows], lse[:, rows], (ref[0][rows].to(out.device), ref[1][:, rows].to(out.device)),
                           dtype)
        else:
            assert out[rows].isnan().all() and lse[:, rows].isnan().all(), f"sequence {i} was written"


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("kernel", ["portable", "portable-split", "split", "gluon"])
def test_varlen_cache_short_sequences(target, kernel):
    """The two launches of a varlen call over a paged cache (`attention_forward`'s short sequences), each alone:
    the portable kernel with `short_rows` = n runs exactly the sequences of at most n query rows (GQA heads packed;
    its keys split as planned, or in 3 with their merge, `combine`'s packed rows), the Gluon kernel with
    `short_rows` = n (its MIN_ROWS) exactly the others. The ones a launch runs match the oracle; the others' output
    and LSE rows stay NaN. And the portable kernel alone over every sequence, keys in 3 splits (`split`). The split
    forms with a window, ALiBi and sinks (the merge applies the sinks)."""
    device, dtype = target
    if kernel == "gluon":
        from fmha.kernels import forward_sm90
        from fmha.kernels.sm90 import capability, gluon_enabled
        if device == "cpu" or not gluon_enabled() or capability(torch.cuda.current_device()) != (9, 0):
            pytest.skip("the Gluon kernel runs on Hopper only")
    options = dict(causal=True)
    if kernel.endswith("split"):
        g = torch.Generator().manual_seed(5)
        options = dict(window=(20, 0), sinks=torch.randn(4, generator=g), alibi_slopes=torch.rand(4, generator=g))
    q, k, v, cu_q, _, max_q, max_k, call, (ref, ref_lse) = _varlen_kv_inputs(target, "paged-seqused", options)
    lens = (cu_q[1:] - cu_q[:-1]).tolist()
    short = sorted(lens)[(len(lens) - 1) // 2]   # the middle length: sequences on both sides of it
    mine = [kernel == "split" or (n <= short) == (kernel != "gluon") for n in lens]
    assert any(mine) and (kernel == "split" or not all(mine))
    call = {n: t.to(device) for n, t in call.items() if isinstance(t, torch.Tensor)}
    q, k, v, cu_q, seqlens, table = (t.to(device) for t in (q, k, v, cu_q, call["seqused_k"], call["block_table"]))
    out = torch.full_like(q, math.nan)
    lse = torch.full((q.shape[1], q.shape[0]), math.nan, device=device)
    if kernel != "gluon":
        attention_forward(q, k, v, out, lse, cu_seqlens_q=cu_q, cu_seqlens_k=None, max_seqlen_q=max_q,
                          max_seqlen_k=max_k, softmax_scale=None, window=options.get("window", (-1, 0)), softcap=0.0,
                          alibi_slopes=call.get("alibi_slopes"), sinks=call.get("sinks"), cache_seqlens=seqlens,
                          block_table=table, interpret=device == "cpu",
                          short_rows=0 if kernel == "split" else short, num_splits=1 if kernel == "portable" else 3)
    else:
        assert forward_sm90.attention_forward_sm90(q, k, v, out, lse, causal=True, softmax_scale=q.shape[-1] ** -0.5,
                                                   varlen=(cu_q, None, max_q, max_k), cache=(seqlens, table, None),
                                                   short_rows=short)
    _assert_sequences(out, lse, cu_q, mine, (ref, ref_lse), dtype)


def _packed_over_pages(len_q, len_k, hq, hk, d, dtype, seed):
    """Packed queries of `len_q` rows over a 16-key paged cache of `len_k` keys a sequence (pages shuffled, NaN past
    each count), on the CPU: (q, cu_seqlens_q, k_cache, v_cache, block_table, the causal oracle's (out, lse))."""
    g = torch.Generator().manual_seed(seed)
    cu_q, cu_k = (torch.tensor([0] + list(torch.tensor(n).cumsum(0)), dtype=torch.int32) for n in (len_q, len_k))
    q = torch.randn(int(cu_q[-1]), hq, d, generator=g).to(dtype)
    k, v = (torch.randn(int(cu_k[-1]), hk, d, generator=g).to(dtype) for _ in range(2))
    pages = -(-max(len_k) // 16)
    k_cache, v_cache, table = paged_packed(16, k, v, cu_k, perm=torch.randperm(len(len_q) * pages, generator=g))
    return q, cu_q, k_cache, v_cache, table, attention_varlen_ref(q, k, v, cu_q, cu_k, causal=True)


def _forward_over_pages(case, len_q, len_k, device, monkeypatch, **options):
    """`attention_forward` over `_packed_over_pages`' `case` (causal, on `device`) into NaN-filled output and LSE:
    (out, lse, the launches it recorded: (name, grid, meta) each)."""
    from fmha.kernels import launch
    q, cu_q, k_cache, v_cache, table, _ = case
    out = torch.full_like(q, math.nan, device=device)
    lse = torch.full((q.shape[1], q.shape[0]), math.nan, device=device)
    monkeypatch.setattr(launch, "RECORD", [])
    attention_forward(q.to(device), k_cache.to(device), v_cache.to(device), out, lse, cu_seqlens_q=cu_q.to(device),
                      cu_seqlens_k=None, max_seqlen_q=max(len_q), max_seqlen_k=max(len_k), softmax_scale=None,
                      window=(-1, 0), softcap=0.0, alibi_slopes=None, sinks=None,
                      cache_seqlens=torch.tensor(len_k, dtype=torch.int32, device=device),
                      block_table=table.to(device), interpret=device == "cpu", **options)
    return out, lse, launch.RECORD


def _cpu_short_forms(monkeypatch):
    """On the CPU, the interpreter's one tile table patched to short forms of 16 and 64 rows."""
    from fmha.kernels import forward
    real = forward._tile_config
    monkeypatch.setattr(forward, "_tile_config", lambda *a, rows=None, **kw: real(*a, rows=rows, **kw)
                        if rows is None else ((16, 32, 4, 1) if rows <= forward.NARROW_ROWS else (64, 32, 4, 1)))


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("short_tile_rows,tall", [(64, False), (128, True), (512, False), (512, True)],
                         ids=["two-forms", "three-forms", "capped", "capped-three-forms"])
def test_varlen_cache_short_forms(target, short_tile_rows, tall, monkeypatch):
    """The short launch's tile forms (`forward._short_tiles`: decodes of at most NARROW_ROWS packed rows in the
    narrow tile, longer short sequences, speculative decodes, in the wide form's tile of DECODE_ROWS rows, several
    for more) and the kernel's loop over its forms (WIDE) with a third of 128 rows added (`tall`; measured, not in
    the tables: `probe_varlen_paged --wide` runs it so): 8 query heads over 2 KV heads, d = 128, a 16-key paged
    cache, sequences of 0 to 65 rows with keys in 3 splits or as planned, with SHORT_TILE_ROWS giving one M block
    (two forms, or three), or the cap of DECODE_ROWS rows (four M blocks of 64 rows, or two of 128). Each short
    sequence matches the oracle, the longer ones' rows stay NaN; the launch has the forms and its M blocks. On the
    CPU the interpreter's one tile table is patched to forms of 16 and 64 rows."""
    from fmha.kernels import forward
    device, dtype = target
    if device == "cpu":
        _cpu_short_forms(monkeypatch)
    hq, hk, d = 8, 2, 128
    group = hq // hk
    if tall:
        real_short, form = forward._short_tiles, (128, 32, 4, 1 if device == "cpu" else 4)

        def with_tall(*a, **kw):
            rows, tiles, wide = real_short(*a, **kw)
            return rows, tiles, (wide + (form,) if wide and rows * group > wide[-1][0] else wide)
        monkeypatch.setattr(forward, "_short_tiles", with_tall)
    monkeypatch.setattr(forward, "SHORT_TILE_ROWS", short_tile_rows)
    short, tiles, wide = forward._short_tiles(d, d, group, True, device == "cpu")
    assert short == min(short_tile_rows // group, forward.DECODE_ROWS)
    assert [m for m, *_ in wide] == [forward.DECODE_ROWS] + [128] * (tall and short * group > forward.DECODE_ROWS)
    assert tiles[0] == forward.NARROW_ROWS
    len_q = [1, 0, 3, short, 2, 5, short + 1, 9, 40, 1, 4, forward.DECODE_ROWS // group]
    len_k = [70, 33, 0, 90, 17, 64, 50, 200, 45, 1, 130, 77]
    case = _packed_over_pages(len_q, len_k, hq, hk, d, dtype, 11)
    for num_splits in (3, 0):
        out, lse, record = _forward_over_pages(case, len_q, len_k, device, monkeypatch, short_rows=short,
                                               num_splits=num_splits)
        assert [(meta["BLOCK_M"], [form[0] for form in meta["WIDE"]], grid[1]) for name, grid, meta in record
                if name == "attn_fwd_kernel"] == [(tiles[0], [m for m, *_ in wide], -(-short * group // wide[-1][0]))]
        _assert_sequences(out, lse, case[1], [n <= short for n in len_q], case[-1], dtype)


@pytest.mark.cpu
@pytest.mark.parametrize("heads", [(8, 2), (6, 2)], ids=["group4", "group3"])
def test_varlen_cache_routing(heads, monkeypatch):
    """The host side of a routed varlen call over a paged cache, on the CPU: the Gluon launch (a stand-in here, which
    writes nothing) is told to leave out the sequences of at most `_short_tiles`' rows (half as many in an even GQA
    group, whose tails of at most 64 rows the Gluon kernel pairs: `forward_sm90.pairs_tails`), and the portable
    launch after it runs exactly those, in `_short_tiles`' two forms (the GPU's tile tables, run by the
    interpreter): each matches the oracle, the others' rows stay NaN."""
    from fmha.kernels import forward, forward_sm90, launch
    left_out = []
    monkeypatch.setattr(forward, "gluon_enabled", lambda: True)
    monkeypatch.setattr(forward, "_gluon_takes", lambda *a, **kw: True)
    monkeypatch.setattr(forward_sm90, "attention_forward_sm90", lambda *a, short_rows=0, **kw: left_out.append(
        short_rows) or True)
    monkeypatch.setattr(launch, "RECORD", [])
    (hq, hk), d = heads, 128
    paired = hq // hk % 2 == 0
    assert forward_sm90.pairs_tails(d, d, hq // hk, (-1, 0), 128, 0.0, True) == paired
    short, tiles, wide = forward._short_tiles(d, d, hq // hk, True, False, paired=paired)
    assert short == forward.DECODE_ROWS // (2 if paired else 1)
    len_q, len_k = [1, 0, 3, short, 2, short + 1, 9, 1], [70, 33, 0, 90, 17, 64, 50, 1]
    q, cu_q, k_cache, v_cache, table, ref = _packed_over_pages(len_q, len_k, hq, hk, d, torch.float16, 3)
    out = torch.full_like(q, math.nan)
    lse = torch.full((hq, q.shape[0]), math.nan)
    attention_forward(q, k_cache, v_cache, out, lse, cu_seqlens_q=cu_q, cu_seqlens_k=None, max_seqlen_q=max(len_q),
                      max_seqlen_k=max(len_k), softmax_scale=None, window=(-1, 0), softcap=0.0, alibi_slopes=None,
                      sinks=None, cache_seqlens=torch.tensor(len_k, dtype=torch.int32), block_table=table)
    assert left_out == [short]
    assert [(meta["BLOCK_M"], meta.get("WIDE")) for name, _, meta in launch.RECORD
            if name == "attn_fwd_kernel"] == [(tiles[0], wide and tuple((m, n, s, forward._page_tile(16, n))
                                                                         for m, n, _, s in wide))]
    _assert_sequences(out, lse, cu_q, [n <= short for n in len_q], ref, torch.float16)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("lengths", ["mixed", "even", "long"])
@pytest.mark.parametrize("short_alone", [True, False], ids=["short-alone", "prefill-tiles"])
def test_varlen_cache_short_alone(target, lengths, short_alone, monkeypatch):
    """A varlen call over a paged cache that the Gluon kernel does not take (its longest sequence under
    GLUON_CACHE_MIN_ROWS), whose longest sequence holds more packed rows than the decode tiles but fits the short
    launch's forms (`forward.SHORT_ALONE`): sequences of mixed lengths (decodes among them), one launch of the short
    forms over every sequence, in M blocks of the wide form (SHORT_ONLY, the narrow tile first); sequences of about
    one length (their mean rows over SHORT_ALONE_MEAN of the longest's), long ones (mixed, but over
    SHORT_ALONE_PACKED packed rows on average), or with SHORT_ALONE off, one prefill-sized tile a sequence. 8 query
    heads over 2 KV heads, d = 128, sequences of 0 to 63 rows, keys as planned; every row matches the oracle. On the
    CPU the interpreter's tile table is patched to forms of 16 and 64 rows."""
    from fmha.kernels import forward
    device, dtype = target
    if device == "cpu":
        _cpu_short_forms(monkeypatch)
    monkeypatch.setattr(forward, "SHORT_ALONE", short_alone)
    hq, hk, d = 8, 2, 128
    len_q = {"mixed": [1, 0, 3, 1, 40, 2, 17, 1, 1], "even": [40, 33, 39, 40, 37, 40, 36, 40, 38],
             "long": [63, 41, 42, 63, 40, 42, 41, 43, 44]}[lengths]
    len_k = [70, 33, 0, 90, 117, 64, 50, 200, 1]
    assert forward.DECODE_ROWS < max(len_q) * hq // hk <= forward._short_cap(hq // hk) * hq // hk
    assert ((sum(len_q) <= forward.SHORT_ALONE_MEAN * len(len_q) * max(len_q),
             sum(len_q) * hq // hk <= forward.SHORT_ALONE_PACKED * len(len_q))
            == {"mixed": (True, True), "even": (False, True), "long": (True, False)}[lengths])
    assert max(len_q) < forward.GLUON_CACHE_MIN_ROWS
    case = _packed_over_pages(len_q, len_k, hq, hk, d, dtype, 13)
    out, lse, record = _forward_over_pages(case, len_q, len_k, device, monkeypatch)
    kernels = [(grid, meta) for name, grid, meta in record if name == "attn_fwd_kernel"]
    assert len(kernels) == 1
    grid, meta = kernels[0]
    if short_alone and lengths == "mixed":
        _, tiles, wide = forward._short_tiles(d, d, hq // hk, True, device == "cpu", max(len_q))
        assert meta.get("SHORT_ONLY") and meta["BLOCK_M"] == tiles[0] == forward.NARROW_ROWS
        assert grid[1] == -(-max(len_q) * hq // hk // wide[-1][0])
    else:
        assert not meta.get("SHORT_ONLY") and meta["BLOCK_M"] > forward.NARROW_ROWS
    _assert_sequences(out, lse, case[1], [True] * len(len_q), case[-1], dtype)


@pytest.mark.gpu
def test_varlen_cache_side_stream(monkeypatch):
    """A routed varlen call over a paged cache, decodes beside two chunks, runs its Gluon launch on the device's
    second stream (`forward._side_stream`) and its short launch on the caller's, and joins them: called on a stream
    of the test's own while the second stream is held busy (`torch.cuda._sleep`) and read back on the caller's
    stream at once, then captured in a CUDA graph (which refuses a fork left unjoined) and replayed over NaN. Every
    row matches the oracle each time; with SIDE_STREAM off, both launches on the caller's stream."""
    from fmha.kernels import forward, forward_sm90
    from fmha.kernels.sm90 import capability, gluon_enabled
    if not gluon_enabled() or capability(torch.cuda.current_device()) != (9, 0):
        pytest.skip("the Gluon kernel runs on Hopper only")
    gluon_call, streams = forward_sm90.attention_forward_sm90, []

    def gluon_recorded(*a, **kw):
        streams.append(torch.cuda.current_stream())
        return gluon_call(*a, **kw)
    monkeypatch.setattr(forward_sm90, "attention_forward_sm90", gluon_recorded)
    len_q, len_k = [1] * 12 + [300, 3, 1, 130], [700] * 12 + [900, 64, 2000, 1300]
    q, cu_q, k_cache, v_cache, table, (ref, ref_lse) = _packed_over_pages(len_q, len_k, 8, 2, 128, torch.bfloat16, 9)
    q, cu_q, k_cache, v_cache, table = (t.cuda() for t in (q, cu_q, k_cache, v_cache, table))
    used = torch.tensor(len_k, dtype=torch.int32, device="cuda")
    out = torch.full_like(q, math.nan)

    def call():
        return fmha.attention_varlen(q, k_cache, v_cache, cu_q, None, max(len_q), max(len_k), causal=True,
                                     seqused_k=used, block_table=table, out=out, return_lse=True)[1]
    caller = torch.cuda.Stream()
    caller.wait_stream(torch.cuda.current_stream())
    for side_stream in (True, False):
        monkeypatch.setattr(forward, "SIDE_STREAM", side_stream)
        streams.clear()
        with torch.cuda.stream(caller):
            out.fill_(math.nan)
            side = forward._side_stream(q.device).stream
            with torch.cuda.stream(side):
                torch.cuda._sleep(20_000_000)       # ~10 ms: a missing join would read NaN below
            lse = call()
            got = out.cpu(), lse.cpu()
        assert streams == [side if side_stream else caller]
        assert_matches(*got, (ref, ref_lse), torch.bfloat16)
    monkeypatch.setattr(forward, "SIDE_STREAM", True)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        lse = call()
    for _ in range(2):
        out.fill_(math.nan)
        lse.fill_(math.nan)
        graph.replay()
        torch.cuda.synchronize()
        assert_matches(out, lse, (ref.cuda(), ref_lse.cuda()), torch.bfloat16)


@pytest.mark.cpu
def test_pairs_tails_rule():
    """`forward_sm90.pairs_tails`, which halves the short launch's rows a head: only an even GQA group on tiles of two
    consumer warpgroups pairs tails; d = 64's long unmasked calls take three (`_WIDE_TILES`), except with a softcap
    or a left window bound shorter than the wide rows; a padded head dim (96 as 128) and d = 192 / 128 take two."""
    from fmha.kernels.forward_sm90 import WIDE_MIN_ROWS, pairs_tails
    long = WIDE_MIN_ROWS
    assert pairs_tails(128, 128, 4, (-1, 0), 512, 0.0, True)
    assert pairs_tails(128, 128, 2, (-1, -1), long, 0.0, False)
    assert not pairs_tails(128, 128, 3, (-1, 0), 512, 0.0, True)
    assert not pairs_tails(128, 128, 1, (-1, 0), 512, 0.0, True)
    assert pairs_tails(64, 64, 4, (-1, -1), long // 2, 0.0, True)
    assert not pairs_tails(64, 64, 4, (-1, -1), long, 0.0, True)
    assert pairs_tails(64, 64, 4, (-1, -1), long, 30.0, True)
    assert pairs_tails(64, 64, 4, (128, 0), long, 0.0, True)
    assert pairs_tails(96, 96, 8, (-1, 0), 512, 0.0, True)
    assert pairs_tails(192, 128, 2, (-1, 0), 512, 0.0, True)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("right", [0, 3], ids=["causal", "right3"])
def test_window_per_sequence(target, right):
    """A (batch,) int32 tensor of left bounds: each sequence its own sliding window, negative = unbounded,
    in varlen and dense calls; a bad tensor raises naming `window`."""
    device, dtype = target
    torch.manual_seed(11)
    len_q, len_k = _varlen_lengths(target)
    lefts = torch.tensor([3, -1, 0, 17, -5, 200][:len(len_q)], dtype=torch.int32, device=device)
    cu_q = torch.tensor([0] + list(torch.tensor(len_q).cumsum(0)), dtype=torch.int32, device=device)
    cu_k = torch.tensor([0] + list(torch.tensor(len_k).cumsum(0)), dtype=torch.int32, device=device)
    tq, tk = int(cu_q[-1]), int(cu_k[-1])
    q = poisoned((tq, 4, 64), tq, dtype, device, dim=0)
    k = poisoned((tk, 2, 64), tk, dtype, device, dim=0)
    v = poisoned((tk, 2, 64), tk, dtype, device, dim=0)
    got, lse = fmha.attention_varlen(q, k, v, cu_q, cu_k, max(len_q), max(len_k), window=(lefts, right),
                                     return_lse=True)
    assert_matches(got, lse, attention_varlen_ref(q, k, v, cu_q, cu_k, window=(lefts, right)), dtype)
    b, sq, sk = 3, (40 if device == "cpu" else 700), (70 if device == "cpu" else 2000)
    qd = torch.randn(b, sq, 4, 64, device=device, dtype=dtype)
    kd = torch.randn(b, sk, 2, 64, device=device, dtype=dtype)
    vd = torch.randn(b, sk, 2, 64, device=device, dtype=dtype)
    dense_lefts = lefts[:b].flip(0).contiguous()
    got, lse = fmha.attention(qd, kd, vd, window=(dense_lefts, right), return_lse=True)
    assert_matches(got, lse, attention_ref(qd, kd, vd, window=(dense_lefts, right)), dtype)
    with pytest.raises(ValueError, match="window"):
        fmha.attention(qd, kd, vd, window=(dense_lefts[:2], right))
    with pytest.raises(ValueError, match="window"):
        fmha.attention(qd, kd, vd, window=(dense_lefts.long(), right))


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("pack_gqa", [False, True])
@pytest.mark.parametrize("use_tma", [False, True])
def test_kernel_variants(target, pack_gqa, use_tma):
    """Both K/V load paths (pointers, TMA descriptors) and both head layouts (packed GQA or not)."""
    device, dtype = target
    torch.manual_seed(3)
    b, sq, sk, hq, hk, d = (2, 21, 77, 6, 2, 64) if device == "cpu" else (2, 300, 2000, 16, 2, 128)
    q, k, v = _dense_inputs((b, sq, sk, hq, hk, d, d), dtype, device)
    for mask in MASKS[:3]:
        out = torch.full_like(q, float("nan"))
        lse = torch.full((b, hq, sq), float("nan"), device=device)
        left, right = mask.get("window", (-1, -1))
        if mask.get("causal"):
            right = 0
        attention_forward(q, k, v, out, lse, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=sq,
                          max_seqlen_k=sk, softmax_scale=None, window=(left, right), softcap=0.0,
                          alibi_slopes=None, sinks=None, pack_gqa=pack_gqa, use_tma=use_tma,
                          interpret=device == "cpu")
        assert_matches(out, lse, attention_ref(q, k, v, **mask), dtype)


@pytest.mark.parametrize("target", TARGETS)
def test_edge_lengths(target):
    """Sk = 0 (every row: 0 and -inf), Sq = 0 (empty results, as the oracle's), Sq = Sk = 1, and a window that hides
    every key from some rows."""
    device, dtype = target
    q, k, v = _dense_inputs((2, 5, 0, 4, 2, 64, 64), dtype, device)
    out, lse = fmha.attention(q, k, v, return_lse=True)
    assert torch.equal(out, torch.zeros_like(out)) and torch.isneginf(lse).all()
    q, k, v = _dense_inputs((2, 0, 7, 4, 2, 64, 32), dtype, device)
    out, lse = fmha.attention(q, k, v, return_lse=True, causal=True)
    ref, ref_lse = attention_ref(q, k, v, causal=True)
    assert out.shape == ref.shape == (2, 0, 4, 32) and lse.shape == ref_lse.shape == (2, 4, 0)
    q, k, v = _dense_inputs((3, 1, 1, 2, 1, 32, 32), dtype, device)
    out, lse = fmha.attention(q, k, v, return_lse=True, causal=True)
    assert_close("out", out, v.float().repeat_interleave(2, dim=2), dtype)
    q, k, v = _dense_inputs((1, 40, 20, 2, 2, 64, 64), dtype, device)
    out, lse = fmha.attention(q, k, v, return_lse=True, window=(0, 0))
    ref, ref_lse = attention_ref(q, k, v, window=(0, 0))
    assert torch.isneginf(ref_lse).any()
    assert_close("out", out, ref, dtype)
    assert_lse_close(lse, ref_lse)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_out_past_2g_elements(target, causal):
    """`out` whose last batch starts 2^31 elements in (a batch stride of 2^30 in a 4 GiB buffer, only the view's
    rows ever touched): every kernel's output offsets must be 64-bit, since each stride alone fits int32 and their
    product wraps (on the GPU this is the Hopper prefill kernel's epilogue)."""
    device, dtype = target
    torch.manual_seed(5)
    b, sq, h, d = 3, 100 if device == "cpu" else 700, 2, 64
    q, k, v = (torch.randn(b, sq, h, d, dtype=dtype, device=device) for _ in range(3))
    stride_b = 1 << 30
    buf = torch.empty((b - 1) * stride_b + sq * h * d, dtype=dtype, device=device)
    out = buf.as_strided((b, sq, h, d), (stride_b, h * d, d, 1))
    out.fill_(float("nan"))
    got, lse = fmha.attention(q, k, v, causal=causal, return_lse=True, out=out)
    assert got.data_ptr() == out.data_ptr()
    assert_matches(got, lse, attention_ref(q, k, v, causal=causal), dtype)
    if device == "cuda":
        from fmha.kernels import forward_sm90
        if forward_sm90.supported(q, k, v):       # the Hopper kernel took it, with 64-bit offsets
            meta = forward_sm90.launch_args(q, k, v, out, lse, causal=causal, softmax_scale=d ** -0.5)[2]
            assert meta["OFFSETS_64"]
            assert not forward_sm90.launch_args(q, k, v, torch.empty_like(q), lse, causal=causal,
                                                softmax_scale=d ** -0.5)[2]["OFFSETS_64"]
    del got, out, buf


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_tensors_on_another_device(monkeypatch):
    """Every kernel-launching op called with its tensors on cuda:1 while cuda:0 is current (a model split over GPUs
    in one process): prefill (Hopper kernel), a split paged decode (its combine), a decode over an FP8 cache (the
    Gluon FP8 decode, 64 packed rows), MLA decode and the sparse prefill all run on cuda:1, match the oracle, and
    leave cuda:0 current."""
    import fmha.mla as flash_mla
    from fmha.kernels import fp8_decode_sm90
    from fmha.reference import mla_decode_ref, mla_sparse_prefill_ref
    from test_kvcache import _cache, _descales, _oracle

    dev, dtype = torch.device("cuda:1"), torch.bfloat16
    torch.cuda.set_device(0)
    torch.manual_seed(3)
    q, k, v = _dense_inputs((2, 700, 900, 8, 2, 128, 128), dtype, dev)
    got, lse = fmha.attention(q, k, v, causal=True, return_lse=True)
    assert got.device == dev
    assert_matches(got, lse, attention_ref(q, k, v, causal=True), dtype)

    pages = torch.randperm(40, device=dev)[:32].view(4, 8).to(torch.int32)
    k_cache, v_cache = (torch.randn(40, 64, 2, 128, device=dev, dtype=dtype) for _ in range(2))
    seqlens = torch.tensor([512, 1, 300, 0], dtype=torch.int32, device=dev)
    q1 = torch.randn(4, 1, 8, 128, device=dev, dtype=dtype)
    got, lse = fmha.attention_with_kvcache(q1, k_cache, v_cache, seqlens, block_table=pages, num_splits=3,
                                           return_lse=True)
    for i, n in enumerate(seqlens.tolist()):
        rows = pages[i].long()
        k_i, v_i = (c[rows].flatten(0, 1)[None, :n] for c in (k_cache, v_cache))
        assert_matches(got[i:i + 1], lse[i:i + 1], attention_ref(q1[i:i + 1], k_i, v_i), dtype)

    calls = spy(monkeypatch, fp8_decode_sm90, "fp8_decode_forward_sm90")
    fp8_lens = [300, 0, 65]
    k_fp8, v_fp8, fp8_table, k_ref, v_ref = _cache(fp8_lens, 512, 2, 128, 128, torch.float8_e4m3fn, dev, 64, seed=5)
    q_fp8 = torch.randn(3, 1, 128, 128, device=dev, dtype=dtype)
    descales = _descales(3, 2, dev)
    got, lse = fmha.attention_with_kvcache(q_fp8, k_fp8, v_fp8, torch.tensor(fp8_lens, dtype=torch.int32, device=dev),
                                           block_table=fp8_table, return_lse=True, **descales)
    assert calls == [1] and got.device == dev
    assert_matches(got, lse, _oracle(q_fp8, k_ref, v_ref, fp8_lens, **descales), dtype)

    cache = torch.randn(40, 64, 1, 576, device=dev, dtype=dtype)
    q2 = torch.randn(4, 2, 64, 576, device=dev, dtype=dtype)
    meta, splits = flash_mla.get_mla_metadata(seqlens, 128, 1)
    out, lse = flash_mla.flash_mla_with_kvcache(q2, cache, pages, seqlens, 512, meta, splits, causal=True)
    ref, ref_lse = mla_decode_ref(q2, cache, pages, seqlens, 512, causal=True)
    assert_close("out", out, ref, dtype)
    finite = torch.isfinite(ref_lse)
    assert (lse[finite] - ref_lse[finite]).abs().max().item() <= 2e-3

    kv = torch.randn(1000, 1, 576, device=dev, dtype=dtype)
    q3 = torch.randn(5, 64, 576, device=dev, dtype=dtype)
    indices = torch.randint(-1, 1000, (5, 1, 256), device=dev, dtype=torch.int32)
    out, _, lse = flash_mla.flash_mla_sparse_fwd(q3, kv, indices, 0.05)
    ref, _, ref_lse = mla_sparse_prefill_ref(q3, kv, indices, 512, sm_scale=0.05)
    assert_close("out", out, ref, dtype)
    assert (lse - ref_lse).abs().max().item() <= 2e-3
    assert torch.cuda.current_device() == 0


@pytest.mark.cpu
@pytest.mark.parametrize("dims", [(64, 64), (128, 128), (256, 256), (512, 512), (576, 512)],
                         ids=lambda d: f"{d[0]}-{d[1]}")
@pytest.mark.parametrize("mask", [dict(causal=True), dict(window=(37, 5))], ids=["causal", "window37-5"])
def test_varlen_gpu_tile_shapes(dims, mask, monkeypatch):
    """The interpreter runs its own small tiles; this runs the portable kernel's GPU prefill tiles for each head
    dim (`_GPU_TILES`: 128 x 128 down to 64 x 16) on varlen sequences shorter and longer than a tile, one empty."""
    from fmha.kernels import forward
    dqk, dv = dims
    monkeypatch.setattr(forward, "_INTERPRET_TILES", forward._GPU_TILES[forward.next_pow2(max(dqk, dv))])
    torch.manual_seed(5)
    len_q, len_k = [150, 0, 37], [200, 5, 130]
    cu_q = torch.tensor([0, 150, 150, 187], dtype=torch.int32)
    cu_k = torch.tensor([0, 200, 205, 335], dtype=torch.int32)
    q = poisoned((187, 4, dqk), 187, torch.float16, "cpu", dim=0)
    k = poisoned((335, 2, dqk), 335, torch.float16, "cpu", dim=0)
    v = poisoned((335, 2, dv), 335, torch.float16, "cpu", dim=0)
    got, lse = fmha.attention_varlen(q, k, v, cu_q, cu_k, max(len_q), max(len_k), return_lse=True, **mask)
    assert_matches(got, lse, attention_varlen_ref(q, k, v, cu_q, cu_k, **mask), torch.float16)


FP8 = torch.float8_e4m3fn


def _fp8_inputs(shape, kind, dtype, device, seed):
    """Inputs of an FP8 call: float8_e4m3fn k and v (and q for kind "qkv"; else q in `dtype`), NaN-poisoned like
    the others, and `(b, heads_k)` descales (q's only for "qkv")."""
    torch.manual_seed(seed)
    b, sq, sk, hq, hk, dqk, dv = shape
    q = poisoned((b, sq, hq, dqk), sq, FP8 if kind == "qkv" else dtype, device, scale=3.0 if kind == "qkv" else 1.0)
    k = poisoned((b, sk, hk, dqk), sk, FP8, device, scale=3.0)
    v = poisoned((b, sk, hk, dv), sk, FP8, device, scale=3.0)
    descales = {name: torch.rand(b, hk, device=device) * 0.5 + 0.1 for name in ("q_descale", "k_descale", "v_descale")}
    if kind != "qkv":
        del descales["q_descale"]
    return q, k, v, descales


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("kind", ["qkv", "kv"], ids=["fp8-qkv", "fp8-kv"])
@pytest.mark.parametrize("mask", [dict(), dict(causal=True), dict(window=(5, 3), softcap=8.0, sinks=True)],
                         ids=["full", "causal", "window-softcap-sinks"])
@pytest.mark.parametrize("shape_index", [0, 5, 9])
def test_fp8(target, kind, mask, shape_index):
    """float8_e4m3fn inputs (all three, or k and v beside fp16/bf16 q) with per-(batch, KV head) descales: the
    attention of the descaled values (the oracle's fp32 math on them). An FP8 q gives a bf16 output (fp16 math);
    fp16/bf16 q its own dtype."""
    device, dtype = target
    shape = _shapes(target)[shape_index]
    q, k, v, descales = _fp8_inputs(shape, kind, dtype, device, seed=200 + shape_index)
    mask = dict(mask)
    if mask.get("sinks"):
        mask["sinks"] = torch.randn(shape[3], device=device)
    got, lse = fmha.attention(q, k, v, return_lse=True, **mask, **descales)
    out_dtype = torch.bfloat16 if kind == "qkv" else dtype
    assert got.dtype == out_dtype
    assert_matches(got, lse, attention_ref(q, k, v, **mask, **descales), out_dtype)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("seqlen_q", [1, 6, 8, 9])
def test_fp8_kv_decode_rows(target, seqlen_q):
    """FP8 k and v beside fp16/bf16 q with few packed rows (a GQA group of 4): on the GPU 4 and 16 rows take the
    16-row FP8 decode tiles, 24 and 32 the 32-row ones, 36 the 64-row form, on a dense (not KV-cache) call."""
    device, dtype = target
    sk, d = (3000, 128) if device == "cuda" else (70, 64)
    shape = (3, seqlen_q, sk, 16, 4, d, d)
    q, k, v, descales = _fp8_inputs(shape, "kv", dtype, device, seed=300 + seqlen_q)
    for mask in (dict(), dict(causal=True)):
        got, lse = fmha.attention(q, k, v, return_lse=True, **mask, **descales)
        assert_matches(got, lse, attention_ref(q, k, v, **mask, **descales), dtype)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("use_tma", [False, True])
@pytest.mark.parametrize("kind", ["qkv", "kv"], ids=["fp8-qkv", "fp8-kv"])
def test_fp8_load_paths(target, use_tma, kind):
    """FP8 tiles through both load paths of the portable kernel (pointers; TMA descriptors, which the poisoned,
    padded inputs above never qualify for), contiguous inputs as a user passes them."""
    device, dtype = target
    torch.manual_seed(13)
    b, sq, sk, hq, hk, d = (2, 21, 77, 6, 2, 64) if device == "cpu" else (2, 300, 2000, 16, 2, 128)
    q8, k8, v8 = ((torch.randn(b, n, h, d, device=device) * 3).to(FP8) for n, h in ((sq, hq), (sk, hk), (sk, hk)))
    q = q8 if kind == "qkv" else torch.randn(b, sq, hq, d, device=device, dtype=dtype)
    descales = [torch.rand(b, hk, device=device) + 0.1 if kind == "qkv" else None,
                torch.rand(b, hk, device=device) + 0.1, torch.rand(b, hk, device=device) + 0.1]
    out_dtype = torch.bfloat16 if kind == "qkv" else dtype
    for causal in (False, True):
        out = torch.full((b, sq, hq, d), float("nan"), device=device, dtype=out_dtype)
        lse = torch.full((b, hq, sq), float("nan"), device=device)
        attention_forward(q, k8, v8, out, lse, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=sq,
                          max_seqlen_k=sk, softmax_scale=None, window=(-1, 0 if causal else -1), softcap=0.0,
                          alibi_slopes=None, sinks=None, descales=descales, use_tma=use_tma,
                          interpret=device == "cpu")
        ref = attention_ref(q, k8, v8, causal=causal, q_descale=descales[0], k_descale=descales[1],
                            v_descale=descales[2])
        assert_matches(out, lse, ref, out_dtype)


@pytest.mark.parametrize("target", TARGETS)
def test_fp8_varlen_and_out(target):
    """FP8 varlen (one descale row per sequence, an empty one among them), an fp32 `out`, and no descales at all
    (each then 1)."""
    device, dtype = target
    torch.manual_seed(9)
    len_q, len_k = _varlen_lengths(target)
    cu_q = torch.tensor([0] + list(torch.tensor(len_q).cumsum(0)), dtype=torch.int32, device=device)
    cu_k = torch.tensor([0] + list(torch.tensor(len_k).cumsum(0)), dtype=torch.int32, device=device)
    tq, tk, b = int(cu_q[-1]), int(cu_k[-1]), len(len_q)
    q = poisoned((tq, 4, 64), tq, FP8, device, dim=0, scale=3.0)
    k = poisoned((tk, 2, 64), tk, FP8, device, dim=0, scale=3.0)
    v = poisoned((tk, 2, 64), tk, FP8, device, dim=0, scale=3.0)
    descales = {name: torch.rand(b, 2, device=device) + 0.1 for name in ("q_descale", "k_descale", "v_descale")}
    out = torch.full((tq, 4, 64), float("nan"), device=device)
    got, lse = fmha.attention_varlen(q, k, v, cu_q, cu_k, max(len_q), max(len_k), causal=True, return_lse=True,
                                     out=out, **descales)
    assert got is out
    ref = attention_varlen_ref(q, k, v, cu_q, cu_k, causal=True, **descales)
    assert_matches(got, lse, ref, torch.float16)
    got, lse = fmha.attention_varlen(q, k, v, cu_q, cu_k, max(len_q), max(len_k), return_lse=True)
    assert_matches(got, lse, attention_varlen_ref(q, k, v, cu_q, cu_k), torch.bfloat16)


def _laid_out(layout, b, s, hq, hk, d, dtype, device):
    """q (b, s, hq, d), k and v (b, s, hk, d) as callers hold them, NaN past each one's rows and columns:
    "bhsd" SDPA's (b, h, s, d) tensors transposed; "fused" three slices of one (b, s, hq + 2 hk, d) projection;
    "shared" one batch's k and v broadcast over the batch (stride 0); "one-head" one KV head broadcast over hk."""
    if layout == "bhsd":
        return [poisoned((b, h, s, d), s, dtype, device, dim=2).transpose(1, 2) for h in (hq, hk, hk)]
    if layout == "fused":
        return list(poisoned((b, s, hq + 2 * hk, d), s, dtype, device).split([hq, hk, hk], dim=2))
    q = poisoned((b, s, hq, d), s, dtype, device)
    if layout == "shared":
        return [q] + [poisoned((1, s, hk, d), s, dtype, device).expand(b, s, hk, d) for _ in range(2)]
    return [q] + [poisoned((b, s, 1, d), s, dtype, device).expand(b, s, hk, d) for _ in range(2)]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("layout", ["bhsd", "fused", "shared", "one-head"])
def test_input_layouts(target, layout):
    """The strides callers' tensors come with, not only the NHD layout: SDPA's (b, h, s, d) transposed (a head
    stride above the row stride), slices of a fused QKV projection, and K / V broadcast by `expand` (a stride of 0
    over the batch or the heads). Prefill (on Hopper at d = 128, the Gluon kernel where its TMA takes the strides)
    with the output in the same transposed layout, and a decode and a chunk over the same K / V as a contiguous
    cache, and batch 0's rows as two packed sequences, every one against the oracle."""
    device, dtype = target
    torch.manual_seed(11)
    b, s, hq, hk, d = (2, 45, 4, 2, 64) if device == "cpu" else (2, 700, 8, 2, 128)
    q, k, v = _laid_out(layout, b, s, hq, hk, d, dtype, device)
    for causal in (False, True):
        out = torch.full((b, hq, s, d), float("nan"), dtype=dtype, device=device).transpose(1, 2)
        got, lse = fmha.attention(q, k, v, causal=causal, return_lse=True, out=out)
        assert got.data_ptr() == out.data_ptr()
        assert_matches(got, lse, attention_ref(q, k, v, causal=causal), dtype)
    cu = torch.tensor([0, s // 3, s], dtype=torch.int32, device=device)
    got, lse = fmha.attention_varlen(q[0], k[0], v[0], cu, cu, s - s // 3, s - s // 3, causal=True, return_lse=True)
    assert_matches(got, lse, attention_varlen_ref(q[0], k[0], v[0], cu, cu, causal=True), dtype)
    lens = torch.tensor([s - 7, s], dtype=torch.int32, device=device)
    for rows in (1, 5):
        q_new = q[:, -rows:]
        got, lse = fmha.attention_with_kvcache(q_new, k, v, lens, causal=True, return_lse=True)
        for i, n in enumerate(lens.tolist()):
            assert_matches(got[i:i + 1], lse[i:i + 1],
                           attention_ref(q_new[i:i + 1], k[i:i + 1, :n], v[i:i + 1, :n], causal=True), dtype)


@pytest.mark.parametrize("target", TARGETS)
def test_forward_only(target):
    """Inputs that require grad (a model run without no_grad, or a training step): the same outputs, and a
    backward through them raises naming the entry point rather than leaving q, k and v silently without their
    share of the gradient. An `out=` tensor keeps its storage."""
    device, dtype = target
    torch.manual_seed(13)
    q, k, v = _dense_inputs((2, 40, 60, 4, 2, 64, 64), dtype, device)
    assert_forward_only(lambda q, k, v: fmha.attention(q, k, v, causal=True, return_lse=True), "attention", q, k, v)
    out = torch.empty(2, 40, 4, 64, dtype=dtype, device=device)
    got = fmha.attention(q.detach().requires_grad_(), k, v, out=out)
    assert got.data_ptr() == out.data_ptr() and got.grad_fn is not None
    cu = torch.tensor([0, 15, 40], dtype=torch.int32, device=device)
    assert_forward_only(lambda q, k, v: fmha.attention_varlen(q, k, v, cu, cu, 25, 25, return_lse=True),
                        "attention_varlen", q[0], k[0, :40], v[0, :40])
    lens = torch.tensor([60, 33], dtype=torch.int32, device=device)
    assert_forward_only(lambda q: fmha.attention_with_kvcache(q, k, v, lens, num_splits=2), "attention_with_kvcache",
                        q[:, :1])
