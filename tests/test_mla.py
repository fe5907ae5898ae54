"""fmha.mla against the fp32 oracle, with FlashMLA's test semantics: lengths drawn around a mean (one of
them 0), pages shuffled among NaN-filled unused pages, NaN in every cache slot past each length, and
cos diff < 1e-5 on out and on lse."""
import math

import pytest
import torch

import fmha.mla as flash_mla
from fmha.kernels.mla_decode import mla_decode_forward
from fmha._kv_fp8 import LAYOUTS, model1_parts
from fmha.reference import attention_varlen_ref, mla_decode_ref, mla_sparse_decode_ref, mla_sparse_prefill_ref
from fmha.schedule import PIECE_OVERHEAD, SCHED_BLOCK, SCHED_FIELDS, plan_mla, uniform_plan
from utils import TARGETS, assert_close, assert_forward_only, assert_matches, far_pages, garbled_table, poisoned

D_QK, D_V = 576, 512


def _paged_cache(seqlens, page_size, h_k, d, dtype, device, seed=0):
    """A cache holding each sequence's keys in shuffled pages; NaN past every length and in unused pages.
    Built with a few whole-tensor ops on the target device (a per-page loop on the CPU took minutes per test
    when eight pytest workers built b=128 caches at once)."""
    g = torch.Generator().manual_seed(seed)
    b = len(seqlens)
    max_blocks = max(1, -(-max(seqlens) // page_size))
    num_blocks = b * max_blocks + 3
    table = torch.randperm(num_blocks, generator=g)[: b * max_blocks].view(b, max_blocks).to(torch.int32).to(device)
    keys = torch.randn(b, max_blocks * page_size, h_k, d, generator=torch.Generator(device).manual_seed(seed),
                       device=device).to(dtype)
    lens = torch.tensor(seqlens, device=device)
    keys[torch.arange(max_blocks * page_size, device=device)[None, :] >= lens[:, None]] = math.nan
    cache = torch.full((num_blocks, page_size, h_k, d), math.nan, dtype=dtype, device=device)
    cache[table.flatten().long()] = keys.view(b * max_blocks, page_size, h_k, d)
    return cache, table


def _seqlens(b, mean, seed):
    """Lengths drawn around `mean` (FlashMLA's test draws from a normal around it), one of them 0."""
    g = torch.Generator().manual_seed(seed)
    lens = (torch.randn(b, generator=g) * mean / 4 + mean).clamp(min=1).long().tolist()
    lens[min(1, b - 1)] = 0
    return lens


def _cos_diff(a, b):
    a, b = a.double().flatten(), b.double().flatten()
    norms = (a * a + b * b).sum().item()
    return 0.0 if norms == 0 else 1 - 2 * (a * b).sum().item() / norms        # two zero tensors are equal


def _check(out, lse, ref_out, ref_lse, dtype):
    assert_close("out", out, ref_out, dtype)
    assert torch.equal(torch.isposinf(lse), torch.isposinf(ref_lse)), "lse: +inf rows (no key) differ"
    finite = torch.isfinite(ref_lse)
    assert torch.isfinite(lse[finite]).all(), "lse: non-finite where the oracle is finite"
    assert _cos_diff(out.float(), ref_out) < 1e-5, "out: cos diff"
    if finite.any():              # (a call whose sequences are all empty has none)
        assert (lse[finite] - ref_lse[finite]).abs().max().item() <= 2e-3, "lse: max abs err"
        assert _cos_diff(lse[finite], ref_lse[finite]) < 1e-5, "lse: cos diff"


def _dequantized(packed, layout, dtype):
    """An FP8 cache as the kernels compute with it, for the fp32 oracle: SPEC.md's "dequantised on load, bf16 math",
    i.e. each value times its scale rounded to q's dtype (bf16; fp16 in the interpreter), as FlashMLA does too.
    Against values kept in fp32, V3.2's fp32 scales leave that rounding in every key, which moved the LSE by more
    than 2e-3 on a few random V3.2 cases (`test_fuzz_sparse_decode`, seeds past the suite's)."""
    return flash_mla.dequantize_kv_cache(packed, layout, dtype).float()


def _case(target, h_q, s_q, page_size, seed):
    device, dtype = target
    b, mean = (4, 150) if device == "cpu" else (128 if h_q <= 64 else 32, 4096)
    seqlens = _seqlens(b, mean, seed)
    cache, table = _paged_cache(seqlens, page_size, 1, D_QK, dtype, device, seed)
    q = torch.randn(b, s_q, h_q, D_QK, generator=torch.Generator().manual_seed(seed + 1)).to(dtype).to(device)
    return q, cache, table, torch.tensor(seqlens, dtype=torch.int32, device=device)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("h_q", [16, 32, 64, 128])
@pytest.mark.parametrize("s_q", [1, 2])
def test_flash_mla_with_kvcache(target, h_q, s_q):
    if target[0] == "cpu" and h_q == 128:
        pytest.skip("h_q=128 only at GPU sizes (the interpreter covers multi-block rows with h_q=64)")
    dtype = target[1]
    q, cache, table, seqlens = _case(target, h_q, s_q, 64, seed=h_q + s_q)
    table = garbled_table(table, seqlens.tolist(), 64)      # no page past each sequence's: engines' padding
    meta, splits = flash_mla.get_mla_metadata(seqlens, s_q * h_q, 1)
    causal = s_q > 1
    out, lse = flash_mla.flash_mla_with_kvcache(q, cache, table, seqlens, D_V, meta, splits, causal=causal)
    assert out.shape == (q.shape[0], s_q, h_q, D_V) and lse.shape == (q.shape[0], h_q, s_q)
    _check(out, lse, *mla_decode_ref(q, cache, table, seqlens, D_V, causal=causal), dtype)


@pytest.mark.parametrize("target", TARGETS)
def test_sched_meta_form(target):
    """FlashMLA's newer call form: `get_mla_metadata()` gives an empty FlashMLASchedMeta, the first call plans into
    it (the plan the old form makes, so the outputs are bit-identical to it), the next "layer" reuses that plan
    (the same tensors), and a call of another configuration is refused without touching the handle."""
    dtype = target[1]
    q, cache, table, seqlens = _case(target, 16, 2, 64, seed=7)
    sched, none = flash_mla.get_mla_metadata()
    assert isinstance(sched, flash_mla.FlashMLASchedMeta) and none is None and not sched.have_initialized
    meta, splits = flash_mla.get_mla_metadata(seqlens, 32, 1)
    ref = flash_mla.flash_mla_with_kvcache(q, cache, table, seqlens, D_V, meta, splits, causal=True)
    _check(*ref, *mla_decode_ref(q, cache, table, seqlens, D_V, causal=True), dtype)
    for layer in range(2):
        out, lse = flash_mla.flash_mla_with_kvcache(q, cache, table, seqlens, D_V, sched, None, causal=True)
        assert torch.equal(out, ref[0]) and torch.equal(lse, ref[1])
        if layer == 0:
            planned = sched.tile_scheduler_metadata
            assert torch.equal(planned, meta) and torch.equal(sched.num_splits, splits)
    assert sched.tile_scheduler_metadata is planned and sched.config.b == q.shape[0] and sched.config.causal
    config = sched.config
    with pytest.raises(ValueError, match="tile_scheduler_metadata"):
        flash_mla.flash_mla_with_kvcache(q, cache, table, seqlens, D_V, sched, None, causal=False)
    with pytest.raises(ValueError, match="tile_scheduler_metadata"):
        flash_mla.flash_mla_with_kvcache(q[:, :1], cache, table, seqlens, D_V, sched, None)
    with pytest.raises(ValueError, match="num_splits"):
        flash_mla.flash_mla_with_kvcache(q, cache, table, seqlens, D_V, sched, splits, causal=True)
    fresh = flash_mla.get_mla_metadata()[0]
    with pytest.raises(ValueError, match="cache_seqlens"):
        flash_mla.flash_mla_with_kvcache(q, cache, table, seqlens[:-1], D_V, fresh, None, causal=True)
    assert sched.config is config and sched.tile_scheduler_metadata is planned and not fresh.have_initialized


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("extra", [False, True], ids=["", "extra"])
def test_sched_meta_form_sparse(target, extra):
    """The handle form for token-sparse decode (with a second source too): the same outputs as the old form's,
    the configuration kept, a different topk refused."""
    device, dtype = target
    g = torch.Generator().manual_seed(11)
    b, s_q, h_q, topk = 3, 2, 64, 96
    cache, indices, length = _sparse_source(b, s_q, topk, 500, 64, D_QK, dtype, device, g)
    q = torch.randn(b, s_q, h_q, D_QK, generator=g).to(dtype).to(device)
    lens = torch.zeros(b, dtype=torch.int32, device=device)
    kw = dict(indices=indices, topk_length=length)
    if extra:
        x_cache, x_indices, x_length = _sparse_source(b, s_q, 40, 200, 16, D_QK, dtype, device, g)
        kw.update(extra_k_cache=x_cache, extra_indices_in_kvcache=x_indices, extra_topk_length=x_length)
    meta, splits = flash_mla.get_mla_metadata(lens, s_q * h_q, 1, num_heads_q=h_q, topk=topk)
    ref = flash_mla.flash_mla_with_kvcache(q, cache, None, lens, D_V, meta, splits, **kw)
    sched, _ = flash_mla.get_mla_metadata()
    for _ in range(2):
        out, lse = flash_mla.flash_mla_with_kvcache(q, cache, None, None, D_V, sched, None, **kw)
        assert torch.equal(out, ref[0]) and torch.equal(lse, ref[1])
    assert sched.have_initialized and sched.config.topk == topk and sched.config.extra_topk == (40 if extra else None)
    with pytest.raises(ValueError, match="tile_scheduler_metadata"):
        flash_mla.flash_mla_with_kvcache(q, cache, None, None, D_V, sched, None,
                                         **dict(kw, indices=indices[..., :64].contiguous()))
    fresh = flash_mla.get_mla_metadata()[0]
    if extra:                  # inputs are checked before the handle is read or written
        with pytest.raises(TypeError, match="extra_indices_in_kvcache"):
            flash_mla.flash_mla_with_kvcache(q, cache, None, None, D_V, fresh, None,
                                             **dict(kw, extra_indices_in_kvcache=[0]))
    with pytest.raises(TypeError, match="indices"):
        flash_mla.flash_mla_with_kvcache(q, cache, None, None, D_V, fresh, None, **dict(kw, indices=indices.long()))
    assert not fresh.have_initialized and fresh.config is None


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("page_size", [16, 32, 61, 128])
def test_page_sizes(target, page_size):
    """Other page sizes: 16/32 (gather loads on the GPU), 61 (a page that no tile divides), 128."""
    q, cache, table, seqlens = _case(target, 16, 2, page_size, seed=page_size)
    meta, splits = flash_mla.get_mla_metadata(seqlens, 32, 1)
    out, lse = flash_mla.flash_mla_with_kvcache(q, cache, table, seqlens, D_V, meta, splits, causal=True,
                                                softmax_scale=0.1)
    _check(out, lse, *mla_decode_ref(q, cache, table, seqlens, D_V, causal=True, softmax_scale=0.1), target[1])


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("use_tma", [False, True])
@pytest.mark.parametrize("h_q", [16, 32], ids=["transposed", "rows-major"])
def test_load_paths(target, use_tma, h_q):
    """Both K-tile load paths (TMA boxes and pointer gathers), in both kernel forms (16 packed rows take the
    transposed one, 64 the other), on the same inputs through the launcher."""
    q, cache, table, seqlens = _case(target, h_q, 2 if h_q == 32 else 1, 64, seed=7)
    meta, splits = flash_mla.get_mla_metadata(seqlens, q.shape[1] * h_q, 1)
    out = q.new_empty(*q.shape[:3], D_V)
    lse = torch.empty(q.shape[0], q.shape[2], q.shape[1], dtype=torch.float32, device=q.device)
    mla_decode_forward(q[..., :D_V], q[..., D_V:], cache[..., :D_V], cache[..., D_V:], table, seqlens, meta, splits,
                       out, lse, softmax_scale=D_QK ** -0.5, causal=True, use_tma=use_tma,
                       interpret=q.device.type == "cpu")
    _check(out, lse, *mla_decode_ref(q, cache, table, seqlens, D_V, causal=True), target[1])


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("h_q,s_q,b", [(16, 2, 3), (128, 1, 1), (64, 2, 2)])
def test_all_sequences_empty(target, h_q, s_q, b):
    """Every cache length 0 (a batch of fresh requests): output 0 and LSE +inf everywhere, from the plan's empty
    parts and, on the GPU, the Gluon kernel's (h_q = 128 and h_q = 64 with s_q = 2: query blocks in pairs)."""
    if target[0] == "cpu" and h_q == 128:
        pytest.skip("h_q=128 only at GPU sizes")
    device, dtype = target
    seqlens = [0] * b
    cache, table = _paged_cache(seqlens, 64, 1, D_QK, dtype, device, seed=b)
    q = torch.randn(b, s_q, h_q, D_QK, generator=torch.Generator().manual_seed(b)).to(dtype).to(device)
    lens = torch.tensor(seqlens, dtype=torch.int32, device=device)
    meta, splits = flash_mla.get_mla_metadata(lens, s_q * h_q, 1)
    out, lse = flash_mla.flash_mla_with_kvcache(q, cache, table, lens, D_V, meta, splits, causal=s_q > 1)
    assert (out == 0).all() and torch.isposinf(lse).all()
    _check(out, lse, *mla_decode_ref(q, cache, table, lens, D_V, causal=s_q > 1), dtype)


@pytest.mark.parametrize("target", TARGETS)
def test_causal_short_sequences(target):
    """s_q = 4 (MTP) with caches shorter than s_q: the first queries see no key (output 0, LSE +inf)."""
    device, dtype = target
    seqlens = [2, 0, 1, 4, 3 * SCHED_BLOCK + 5]
    cache, table = _paged_cache(seqlens, 64, 1, D_QK, dtype, device, seed=3)
    q = torch.randn(len(seqlens), 4, 16, D_QK, device=device).to(dtype)
    lens = torch.tensor(seqlens, dtype=torch.int32, device=device)
    meta, splits = flash_mla.get_mla_metadata(lens, 64, 1)
    out, lse = flash_mla.flash_mla_with_kvcache(q, cache, table, lens, D_V, meta, splits, causal=True)
    _check(out, lse, *mla_decode_ref(q, cache, table, lens, D_V, causal=True), dtype)
    assert (out[1] == 0).all() and torch.isposinf(lse[1]).all()


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("h_q", [64, 128])
def test_head_dim_512(target, h_q):
    """DeepSeek-V4's head_dim 512 (448 NoPE + 64 RoPE in one tensor), value = the whole key (d_v = 512)."""
    if target[0] == "cpu" and h_q == 128:
        pytest.skip("h_q=128 only at GPU sizes")
    device, dtype = target
    seqlens = _seqlens(4, 150, seed=4) if device == "cpu" else _seqlens(64, 2048, seed=4)
    cache, table = _paged_cache(seqlens, 64, 1, 512, dtype, device, seed=4)
    q = torch.randn(len(seqlens), 2, h_q, 512, device=device).to(dtype)
    lens = torch.tensor(seqlens, dtype=torch.int32, device=device)
    meta, splits = flash_mla.get_mla_metadata(lens, 2 * h_q, 1)
    out, lse = flash_mla.flash_mla_with_kvcache(q, cache, table, lens, 512, meta, splits, causal=True)
    _check(out, lse, *mla_decode_ref(q, cache, table, lens, 512, causal=True), dtype)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("h_q", [16, 64], ids=["transposed", "rows-major"])
def test_attn_sink(target, h_q):
    """attn_sink: o * e^lse / (e^lse + e^sink), LSE unchanged; +inf silences a head, -inf has no effect; rows
    with no key stay 0 / +inf. Covers sequences written whole by one part and split ones (merged)."""
    device, dtype = target
    seqlens = [2, 0, 1, 300, 3 * SCHED_BLOCK + 5] if device == "cpu" else [2, 0, 1, 3000, 9000, 64] * 8
    cache, table = _paged_cache(seqlens, 64, 1, D_QK, dtype, device, seed=9)
    q = torch.randn(len(seqlens), 2, h_q, D_QK, device=device).to(dtype)
    lens = torch.tensor(seqlens, dtype=torch.int32, device=device)
    sink = torch.randn(h_q, device=device) * 3
    sink[:2] = torch.tensor([math.inf, -math.inf])
    meta, splits = flash_mla.get_mla_metadata(lens, 2 * h_q, 1)
    out, lse = flash_mla.flash_mla_with_kvcache(q, cache, table, lens, D_V, meta, splits, causal=True,
                                                attn_sink=sink)
    _check(out, lse, *mla_decode_ref(q, cache, table, lens, D_V, causal=True, attn_sink=sink), dtype)
    assert (out[:, :, 0] == 0).all()


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("h_q,s_q,page_size", [(16, 1, 64), (64, 3, 61), (128, 1, 64)])
@pytest.mark.parametrize("with_sink", [False, True], ids=["", "sink"])
def test_sparse_decode(target, h_q, s_q, page_size, with_sink):
    """Token-sparse decode (indices instead of a block table): -1 entries, topk_length trimming (0 included),
    a token whose indices are all -1, NaN in every cache slot no index points at, odd page sizes."""
    device, dtype = target
    if device == "cpu" and h_q == 128:
        pytest.skip("h_q=128 only at GPU sizes")
    b, topk, num_tokens = (3, 100, 400) if device == "cpu" else (16, 2048, 40000)
    g = torch.Generator().manual_seed(h_q + s_q)
    num_blocks = -(-num_tokens // page_size)
    cache = torch.randn(num_blocks, page_size, 1, D_QK, generator=g).to(dtype)
    indices = torch.randint(0, num_tokens, (b, s_q, topk), generator=g, dtype=torch.int32)
    indices[torch.rand(b, s_q, topk, generator=g) < 0.2] = -1
    indices[0, -1] = -1                                               # a token that sees nothing
    topk_length = torch.randint(topk // 2, topk + 1, (b,), generator=g, dtype=torch.int32)
    topk_length[-1] = 0
    topk_length[1] = topk + 7                                        # counts as topk
    used = torch.zeros(num_blocks * page_size, dtype=torch.bool)
    for i in range(b):
        row = indices[i, :, :topk_length[i]].flatten()
        used[row[row >= 0].long()] = True
    cache.view(-1, D_QK)[~used] = math.nan                           # never read: poisoned
    q = torch.randn(b, s_q, h_q, D_QK, generator=g).to(dtype)
    sink = torch.randn(h_q) if with_sink else None
    q, cache, indices, topk_length = (t.to(device) for t in (q, cache, indices, topk_length))
    sink = sink.to(device) if with_sink else None
    lens = torch.zeros(b, dtype=torch.int32, device=device)          # cache_seqlens: unused by sparse decode
    meta, splits = flash_mla.get_mla_metadata(lens, s_q * h_q, 1, num_heads_q=h_q, topk=topk)
    out, lse = flash_mla.flash_mla_with_kvcache(q, cache, None, lens, D_V, meta, splits, indices=indices,
                                                topk_length=topk_length, attn_sink=sink)
    ref = mla_sparse_decode_ref(q, cache, indices, D_V, topk_length=topk_length, attn_sink=sink)
    _check(out, lse, *ref, dtype)
    assert (out[0, -1] == 0).all() and torch.isposinf(lse[0, :, -1]).all()
    assert (out[-1] == 0).all() and torch.isposinf(lse[-1]).all()


def _sparse_source(b, s_q, topk, num_tokens, page_size, d, dtype, device, g, edge=None):
    """A cache of `num_tokens` tokens in pages, indices into it (20% -1), NaN in every slot not indexed; `edge`:
    batch 1's length (one past either end of [0, topk], which counts as the end)."""
    num_blocks = -(-num_tokens // page_size)
    cache = torch.randn(num_blocks, page_size, 1, d, generator=g).to(dtype)
    indices = torch.randint(0, num_tokens, (b, s_q, topk), generator=g, dtype=torch.int32)
    indices[torch.rand(b, s_q, topk, generator=g) < 0.2] = -1
    length = torch.randint(0, topk + 1, (b,), generator=g, dtype=torch.int32)
    if edge is not None and b > 1:
        length[1] = edge
    used = torch.zeros(num_blocks * page_size, dtype=torch.bool)
    for i in range(b):
        row = indices[i, :, :max(int(length[i]), 0)].flatten()
        used[row[row >= 0].long()] = True
    cache.view(-1, d)[~used] = math.nan
    return cache.to(device), indices.to(device), length.to(device)


def _union_of_sources(caches, selections):
    """The oracle's view of several sparse sources: one cache holding them all (`caches`, paged, in order) and
    each batch's selected indices (`selections`: (indices, topk_length) per source) joined into one row, each
    source's indices shifted past the caches before it, -1 kept, padded with -1."""
    both = torch.cat([c.flatten(0, 1) for c in caches]).unsqueeze(1)
    b = selections[0][0].shape[0]
    rows, shift = [[] for _ in range(b)], 0
    for cache, (indices, length) in zip(caches, selections):
        for i in range(b):
            sel = indices[i, :, :max(int(length[i]), 0)]
            rows[i].append(torch.where(sel >= 0, sel + shift, -1))
        shift += cache.shape[0] * cache.shape[1]
    rows = [torch.cat(parts, -1) for parts in rows]
    width = max(1, max(r.shape[-1] for r in rows))
    return both, torch.stack([torch.nn.functional.pad(r, (0, width - r.shape[-1]), value=-1) for r in rows])


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("with_sink", [False, True], ids=["", "sink"])
@pytest.mark.parametrize("layout", [None, "model1"], ids=["bf16", "fp8-model1"])
def test_extra_kv_source(target, with_sink, layout):
    """DeepSeek-V4's two sources (compressed KV, page 256 on the GPU, + a sliding-window cache, page 64) in one
    launch, the sink after both: equal to attention over the union of both sources' selected tokens. Also with
    V4's FP8 caches (unused slots hold packed 1e4s there, as NaN cannot be packed)."""
    device, dtype = target
    b, s_q, h_q, topk, extra_topk, pages = (3, 2, 16, 40, 24, (32, 16)) if device == "cpu" else (8, 2, 64, 128, 512,
                                                                                              (256, 64))
    d = D_QK if layout is None else LAYOUTS[layout][0]
    g = torch.Generator().manual_seed(21)
    cache, indices, length = _sparse_source(b, s_q, topk, 500, pages[0], d, dtype, device, g, edge=-3)
    extra, extra_indices, extra_length = _sparse_source(b, s_q, extra_topk, 300, pages[1], d, dtype, device, g,
                                                        edge=extra_topk + 5)
    ref_cache, ref_extra = cache, extra
    if layout is not None:
        cache, extra = (flash_mla.quantize_kv_cache(torch.nan_to_num(c.bfloat16(), nan=1e4), layout)
                        for c in (cache, extra))
        ref_cache, ref_extra = (_dequantized(c, layout, dtype) for c in (cache, extra))
    length[0], extra_length[0] = 0, 0                                 # a batch that sees nothing at all
    q = torch.randn(b, s_q, h_q, d, generator=g).to(dtype).to(device)
    sink = (torch.randn(h_q) * 2).to(device) if with_sink else None
    lens = torch.zeros(b, dtype=torch.int32, device=device)
    meta, splits = flash_mla.get_mla_metadata(lens, s_q * h_q, 1, num_heads_q=h_q, topk=topk)
    out, lse = flash_mla.flash_mla_with_kvcache(q, cache, None, lens, D_V, meta, splits, indices=indices,
                                                topk_length=length, attn_sink=sink, extra_k_cache=extra,
                                                extra_indices_in_kvcache=extra_indices, extra_topk_length=extra_length,
                                                is_fp8_kvcache=layout is not None)
    both, joined = _union_of_sources([ref_cache, ref_extra], [(indices, length), (extra_indices, extra_length)])
    ref = mla_sparse_decode_ref(q, both, joined, D_V, attn_sink=sink)
    _check(out, lse, *ref, dtype)
    assert (out[0] == 0).all() and torch.isposinf(lse[0]).all()


def _poison_unread_rows(kv, indices, topk_length=None):
    """NaN in every row of kv `(s_kv, h_kv, d)` (CPU) that no counted valid index of `indices (s_q, h_kv, topk)`
    names: a sparse prefill must never read those."""
    s_kv, h_kv = kv.shape[:2]
    used = torch.zeros(s_kv, h_kv, dtype=torch.bool)
    for i in range(indices.shape[0]):
        n = indices.shape[2] if topk_length is None else max(int(topk_length[i]), 0)
        for h in range(h_kv):
            row = indices[i, h, :n]
            used[row[(row >= 0) & (row < s_kv)].long(), h] = True
    kv[~used] = math.nan


def _check_sparse_prefill(got, ref, dtype):
    """flash_mla_sparse_fwd's `(out, max_logits, lse)` against `mla_sparse_prefill_ref`'s."""
    (out, max_logits, lse), (ref_out, ref_max, ref_lse) = got, ref
    _check(out.unsqueeze(0), lse.T.unsqueeze(0), ref_out.unsqueeze(0), ref_lse.T.unsqueeze(0), dtype)
    assert torch.equal(torch.isneginf(max_logits), torch.isneginf(ref_max)), "max_logits: -inf rows differ"
    finite = torch.isfinite(ref_max)
    if finite.any():
        assert (max_logits[finite] - ref_max[finite]).abs().max().item() <= 2e-3, "max_logits: max abs err"


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("h_q,h_kv,d_qk", [(16, 1, D_QK), (32, 2, D_QK), (64, 1, 512), (128, 1, D_QK)])
@pytest.mark.parametrize("with_sink", [False, True], ids=["", "sink"])
def test_sparse_prefill(target, h_q, h_kv, d_qk, with_sink):
    """flash_mla_sparse_fwd: indices -1 and past s_kv, topk_length trimming (0 included), a token whose indices
    are all invalid, NaN in every kv row no valid index names, one index row per KV head (h_kv = 2)."""
    device, dtype = target
    if device == "cpu" and h_q > 32:
        pytest.skip("h_q > 32 only at GPU sizes")
    s_q, s_kv, topk = (6, 300, 100) if device == "cpu" else (512, 16384, 2048)
    g = torch.Generator().manual_seed(h_q + d_qk)
    kv = torch.randn(s_kv, h_kv, d_qk, generator=g).to(dtype)
    indices = torch.randint(0, s_kv, (s_q, h_kv, topk), generator=g, dtype=torch.int32)
    indices[torch.rand(s_q, h_kv, topk, generator=g) < 0.1] = -1
    indices[torch.rand(s_q, h_kv, topk, generator=g) < 0.1] = s_kv + 7     # past the end: invalid too
    indices[1] = -1                                                        # a token that sees nothing
    topk_length = torch.randint(topk // 2, topk + 1, (s_q,), generator=g, dtype=torch.int32)
    topk_length[-1] = 0
    topk_length[0], topk_length[1] = topk + 3, -2                   # count as topk / 0
    _poison_unread_rows(kv, indices, topk_length)
    q = torch.randn(s_q, h_q, d_qk, generator=g).to(dtype)
    sink = torch.randn(h_q, generator=g) * 2 if with_sink else None
    q, kv, indices, topk_length = (t.to(device) for t in (q, kv, indices, topk_length))
    sink = sink.to(device) if with_sink else None
    scale = 0.07
    out, max_logits, lse = flash_mla.flash_mla_sparse_fwd(q, kv, indices, scale, d_v=D_V, attn_sink=sink,
                                                          topk_length=topk_length)
    _check_sparse_prefill((out, max_logits, lse), mla_sparse_prefill_ref(q, kv, indices, D_V, sm_scale=scale,
                                                                        attn_sink=sink, topk_length=topk_length),
                         dtype)
    assert (out[1] == 0).all() and torch.isposinf(lse[1]).all() and torch.isneginf(max_logits[1]).all()
    assert (out[-1] == 0).all() and torch.isposinf(lse[-1]).all()


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("layout", ["v32", "model1"])
@pytest.mark.parametrize("sparse", [False, True], ids=["paged", "sparse"])
def test_fp8_kvcache(target, layout, sparse):
    """FP8 caches, dequantised on load: the oracle runs on the same cache dequantised (`_dequantized`). NaN bytes are
    not possible in a packed cache, so unused pages hold packed 1e4s instead (far off the data's scale: a
    read would show); the sparse case also has -1 indices and a trimmed topk_length."""
    _fp8_case(target, layout, sparse, *((16, 2) if target[0] == "cpu" else (64, 2)))


def _fp8_case(target, layout, sparse, h_q, s_q):
    """test_fp8_kvcache's call with h_q query heads and s_q query tokens, against the oracle."""
    device, dtype = target
    d = LAYOUTS[layout][0]
    seqlens = [70, 0, 200, 5] if device == "cpu" else _seqlens(32, 2048, seed=12)
    bf16_cache, table = _paged_cache(seqlens, 64, 1, d, torch.bfloat16, device, seed=12)
    bf16_cache = torch.nan_to_num(bf16_cache, nan=1e4)
    packed = flash_mla.quantize_kv_cache(bf16_cache, layout)
    ref_cache = _dequantized(packed, layout, dtype)
    q = torch.randn(len(seqlens), s_q, h_q, d, device=device).to(dtype)
    lens = torch.tensor(seqlens, dtype=torch.int32, device=device)
    if not sparse:
        meta, splits = flash_mla.get_mla_metadata(lens, s_q * h_q, 1, is_fp8_kvcache=True)
        out, lse = flash_mla.flash_mla_with_kvcache(q, packed, table, lens, 512, meta, splits, causal=True,
                                                    is_fp8_kvcache=True)
        ref = mla_decode_ref(q, ref_cache, table, lens, 512, causal=True)
    else:
        topk = 96 if device == "cpu" else 1024
        # Token j of sequence b: flat position table[b, j // 64] * 64 + j % 64, for j < its length; else -1.
        j = torch.randint(0, 10 ** 6, (len(seqlens), s_q, topk), device=device) % lens.clamp(min=1)[:, None, None]
        flat_pos = (table.long().gather(1, (j // 64).flatten(1)).view_as(j) * 64 + j % 64).to(torch.int32)
        indices = torch.where((lens[:, None, None] > 0) & (torch.rand(j.shape, device=device) > 0.1), flat_pos, -1)
        topk_length = torch.full((len(seqlens),), topk, dtype=torch.int32, device=device)
        topk_length[0] = topk // 3
        meta, splits = flash_mla.get_mla_metadata(lens, s_q * h_q, 1, num_heads_q=h_q, topk=topk, is_fp8_kvcache=True)
        out, lse = flash_mla.flash_mla_with_kvcache(q, packed, None, lens, 512, meta, splits, is_fp8_kvcache=True,
                                                    indices=indices.to(torch.int32), topk_length=topk_length)
        ref = mla_sparse_decode_ref(q, ref_cache, indices, 512, topk_length=topk_length)
    _check(out, lse, *ref, dtype)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("shift", [-60, 100])
@pytest.mark.parametrize("layout", ["v32", "model1"])
def test_fp8_scale_range(target, layout, shift):
    """FP8 caches whose scales are far from 1 (about 2^shift): the Gluon kernel turns model1's e4m3 bytes into
    bf16 by bits (the value times 2^-120) and applies the UE8M0 scale as two power-of-two multiplies, the second
    one only taken past 2^127; V3.2's fp32 scales multiply in fp32. Keys and values are the usual ones times
    2^shift and q times 2^-shift, so the scores are unchanged; the output, times 2^-shift, is checked against the
    oracle on the same cache. bf16 only: 2^100 is past fp16's range (and the bit route is the bf16 Gluon
    kernel's)."""
    device, dtype = target
    if dtype != torch.bfloat16:
        pytest.skip("values of 2^100 need bf16")
    d = LAYOUTS[layout][0]
    h_q, s_q = 64, 2
    seqlens = _seqlens(16, 1024, seed=3)
    bf16_cache, table = _paged_cache(seqlens, 64, 1, d, torch.bfloat16, device, seed=3)
    bf16_cache = torch.nan_to_num(bf16_cache, nan=1e4) * 2.0 ** shift
    packed = flash_mla.quantize_kv_cache(bf16_cache, layout)
    if layout == "model1":
        log2_scales = model1_parts(packed)[1][..., :7].float() - 127
        log2_scales = log2_scales[log2_scales > -127]
    else:
        log2_scales = packed[..., 512:528].contiguous().view(torch.float32).log2()
    assert abs(log2_scales.median().item() - shift) < 16, "the scales are not where the test needs"
    ref_cache = _dequantized(packed, layout, dtype)
    q = (torch.randn(len(seqlens), s_q, h_q, d, device=device) * 2.0 ** -shift).to(dtype)
    lens = torch.tensor(seqlens, dtype=torch.int32, device=device)
    meta, splits = flash_mla.get_mla_metadata(lens, s_q * h_q, 1, is_fp8_kvcache=True)
    out, lse = flash_mla.flash_mla_with_kvcache(q, packed, table, lens, 512, meta, splits, causal=True,
                                                is_fp8_kvcache=True)
    ref_out, ref_lse = mla_decode_ref(q, ref_cache, table, lens, 512, causal=True)
    _check(out * 2.0 ** -shift, lse, ref_out * 2.0 ** -shift, ref_lse, dtype)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("squeeze", [False, True], ids=["4d", "3d"])
def test_mla_decode_split_tensors(target, squeeze):
    """vLLM's form (latent and rope in separate tensors) gives flash_mla_with_kvcache's answer."""
    q, cache, table, seqlens = _case(target, 16, 1, 64, seed=11)
    q_lat, q_rope = q[..., :D_V].contiguous(), q[..., D_V:].contiguous()
    kv_lat, k_rope = cache[:, :, 0, :D_V].contiguous(), cache[:, :, 0, D_V:].contiguous()
    if squeeze:
        q_lat, q_rope = q_lat[:, 0], q_rope[:, 0]
    out, lse = flash_mla.mla_decode(q_lat, q_rope, kv_lat, k_rope, table, seqlens)
    ref_out, ref_lse = mla_decode_ref(q, cache, table, seqlens, D_V)
    if squeeze:
        ref_out, ref_lse = ref_out[:, 0], ref_lse[..., 0]
    _check(out, lse, ref_out, ref_lse, target[1])


@pytest.mark.parametrize("target", TARGETS)
def test_forward_only(target):
    """The MLA entry points with a query that requires grad: the same outputs, and a backward that raises naming
    the entry point (`utils.assert_forward_only`)."""
    q, cache, table, seqlens = _case(target, 16, 1, 64, seed=12)
    meta, splits = flash_mla.get_mla_metadata(seqlens, 16, 1)
    assert_forward_only(lambda q: flash_mla.flash_mla_with_kvcache(q, cache, table, seqlens, D_V, meta, splits),
                        "flash_mla_with_kvcache", q)
    kv_lat, k_rope = cache[:, :, 0, :D_V], cache[:, :, 0, D_V:]
    assert_forward_only(lambda q_lat, q_rope: flash_mla.mla_decode(q_lat, q_rope, kv_lat, k_rope, table, seqlens),
                        "mla_decode", q[..., :D_V], q[..., D_V:])
    g = torch.Generator().manual_seed(3)
    kv = torch.randn(300, 1, D_QK, generator=g).to(cache.dtype).to(cache.device)
    indices = torch.randint(0, 300, (4, 1, 64), dtype=torch.int32, generator=g).to(cache.device)
    assert_forward_only(lambda q: flash_mla.flash_mla_sparse_fwd(q, kv, indices, 0.07, d_v=D_V),
                        "flash_mla_sparse_fwd", q[:4, 0])
    q, k, v, cu_q, cu_k, max_q, max_k = _dense_prefill_case(target, 2)
    assert_forward_only(lambda q: flash_mla.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k),
                        "flash_attn_varlen_func", q)


def _dense_prefill_case(target, seed):
    """Packed sequences for FlashMLA's dense prefill: DeepSeek's d_qk 192 / d_v 128, GQA, queries fewer than keys
    (bottom-right causal), an empty sequence and one of a single query; q, k and v inside NaN-filled buffers."""
    device, dtype = target
    torch.manual_seed(seed)
    (h_q, h_k), (lens_q, lens_k) = ((4, 2), ([17, 0, 1, 30], [40, 5, 9, 30])) if device == "cpu" else (
        (16, 4), ([700, 0, 1, 1500], [1200, 64, 9, 1500]))
    cu_q, cu_k = (torch.tensor([0] + lens, device=device).cumsum(0).to(torch.int32) for lens in (lens_q, lens_k))
    q = poisoned((sum(lens_q), h_q, 192), sum(lens_q), dtype, device, dim=0)
    k = poisoned((sum(lens_k), h_k, 192), sum(lens_k), dtype, device, dim=0)
    v = poisoned((sum(lens_k), h_k, 128), sum(lens_k), dtype, device, dim=0)
    return q, k, v, cu_q, cu_k, max(lens_q), max(lens_k)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_dense_prefill(target, causal):
    """FlashMLA's dense prefill names (`flash_attn_varlen_func` and its qkv / kv packed forms, [q | k | v] along the
    last dim) against the oracle: bottom-right causal over queries fewer than keys, LSE `(total_q, h_q)` laid out as
    FlashMLA's (a transposed `(h_q, total_q)` tensor). The packed forms, read in place, give the unpacked call's
    bits."""
    q, k, v, cu_q, cu_k, max_q, max_k = _dense_prefill_case(target, 31)
    scale = 0.07
    out, lse = flash_mla.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, softmax_scale=scale,
                                                causal=causal)
    ref, ref_lse = attention_varlen_ref(q, k, v, cu_q, cu_k, causal=causal, softmax_scale=scale)
    assert lse.shape == (q.shape[0], q.shape[1]) and lse.stride() == (1, q.shape[0])
    assert_matches(out, lse, (ref, ref_lse.T), target[1])
    kv = torch.cat([k, v], -1)
    got = flash_mla.flash_attn_varlen_kvpacked_func(q, kv, cu_q, cu_k, max_q, max_k, 192, softmax_scale=scale,
                                                    causal=causal)
    assert all(torch.equal(a, b) for a, b in zip(got, (out, lse)))
    # One packed tensor (a self-attention prefill: the queries' sequences are the keys'), every part h_q heads.
    group, total = q.shape[1] // k.shape[1], q.shape[0]
    qkv = torch.cat([q, k[:total].repeat_interleave(group, 1), v[:total].repeat_interleave(group, 1)], -1)
    out, lse = flash_mla.flash_attn_varlen_qkvpacked_func(qkv, cu_q, max_q, 192, softmax_scale=scale, causal=causal)
    ref, ref_lse = attention_varlen_ref(qkv[..., :192], qkv[..., 192:384], qkv[..., 384:], cu_q, cu_q, causal=causal,
                                        softmax_scale=scale)
    assert_matches(out, lse, (ref, ref_lse.T), target[1])


def test_dense_prefill_bad_input():
    """FlashMLA's dense prefill names: what fmha does not do (dropout, the non-varlen form) and bad packed widths
    raise naming the argument, and attention_varlen's own checks name FlashMLA's arguments (cu_seqlens_qo, qkv)."""
    q, k, v, cu_q, cu_k, max_q, max_k = _dense_prefill_case(("cpu", torch.float16), 1)
    call = flash_mla.flash_attn_varlen_func
    for kwargs, error, start in [(dict(dropout_p=0.1), ValueError, "dropout_p:"),
                                 (dict(is_varlen=False), ValueError, "is_varlen:"),
                                 (dict(deterministic=1), TypeError, "deterministic:")]:
        with pytest.raises(error, match=f"^{start}"):
            call(q, k, v, cu_q, cu_k, max_q, max_k, **kwargs)
    with pytest.raises(TypeError, match="^cu_seqlens_qo:"):
        call(q, k, v, cu_q.float(), cu_k, max_q, max_k)
    with pytest.raises(ValueError, match="^cu_seqlens_kv:"):
        call(q, k, v, cu_q, cu_k[:-1].clone(), max_q, max_k)
    with pytest.raises(TypeError, match="^max_seqlen_kv:"):
        call(q, k, v, cu_q, cu_k, max_q, 3.5)
    kv = torch.cat([k, v], -1)
    with pytest.raises(ValueError, match="^head_dim_qk:"):
        flash_mla.flash_attn_varlen_kvpacked_func(q, kv, cu_q, cu_k, max_q, max_k, 320)
    with pytest.raises(TypeError, match="^head_dim_qk:"):
        flash_mla.flash_attn_varlen_kvpacked_func(q, kv, cu_q, cu_k, max_q, max_k, 192.0)
    qkv = torch.cat([q, q, q[..., :128]], -1)
    with pytest.raises(ValueError, match="^qkv:"):
        flash_mla.flash_attn_varlen_qkvpacked_func(qkv, cu_q, max_q, 190)
    with pytest.raises(TypeError, match="^cu_seqlens:"):
        flash_mla.flash_attn_varlen_qkvpacked_func(qkv, cu_q.float(), max_q, 192)


@pytest.mark.parametrize("overhead", [0, PIECE_OVERHEAD])
@pytest.mark.parametrize("seed", range(6))
def test_plan_mla_covers_every_block_once(seed, overhead):
    """Every key block of every sequence belongs to exactly one part; split slots are exactly the pieces each
    sequence is cut into; parts carry equal work: with no per-sequence overhead equal shares of blocks (only the
    last working part has less), with one each part's blocks plus the overhead of the sequences it starts
    within one overhead of an equal share of the total."""
    g = torch.Generator().manual_seed(seed)
    b = int(torch.randint(1, 40, (1,), generator=g))
    lens = torch.randint(0, 3000, (b,), generator=g).to(torch.int32)
    lens[torch.rand(b, generator=g) < 0.2] = 0
    parts = int(torch.randint(1, 140, (1,), generator=g))
    meta, offsets = plan_mla(lens, parts, piece_overhead=overhead)
    blocks = ((lens + SCHED_BLOCK - 1) // SCHED_BLOCK).tolist()
    seen = [[0] * n for n in blocks]
    pieces = [[] for _ in blocks]
    cost = [0] * parts
    for p, (batch, blk, count, split) in enumerate(meta[:, :4].tolist()):
        first = True
        cost[p] = count
        while count > 0:
            assert batch < b
            take = min(blocks[batch] - blk, count)
            if take > 0:
                for i in range(blk, blk + take):
                    seen[batch][i] += 1
                pieces[batch].append((p, split if first else 0))
                cost[p] += overhead if blk == 0 else 0
                first = False
                count -= take
            batch, blk = batch + 1, 0
    assert all(c == 1 for row in seen for c in row)
    for batch, found in enumerate(pieces):
        n = offsets[batch + 1] - offsets[batch]
        assert len(found) == n
        assert sorted(s for _, s in found) == list(range(n))
    per_part = meta[:, 2]
    assert per_part.sum() == sum(blocks)
    if overhead == 0:
        working = per_part[per_part > 0]
        assert (working[:-1] == per_part.max()).all()
    share = -(-sum(n + overhead * (n > 0) for n in blocks) // parts)
    assert max(cost) <= share + overhead, (cost, share)


@pytest.mark.cpu
@pytest.mark.parametrize("n, parts, whole", [(128, 66, True), (256, 66, True), (128, 132, True), (119, 132, False),
                                             (100, 66, False), (66, 66, True)])
def test_plan_mla_whole_sequences(n, parts, whole):
    """Equal lengths and at most 10% over an equal share: whole sequences per part (one piece each, nothing to
    merge; with fewer sequences than parts, some parts idle). Otherwise equal shares cut sequences; unequal
    lengths never go whole."""
    lens = torch.full((n,), 2048, dtype=torch.int32)
    meta, offsets = plan_mla(lens, parts)
    blocks = 2048 // SCHED_BLOCK
    pieces = offsets[1:] - offsets[:-1]
    assert int(meta[:, 2].sum()) == n * blocks
    if whole:
        assert (pieces == 1).all()
        assert int(meta[:, 2].max()) == -(-n // parts) * blocks
        working = meta[meta[:, 2] > 0]
        assert (working[:, 1] == 0).all() and (working[:, 3] == 0).all()   # each starts a sequence, split 0
    else:
        assert (pieces > 1).any()
    lens[0] -= SCHED_BLOCK                      # one shorter sequence: equal shares again
    meta, offsets = plan_mla(lens, parts, piece_overhead=0)
    assert int(meta[:, 2].max()) == -(-(n * blocks - 1) // parts)
    meta, offsets = plan_mla(lens, parts)        # with the per-sequence overhead: no part left with one block
    pieces = meta[:, 2][meta[:, 2] > 0]
    assert int(pieces.sum()) == n * blocks - 1 and int(pieces.min()) > 1


@pytest.mark.cpu
def test_plan_mla_empty_batch():
    meta, offsets = plan_mla(torch.zeros(0, dtype=torch.int32), 8)
    assert meta.shape == (8, SCHED_FIELDS) and int(meta[:, 2].sum()) == 0 and offsets.tolist() == [0]


@pytest.mark.cpu
def test_uniform_plan_is_kept():
    """The token-sparse calls' plan (every row the same length) is plan_mla's, made once and then reused."""
    device = torch.device("cpu")
    lengths, meta, splits = uniform_plan(7, 300, 3, device)
    ref_meta, ref_splits = plan_mla(torch.full((7,), 300, dtype=torch.int32), 3)
    assert lengths.tolist() == [300] * 7
    assert torch.equal(meta, ref_meta) and torch.equal(splits, ref_splits)
    again = uniform_plan(7, 300, 3, device)
    assert all(a is b for a, b in zip(again, (lengths, meta, splits)))
    assert uniform_plan(7, 301, 3, device)[1] is not meta


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("form,h_q", [("dense", 16), ("dense", 64), ("dense", 128), ("sparse", 64), ("prefill", 64),
                                      ("v32", 64), ("model1", 64)], ids=lambda x: str(x))
def test_past_2g_elements(target, form, h_q):
    """Caches whose used pages (dense, FP8 paged) or indexed tokens (sparse decode, sparse prefill) start more
    than 2^31 elements (bytes for FP8) into the cache tensor (`far_pages`), as in a serving engine's KV pool:
    every row address must be 64-bit, although each page index, flat token position and stride fits int32."""
    device, dtype = target
    if device == "cpu" and h_q == 128:
        pytest.skip("h_q=128 only at GPU sizes")
    g = torch.Generator().manual_seed(h_q)
    seqlens = [70, 0, 200, 5] if device == "cpu" else _seqlens(8, 1500, seed=h_q)
    lens = torch.tensor(seqlens, dtype=torch.int32, device=device)
    s_q = 2
    if form == "prefill":
        s_kv, topk = (300, 100) if device == "cpu" else (4096, 512)
        kv = torch.randn(s_kv, 1, D_QK, generator=g).to(dtype)
        indices = torch.randint(-1, s_kv, (6, 1, topk), generator=g, dtype=torch.int32)
        used = torch.zeros(s_kv, dtype=torch.bool)
        used[indices[indices >= 0].long()] = True
        kv[~used] = math.nan
        q = torch.randn(6, h_q, D_QK, generator=g).to(dtype)
        q, kv, indices = (t.to(device) for t in (q, kv, indices))
        (far,), _, shift = far_pages(None, kv)
        out, _, lse = flash_mla.flash_mla_sparse_fwd(q, far, torch.where(indices >= 0, indices + shift, -1), 0.07)
        ref_out, _, ref_lse = mla_sparse_prefill_ref(q, kv, indices, D_V, sm_scale=0.07)
        _check(out.unsqueeze(0), lse.T.unsqueeze(0), ref_out.unsqueeze(0), ref_lse.T.unsqueeze(0), dtype)
        return
    fp8 = form in ("v32", "model1")
    d = LAYOUTS[form][0] if fp8 else D_QK
    cache, table = _paged_cache(seqlens, 64, 1, d, dtype, device, seed=h_q)
    ref_cache = cache
    if fp8:
        cache = flash_mla.quantize_kv_cache(torch.nan_to_num(cache.bfloat16(), nan=1e4), form)
        ref_cache = _dequantized(cache, form, dtype)
    q = torch.randn(len(seqlens), s_q, h_q, d, generator=g).to(dtype).to(device)
    (far,), far_table, shift = far_pages(table, cache)
    if form == "sparse":
        topk = 96 if device == "cpu" else 1024
        j = torch.randint(0, 10 ** 6, (len(seqlens), s_q, topk), generator=g).to(device) % lens.clamp(min=1)[:, None, None]
        flat = table.long().gather(1, (j // 64).flatten(1)).view_as(j) * 64 + j % 64
        indices = torch.where(lens[:, None, None] > 0, flat, -1).to(torch.int32)
        meta, splits = flash_mla.get_mla_metadata(lens, s_q * h_q, 1, num_heads_q=h_q, topk=topk)
        out, lse = flash_mla.flash_mla_with_kvcache(q, far, None, lens, D_V, meta, splits,
                                                    indices=torch.where(indices >= 0, indices + shift * 64, -1))
        ref = mla_sparse_decode_ref(q, ref_cache, indices, D_V)
    else:
        meta, splits = flash_mla.get_mla_metadata(lens, s_q * h_q, 1, is_fp8_kvcache=fp8)
        out, lse = flash_mla.flash_mla_with_kvcache(q, far, far_table, lens, D_V, meta, splits, causal=True,
                                                    is_fp8_kvcache=fp8)
        ref = mla_decode_ref(q, ref_cache, table, lens, D_V, causal=True)
    _check(out, lse, *ref, dtype)


@pytest.mark.gpu
def test_mla_cuda_graph():
    """Plan once, capture one decode call in a CUDA graph, replay with new queries and new lengths."""
    dtype = torch.bfloat16
    seqlens = _seqlens(64, 2048, seed=5)
    cache, table = _paged_cache([4096] * 64, 64, 1, D_QK, dtype, "cuda", seed=5)
    lens = torch.tensor(seqlens, dtype=torch.int32, device="cuda")
    q = torch.randn(64, 2, 128, D_QK, device="cuda", dtype=dtype)
    meta, splits = flash_mla.get_mla_metadata(lens, 256, 1)
    flash_mla.flash_mla_with_kvcache(q, cache, table, lens, D_V, meta, splits, causal=True)   # compile
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        new_meta, new_splits = flash_mla.get_mla_metadata(lens, 256, 1)
        out, lse = flash_mla.flash_mla_with_kvcache(q, cache, table, lens, D_V, new_meta, new_splits, causal=True)
    q.copy_(torch.randn_like(q))
    lens.copy_(torch.tensor(_seqlens(64, 3000, seed=6), dtype=torch.int32).clamp(max=4096))
    graph.replay()
    torch.cuda.synchronize()
    _check(out, lse, *mla_decode_ref(q, cache, table, lens, D_V, causal=True), dtype)


@pytest.mark.gpu
def test_sparse_plans_under_compiled_graphs(monkeypatch):
    """torch.compile's CUDA graphs (mode="reduce-overhead") around a sparse decode layer, compiled calls (warm-up,
    recording, replays) and eager ones alternating, every result checked. The kept uniform plans
    (`schedule._kept`) are first made inside the compiled layer's warm-up, whose allocations torch routes to the
    graph's private pool; one left alive there fails the next compiled call ("tensor(s) in the cudagraph pool not
    tracked as outputs"), and one the graph's memory is reused over would show as wrong rows."""
    from fmha import schedule

    monkeypatch.setattr(schedule, "_KEPT", {})                # the plans are made here, not by an earlier test
    b, s_q, h_q, topk, dtype = 5, 1, 64, 320, torch.bfloat16
    g = torch.Generator().manual_seed(17)
    cache, indices, length = _sparse_source(b, s_q, topk, 3000, 64, D_QK, dtype, "cuda", g)
    q = torch.randn(b, s_q, h_q, D_QK, generator=g).to(dtype).cuda()
    lens = torch.zeros(b, dtype=torch.int32, device="cuda")
    ref = mla_sparse_decode_ref(q, cache, indices, D_V, topk_length=length)

    def layer(q):
        meta, splits = flash_mla.get_mla_metadata(lens, s_q * h_q, 1, num_heads_q=h_q, topk=topk)
        out, lse = flash_mla.flash_mla_with_kvcache(q, cache, None, lens, D_V, meta, splits, indices=indices,
                                                    topk_length=length)
        return out * 1.0, lse * 1.0          # copies the graph owns
    compiled = torch.compile(layer, mode="reduce-overhead", fullgraph=True)
    for _ in range(5):
        out, lse = compiled(q)
        _check(out.clone(), lse.clone(), *ref, dtype)
        _check(*layer(q), *ref, dtype)
    assert len(schedule._KEPT) > 0, "the plans were kept"


def test_mla_bad_input():
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    q = torch.randn(2, 1, 16, D_QK, device=dev, dtype=torch.float16)
    cache = torch.randn(4, 64, 1, D_QK, device=dev, dtype=torch.float16)
    table = torch.zeros(2, 2, dtype=torch.int32, device=dev)
    lens = torch.tensor([5, 70], dtype=torch.int32, device=dev)
    meta, splits = flash_mla.get_mla_metadata(lens, 16, 1)
    call = flash_mla.flash_mla_with_kvcache
    with pytest.raises(TypeError, match="k_cache: expected dtype"):
        call(q, cache.bfloat16(), table, lens, D_V, meta, splits)
    with pytest.raises(ValueError, match="k_cache: last dim"):
        call(q, cache[..., :512], table, lens, D_V, meta, splits)
    with pytest.raises(ValueError, match="head_dim_v"):
        call(q, cache, table, lens, 500, meta, splits)
    with pytest.raises(TypeError, match="cache_seqlens: expected dtype"):
        call(q, cache, table, lens.long(), D_V, meta, splits)
    with pytest.raises(ValueError, match="block_table"):
        call(q, cache, table[:1], lens, D_V, meta, splits)
    with pytest.raises(ValueError, match="num_splits"):
        call(q, cache, table, lens, D_V, meta, splits[:-1])
    with pytest.raises(ValueError, match="tile_scheduler_metadata"):
        call(q, cache, table, lens, D_V, meta[:, :4], splits)
    with pytest.raises(TypeError, match="causal"):
        call(q, cache, table, lens, D_V, meta, splits, causal=1)
    with pytest.raises(TypeError, match="k_cache: expected dtype"):
        call(q, cache, table, lens, D_V, meta, splits, is_fp8_kvcache=True)
    with pytest.raises(ValueError, match="extra_k_cache: only used with indices"):
        call(q, cache, table, lens, D_V, meta, splits, extra_k_cache=cache)
    with pytest.raises(ValueError, match="attn_sink"):
        call(q, cache, table, lens, D_V, meta, splits, attn_sink=torch.zeros(8, device=dev))
    with pytest.raises(ValueError, match="num_heads_k"):
        flash_mla.get_mla_metadata(lens, 16, 0)
    with pytest.raises(ValueError, match="q_rope"):
        flash_mla.mla_decode(q[..., :D_V], None, cache[:, :, 0, :D_V], cache[:, :, 0, D_V:], table, lens)


def test_sparse_bad_input():
    """Sparse inputs are checked before any launch: a bad extra source raises and writes nothing."""
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    q = torch.randn(2, 1, 16, D_QK, device=dev, dtype=torch.float16)
    cache = torch.randn(4, 64, 1, D_QK, device=dev, dtype=torch.float16)
    lens = torch.zeros(2, dtype=torch.int32, device=dev)
    indices = torch.zeros(2, 1, 8, dtype=torch.int32, device=dev)
    meta, splits = flash_mla.get_mla_metadata(lens, 16, 1, num_heads_q=16, topk=8)
    call = flash_mla.flash_mla_with_kvcache
    with pytest.raises(ValueError, match="extra_indices_in_kvcache: expected"):
        call(q, cache, None, lens, D_V, meta, splits, indices=indices, extra_k_cache=cache,
             extra_indices_in_kvcache=indices[:1])
    with pytest.raises(ValueError, match="extra_indices_in_kvcache: required"):
        call(q, cache, None, lens, D_V, meta, splits, indices=indices, extra_k_cache=cache)
    with pytest.raises(ValueError, match="causal"):
        call(q, cache, None, lens, D_V, meta, splits, indices=indices, causal=True)
    with pytest.raises(ValueError, match="num_splits"):
        call(q, cache, None, lens, D_V, meta, splits[:-1], indices=indices)
    with pytest.raises(ValueError, match="num_heads_q"):
        flash_mla.get_mla_metadata(lens, 16, 1, topk=8)


def test_sparse_prefill_bad_input():
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    q = torch.randn(4, 16, D_QK, device=dev, dtype=torch.float16)
    kv = torch.randn(32, 1, D_QK, device=dev, dtype=torch.float16)
    indices = torch.zeros(4, 1, 8, dtype=torch.int32, device=dev)
    call = flash_mla.flash_mla_sparse_fwd
    with pytest.raises(ValueError, match="kv"):
        call(q, kv[..., :512], indices, 0.1)
    with pytest.raises(ValueError, match="kv: heads"):
        call(q, torch.randn(32, 3, D_QK, device=dev, dtype=torch.float16), indices, 0.1)
    with pytest.raises(ValueError, match="indices"):
        call(q, kv, indices[:3], 0.1)
    with pytest.raises(TypeError, match="indices"):
        call(q, kv, indices.long(), 0.1)
    with pytest.raises(ValueError, match="topk_length"):
        call(q, kv, indices, 0.1, topk_length=torch.zeros(3, dtype=torch.int32, device=dev))
    with pytest.raises(ValueError, match="d_v"):
        call(q, kv, indices, 0.1, d_v=100)
    with pytest.raises(ValueError, match="attn_sink"):
        call(q, kv, indices, 0.1, attn_sink=torch.zeros(8, device=dev))


@pytest.mark.cpu
def test_gluon_views():
    """The TMA views the Hopper MLA kernel would use (pure stride logic, checked on CPU tensors): q's (s_q, h_q)
    merge into packed rows only when s_q's stride is h_q rows; a cache is viewed as (pages, page, d) with one KV
    head; a 16-byte misaligned stride is refused."""
    from fmha.kernels.mla_decode_sm90 import _view3
    q = torch.zeros(3, 2, 16, 576, dtype=torch.float16)
    assert _view3(q[..., :512], (1, 2)) == ([3, 32, 512], [2 * 16 * 576, 576, 1])
    assert _view3(q.transpose(1, 2)[..., :512], (1, 2)) is None          # (s, h) not packable
    cache = torch.zeros(5, 64, 1, 576, dtype=torch.float16)
    assert _view3(cache[..., 512:], (1,)) == ([5, 64, 64], [64 * 576, 576, 1])
    assert _view3(torch.zeros(5, 64, 2, 576, dtype=torch.float16), (1,)) is None   # two KV heads
    assert _view3(torch.zeros(5, 64, 1, 577, dtype=torch.float16)[..., :576], (1,)) is None   # 1154-byte rows


@pytest.mark.cpu
def test_gather_row_alignment():
    """The Gluon gathers vectorise on the rows' alignment the host finds: V3.2's 656-byte FP8 rows are 16-byte
    aligned, model1's 584-byte ones 8, a sliced bf16 view of 576-column rows 16, and an odd row stride less."""
    from fmha.kernels.mla_decode_sm90 import row_alignment
    v32 = torch.zeros(4, 64, 1, 656, dtype=torch.uint8)
    model1 = torch.zeros(4, 64, 1, 584, dtype=torch.uint8)
    bf16 = torch.zeros(4, 64, 1, 576, dtype=torch.bfloat16)
    odd = torch.zeros(4, 64, 1, 579, dtype=torch.bfloat16)[..., :512]
    assert row_alignment(v32) == 16 and row_alignment(model1) == 8
    assert row_alignment(bf16[..., :512], bf16[..., 512:]) == 16
    assert row_alignment(v32, model1) == 8 and row_alignment(odd) == 2


@pytest.mark.cpu
@pytest.mark.parametrize("h_q,s_q", [(16, 1), (16, 2), (64, 1)], ids=["transposed16", "transposed32", "rows64"])
@pytest.mark.parametrize("page_size", [61, 64])
def test_gpu_tile_shapes(h_q, s_q, page_size, monkeypatch):
    """The interpreter runs its own small tiles; this runs the portable MLA kernel's GPU tiles (64-key tiles, one
    scheduling block each; the transposed forms at 16 and 32 rows, the 64-row form) through the launcher."""
    from fmha.kernels import mla_decode
    monkeypatch.setattr(mla_decode, "_INTERPRET_TILES", mla_decode._GPU_TILES)
    monkeypatch.setattr(mla_decode, "_INTERPRET_TRANSPOSED_TILES", mla_decode._GPU_TRANSPOSED_TILES)
    q, cache, table, seqlens = _case(("cpu", torch.float16), h_q, s_q, page_size, seed=3 * h_q + s_q)
    meta, splits = flash_mla.get_mla_metadata(seqlens, s_q * h_q, 1)
    out = q.new_empty(*q.shape[:3], D_V)
    lse = torch.empty(q.shape[0], q.shape[2], q.shape[1], dtype=torch.float32)
    mla_decode_forward(q[..., :D_V], q[..., D_V:], cache[..., :D_V], cache[..., D_V:], table, seqlens, meta, splits,
                       out, lse, softmax_scale=D_QK ** -0.5, causal=s_q > 1, interpret=True)
    _check(out, lse, *mla_decode_ref(q, cache, table, seqlens, D_V, causal=s_q > 1), torch.float16)
