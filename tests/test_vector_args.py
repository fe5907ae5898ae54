"""Every small tensor argument (per-sequence lengths and starts, per-head slopes and sinks, per-sequence window
bounds) may be a strided view, e.g. a column of a larger table: each call here passes views whose skipped
elements would change the result if read (NaN, or lengths of 0), and must give what the same call gives with
contiguous copies, bit for bit. The contiguous calls are checked against the oracle in the other test files.
Also FlashAttention's int form of `cache_seqlens`."""

import math

import pytest
import torch

import fmha
import fmha.mla as flash_mla
from utils import TARGETS


def _strided(t, junk):
    """`t` (1-D) as every second element of a buffer whose other elements are `junk`."""
    buf = torch.full((t.shape[0], 2), junk, dtype=t.dtype, device=t.device)
    buf[:, 0] = t
    view = buf[:, 0]
    assert view.stride() == (2,) and torch.equal(view, t)
    return view


def _same(a, b):
    for x, y in zip(a if isinstance(a, tuple) else (a,), b if isinstance(b, tuple) else (b,)):
        assert torch.equal(x.isnan(), y.isnan()) and torch.equal(x.nan_to_num(), y.nan_to_num())


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("num_splits,seqlen_q", [(1, 1), (3, 2), (1, 64)], ids=str)
def test_kvcache_vectors(target, num_splits, seqlen_q):
    device, dtype = target
    b, hq, hk, d, cap = 3, 4, 2, 64, 96
    g = torch.Generator().manual_seed(seqlen_q)
    q, k, v = (torch.randn(shape, generator=g).to(dtype).to(device)
               for shape in ((b, seqlen_q, hq, d), (b, cap, hk, d), (b, cap, hk, d)))
    lens = torch.tensor([90, 7, 70], dtype=torch.int32, device=device)
    starts = torch.tensor([5, 0, 33], dtype=torch.int32, device=device)
    lefts = torch.tensor([20, -1, 3], dtype=torch.int32, device=device)
    slopes, sinks = torch.rand(hq, device=device), torch.randn(hq, device=device)
    options = dict(num_splits=num_splits, causal=True, return_lse=True)
    want = fmha.attention_with_kvcache(q, k, v, lens, cache_leftpad=starts, window=(lefts, 0),
                                       alibi_slopes=slopes, sinks=sinks, **options)
    got = fmha.attention_with_kvcache(q, k, v, _strided(lens, 0), cache_leftpad=_strided(starts, 50),
                                      window=(_strided(lefts, 0), 0), alibi_slopes=_strided(slopes, math.nan),
                                      sinks=_strided(sinks, math.nan), **options)
    _same(got, want)


@pytest.mark.parametrize("target", TARGETS)
def test_attention_vectors(target):
    device, dtype = target
    b, s, hq, hk, d = 2, 40, 4, 2, 64
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(shape, generator=g).to(dtype).to(device)
               for shape in ((b, s, hq, d), (b, s, hk, d), (b, s, hk, d)))
    lefts = torch.tensor([5, 17], dtype=torch.int32, device=device)
    slopes, sinks = torch.rand(hq, device=device), torch.randn(hq, device=device)
    want = fmha.attention(q, k, v, causal=True, window=(lefts, 0), alibi_slopes=slopes, sinks=sinks, return_lse=True)
    got = fmha.attention(q, k, v, causal=True, window=(_strided(lefts, 0), 0), alibi_slopes=_strided(slopes, math.nan),
                         sinks=_strided(sinks, math.nan), return_lse=True)
    _same(got, want)


def _mla_cache(lens, page_size, d, dtype, device, g):
    pages = len(lens) * -(-max(lens) // page_size)
    table = torch.randperm(pages + 2, generator=g)[:pages].view(len(lens), -1)
    cache = torch.randn(pages + 2, page_size, 1, d, generator=g).to(dtype)
    return cache.to(device), table.to(torch.int32).to(device)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("h_q,s_q", [(16, 2), (64, 1)])
def test_mla_vectors(target, h_q, s_q):
    device, dtype = target
    g = torch.Generator().manual_seed(h_q)
    lens = torch.tensor([300, 5, 130], dtype=torch.int32, device=device)
    cache, table = _mla_cache(lens.tolist(), 64, 576, dtype, device, g)
    q = torch.randn(3, s_q, h_q, 576, generator=g).to(dtype).to(device)
    sink = torch.randn(h_q, device=device)
    meta, splits = flash_mla.get_mla_metadata(lens, s_q * h_q, 1)
    want = flash_mla.flash_mla_with_kvcache(q, cache, table, lens, 512, meta, splits, causal=True, attn_sink=sink)
    got = flash_mla.flash_mla_with_kvcache(q, cache, table, _strided(lens, 0), 512, meta, splits, causal=True,
                                           attn_sink=_strided(sink, math.nan))
    _same(got, want)
    meta2, splits2 = flash_mla.get_mla_metadata(_strided(lens, 0), s_q * h_q, 1)
    assert torch.equal(meta2, meta) and torch.equal(splits2, splits)
    want = flash_mla.mla_decode(q[..., :512], q[..., 512:], cache[..., :512], cache[..., 512:], table, lens,
                                attn_sink=sink)
    got = flash_mla.mla_decode(q[..., :512], q[..., 512:], cache[..., :512], cache[..., 512:], table,
                               _strided(lens, 0), attn_sink=_strided(sink, math.nan))
    _same(got, want)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("extra", [False, True], ids=["", "extra"])
def test_sparse_vectors(target, extra):
    device, dtype = target
    g = torch.Generator().manual_seed(5)
    b, s_q, h_q, topk = 3, 2, 16, 64
    cache = torch.randn(8, 64, 1, 576, generator=g).to(dtype).to(device)
    indices = torch.randint(0, 8 * 64, (b, s_q, topk), generator=g, dtype=torch.int32).to(device)
    length = torch.tensor([40, 0, 64], dtype=torch.int32, device=device)
    sink = torch.randn(h_q, device=device)
    more = {}
    if extra:
        more = dict(extra_k_cache=cache[:4], extra_indices_in_kvcache=indices[..., :32] % 256,
                    extra_topk_length=torch.tensor([3, 32, 0], dtype=torch.int32, device=device))
    lens = torch.zeros(b, dtype=torch.int32, device=device)
    meta, splits = flash_mla.get_mla_metadata(lens, s_q * h_q, 1, num_heads_q=h_q, topk=topk)
    want = flash_mla.flash_mla_with_kvcache(q := torch.randn(b, s_q, h_q, 576, generator=g).to(dtype).to(device),
                                            cache, None, lens, 512, meta, splits, indices=indices,
                                            topk_length=length, attn_sink=sink, **more)
    if extra:
        more["extra_topk_length"] = _strided(more["extra_topk_length"], 0)
    got = flash_mla.flash_mla_with_kvcache(q, cache, None, lens, 512, meta, splits, indices=indices,
                                           topk_length=_strided(length, 0), attn_sink=_strided(sink, math.nan),
                                           **more)
    _same(got, want)
    kv = cache.view(-1, 1, 576)
    qp = q.view(b * s_q, h_q, 576)
    ip = indices.view(b * s_q, 1, topk)
    tl_ = length.repeat_interleave(s_q)
    want = flash_mla.flash_mla_sparse_fwd(qp, kv, ip, 0.05, attn_sink=sink, topk_length=tl_)
    got = flash_mla.flash_mla_sparse_fwd(qp, kv, ip, 0.05, attn_sink=_strided(sink, math.nan),
                                         topk_length=_strided(tl_, 0))
    _same(got, want)


@pytest.mark.parametrize("target", TARGETS)
def test_table_views(target):
    """Block tables and token indices that are column slices of wider ones (rows further apart than their
    length, the columns past the slice naming pages and tokens the call must not read)."""
    device, dtype = target
    g = torch.Generator().manual_seed(3)
    q = torch.randn(3, 1, 4, 64, generator=g).to(dtype).to(device)
    kc, vc = (torch.randn(20, 16, 2, 64, generator=g).to(dtype).to(device) for _ in range(2))
    kc[19], vc[19] = math.nan, math.nan
    table = torch.randperm(19, generator=g)[:12].view(3, 4).to(torch.int32).to(device)
    wide = torch.full((3, 9), 19, dtype=torch.int32, device=device)
    wide[:, :4] = table
    lens = torch.tensor([60, 5, 33], dtype=torch.int32, device=device)
    for splits in (1, 3):
        _same(fmha.attention_with_kvcache(q, kc, vc, lens, block_table=wide[:, :4], num_splits=splits),
              fmha.attention_with_kvcache(q, kc, vc, lens, block_table=table, num_splits=splits))
    cache = torch.randn(20, 64, 1, 576, generator=g).to(dtype).to(device)
    cache[19] = math.nan
    lens = torch.tensor([200, 5, 130], dtype=torch.int32, device=device)
    q = torch.randn(3, 2, 16, 576, generator=g).to(dtype).to(device)
    meta, splits = flash_mla.get_mla_metadata(lens, 32, 1)
    _same(flash_mla.flash_mla_with_kvcache(q, cache, wide[:, :4], lens, 512, meta, splits, causal=True),
          flash_mla.flash_mla_with_kvcache(q, cache, table, lens, 512, meta, splits, causal=True))
    indices = torch.randint(0, 19 * 64, (3, 2, 128), generator=g, dtype=torch.int32).to(device)
    wide = torch.full((3, 2, 200), 19 * 64, dtype=torch.int32, device=device)     # a NaN token
    wide[..., :128] = indices
    lens = torch.zeros(3, dtype=torch.int32, device=device)
    meta, splits = flash_mla.get_mla_metadata(lens, 32, 1, num_heads_q=16, topk=128)
    _same(flash_mla.flash_mla_with_kvcache(q, cache, None, lens, 512, meta, splits, indices=wide[..., :128]),
          flash_mla.flash_mla_with_kvcache(q, cache, None, lens, 512, meta, splits, indices=indices))
    kv = cache.view(-1, 1, 576)
    _same(flash_mla.flash_mla_sparse_fwd(q.flatten(0, 1), kv, wide[..., :128].flatten(0, 1).unsqueeze(1), 0.05),
          flash_mla.flash_mla_sparse_fwd(q.flatten(0, 1), kv, indices.flatten(0, 1).unsqueeze(1), 0.05))


@pytest.mark.parametrize("target", TARGETS)
def test_kvcache_int_seqlens(target):
    """cache_seqlens as one int (FlashAttention's form): the same call as with a tensor of it."""
    device, dtype = target
    g = torch.Generator().manual_seed(4)
    q = torch.randn(2, 1, 4, 64, generator=g).to(dtype).to(device)
    kc, vc = (torch.randn(2, 40, 2, 64, generator=g).to(dtype).to(device) for _ in range(2))
    kc[:, 33:], vc[:, 33:] = math.nan, math.nan
    lens = torch.full((2,), 33, dtype=torch.int32, device=device)
    _same(fmha.attention_with_kvcache(q, kc, vc, 33, return_lse=True),
          fmha.attention_with_kvcache(q, kc, vc, lens, return_lse=True))
