"""The Hopper Gluon MLA decode kernel (`kernels/mla_decode_sm90.py`) against the fp32 oracle, on the GPU only
(Gluon does not run in the interpreter). Each case asserts that the call really took the Gluon path (a
silent fall-back to the portable kernel cannot pass here), with FlashMLA's test semantics: lengths around a
mean with a zero among them, shuffled pages in a NaN-filled cache, NaN past every length."""
import pytest
import torch

import fmha.mla as flash_mla
from fmha.kernels import mla_decode_sm90, sparse_decode_sm90
import test_mla              # as a module: its test functions, imported by name, would be collected here again
from fmha.reference import mla_decode_ref, mla_sparse_decode_ref
from test_mla import D_QK, D_V, _check, _dequantized, _paged_cache, _seqlens
from utils import spy

pytestmark = pytest.mark.gpu


def _launches(monkeypatch, module, name):
    """A list that grows by one at each call of `module.name` (a kernel's launcher); skips off sm_90."""
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("not an sm_90 GPU")
    return spy(monkeypatch, module, name)


@pytest.fixture
def gluon_calls(monkeypatch):
    """Counts launches of the Gluon kernel; skips off sm_90."""
    return _launches(monkeypatch, mla_decode_sm90, "mla_decode_forward_sm90")


def _run(seqlens, h_q, s_q, page_size, dtype, *, seed=0, sinks=False, scale=None, ramp=None):
    """`ramp(positions)`: a factor per key position that each sequence's keys are multiplied by (NaN stays NaN)."""
    cache, table = _paged_cache(seqlens, page_size, 1, D_QK, dtype, "cuda", seed)
    if ramp is not None:
        pos = torch.arange(table.shape[1] * page_size, device="cuda")
        rows = (table.long()[:, pos // page_size] * page_size + pos % page_size).flatten()
        flat = cache.view(-1, D_QK)
        flat[rows] = (flat[rows].float() * ramp(pos.float()).repeat(len(seqlens))[:, None]).to(dtype)
    q = torch.randn(len(seqlens), s_q, h_q, D_QK, generator=torch.Generator().manual_seed(seed + 1)).to(dtype).cuda()
    lens = torch.tensor(seqlens, dtype=torch.int32, device="cuda")
    sink = torch.randn(h_q, device="cuda") * 2 if sinks else None
    meta, splits = flash_mla.get_mla_metadata(lens, s_q * h_q, 1)
    out, lse = flash_mla.flash_mla_with_kvcache(q, cache, table, lens, D_V, meta, splits, causal=s_q > 1,
                                                softmax_scale=scale, attn_sink=sink)
    ref = mla_decode_ref(q, cache, table, lens, D_V, causal=s_q > 1, softmax_scale=scale, attn_sink=sink)
    _check(out, lse, *ref, dtype)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("h_q,s_q", [(64, 1), (128, 1), (64, 2), (128, 2), (32, 2), (16, 4), (32, 1), (16, 2), (16, 1),
                                     (8, 1), (4, 2), (2, 3), (1, 1)])
def test_gluon_mla(gluon_calls, h_q, s_q, dtype):
    """Packed rows (h_q x s_q) from 1 to 256: up to 32 run `mla_rows_sm90`'s transposed products (16 or 32 rows:
    tensor parallelism's 8 or 4 heads a rank, h_q 16 and 32), 33-63 fill one zero-padded 64-row block, more take
    several."""
    _run(_seqlens(48, 3000, seed=h_q + s_q), h_q, s_q, 64, dtype, seed=h_q * s_q)
    assert gluon_calls


@pytest.mark.parametrize("h_q", [128, 16])
@pytest.mark.parametrize("page_size", [128, 256])
def test_gluon_mla_pages(gluon_calls, page_size, h_q):
    """Tiles are 64-key slices of bigger pages (64-row blocks and `mla_rows_sm90`)."""
    _run(_seqlens(16, 1000, seed=page_size), h_q, 1, page_size, torch.bfloat16, seed=page_size, scale=0.05)
    assert gluon_calls


@pytest.mark.parametrize("seqlens,h_q", [([1], 128), ([63, 64, 65, 0, 127, 128, 129], 128), ([16000], 64),
                                         ([5, 9000, 1, 3000], 128), ([1], 16), ([63, 64, 65, 0, 127, 128, 129], 16),
                                         ([16000], 16), ([5, 9000, 1, 3000], 32)],
                         ids=["one-key", "tile-edges", "long-split", "far-apart", "one-key-rows", "tile-edges-rows",
                              "long-split-rows", "far-apart-rows"])
def test_gluon_mla_lengths(gluon_calls, seqlens, h_q):
    """Lengths at tile edges (odd tile counts leave warpgroup 1 without a tile), a single key, one sequence
    split over every SM, lengths far apart (parts that finish one sequence and start the next); "-rows": the same
    through `mla_rows_sm90` (<= 32 packed rows: one key tile at a time, no pairs). (The oracle
    expands K per query head in fp32: long sequences use h_q = 64 to stay small under pytest-xdist.)"""
    _run(seqlens, h_q, 1, 64, torch.bfloat16, seed=len(seqlens))
    assert gluon_calls


@pytest.mark.parametrize("h_q", [64, 16])
@pytest.mark.parametrize("s_q", [1, 2])
def test_gluon_mla_sinks(gluon_calls, s_q, h_q):
    _run(_seqlens(20, 2000, seed=5), h_q, s_q, 64, torch.bfloat16, seed=9, sinks=True)
    assert gluon_calls


@pytest.mark.parametrize("ramp", [lambda j: 1 + j / 150, lambda j: 2.0 ** (j // 256), lambda j: 8 - j / 150],
                         ids=["rising", "steps", "falling"])
@pytest.mark.parametrize("h_q,s_q", [(128, 1), (64, 2), (16, 2)])
def test_gluon_mla_moving_max(gluon_calls, ramp, h_q, s_q):
    """Scores whose row max climbs a little every tile, by large steps, or falls: the running max moves by less
    and by more than the lazy rescale's threshold (`LAZY_BY`, 8 log2 units at this scale), so the stale-max path
    and the rescales after it both run."""
    _run([1000, 700, 1100, 64, 0], h_q, s_q, 64, torch.bfloat16, seed=11, scale=0.15, ramp=ramp)
    assert gluon_calls


def test_gluon_mla_launch_plan_reuse(gluon_calls, monkeypatch):
    """A decode loop's steps of one call key (new caches, queries, lengths, tables and schedules each step) take the
    launch plan the first made (`mla_decode._ROUTES`, and the combine's, `combine._PLANS`), each against the
    oracle."""
    from fmha.kernels import combine, mla_decode
    plans = []
    real = mla_decode_sm90._plan
    monkeypatch.setattr(mla_decode_sm90, "_plan", lambda *a, **kw: plans.append(1) or real(*a, **kw))
    for seed, seqlens in enumerate([[1000, 700, 1100, 64, 0], [1100, 5, 900, 1090, 300], [3, 1100, 1100, 2, 640]]):
        _run(seqlens, 64, 2, 64, torch.bfloat16, seed=seed, sinks=True)
    assert len(gluon_calls) == 3 and len(plans) == 1
    assert len(mla_decode._ROUTES) == 1 and len(combine._PLANS) == 1


@pytest.mark.parametrize("s_q", [4, 2])
def test_gluon_mla_causal_short(gluon_calls, s_q):
    """s_q = 4 (64 rows) and 2 (32: `mla_rows_sm90`) with caches shorter than s_q: queries that see no key give 0
    and LSE +inf."""
    _run([2, 0, 1, 4, 3 * 64 + 5], 16, s_q, 64, torch.bfloat16, seed=3)
    assert gluon_calls


@pytest.mark.parametrize("h_q,s_q,kernel", [(16, 2, "mla_rows_sm90_kernel"), (8, 1, "mla_rows_sm90_kernel"),
                                            (32, 1, "mla_rows_sm90_kernel"), (16, 4, "mla_decode_sm90_kernel"),
                                            (64, 1, "mla_decode_sm90_kernel")])
def test_gluon_mla_rows_kernel_route(gluon_calls, monkeypatch, h_q, s_q, kernel):
    """Dense calls with at most 32 packed rows (`ROWS_KERNEL_MAX`) launch `mla_rows_sm90`'s transposed products;
    more rows, 64-row blocks."""
    from fmha.kernels import launch, mla_decode
    monkeypatch.setattr(launch, "RECORD", [])
    mla_decode._ROUTES.clear()
    _run([300, 2000], h_q, s_q, 64, torch.bfloat16, seed=4)
    assert [name for name, _, _ in launch.RECORD if name.startswith("mla_")] == [kernel]


@pytest.mark.parametrize("h_q,d_qk", [(16, D_QK), (128, D_QK), (64, 512), (4, D_QK)])
@pytest.mark.parametrize("with_sink", [False, True], ids=["", "sink"])
def test_gluon_sparse_prefill(gluon_calls, h_q, d_qk, with_sink):
    """flash_mla_sparse_fwd through the Gluon kernel's gather path (one KV head; 576 columns, or V4's 512 with
    no separate RoPE part): invalid and past-the-end indices, trimmed rows, a token with nothing valid, NaN in
    every row no valid index names; max_logits too. The cases are test_mla's."""
    test_mla.test_sparse_prefill(("cuda", torch.bfloat16), h_q, 1, d_qk, with_sink)
    assert gluon_calls


@pytest.mark.parametrize("case", ["prefill-576", "prefill-512-sink", "decode"])
def test_gluon_bf16_loader(gluon_calls, monkeypatch, case):
    """bf16 token-sparse calls through the loading warpgroup, which `uses_loader` never gives them (measured no
    faster), forced on here: the sparse prefill (its first tiles then come from the loader, not warpgroup 0) and a
    sparse decode with split tokens."""
    loaders = []
    monkeypatch.setattr(mla_decode_sm90, "uses_loader", lambda *args: loaders.append(1) or True)
    if case == "decode":
        test_mla.test_sparse_decode(("cuda", torch.bfloat16), 64, 3, 61, True)
    else:
        test_mla.test_sparse_prefill(("cuda", torch.bfloat16), 128 if case == "prefill-576" else 64, 1,
                                     D_QK if case == "prefill-576" else 512, case.endswith("sink"))
    assert gluon_calls and loaders


@pytest.mark.parametrize("h_q", [64, 128])
def test_gluon_head_dim_512(gluon_calls, h_q):
    """Dense paged decode with V4's head_dim 512 (no RoPE part: Q·Kᵀ over the two latent halves only)."""
    test_mla.test_head_dim_512(("cuda", torch.bfloat16), h_q)
    assert gluon_calls


@pytest.mark.parametrize("h_q,s_q,page_size", [(16, 1, 64), (64, 3, 61), (128, 1, 64), (8, 1, 64), (2, 3, 61)])
@pytest.mark.parametrize("with_sink", [False, True], ids=["", "sink"])
def test_gluon_sparse_decode(gluon_calls, h_q, s_q, page_size, with_sink):
    """bf16 token-sparse decode through the gather path: split tokens (partials + combine), odd page sizes, as few
    as 6 packed rows."""
    test_mla.test_sparse_decode(("cuda", torch.bfloat16), h_q, s_q, page_size, with_sink)
    assert gluon_calls


@pytest.mark.parametrize("layout", ["v32", "model1"])
@pytest.mark.parametrize("sparse", [False, True], ids=["paged", "sparse"])
def test_gluon_fp8(gluon_calls, layout, sparse):
    """FP8 caches (DeepSeek-V3.2's and V4's layouts) through the gather path: e4m3 bytes and scales land by
    cp.async and are dequantised in shared memory (test_mla's FP8 cases: 1e4s packed in unused pages, -1
    indices, trimming)."""
    test_mla.test_fp8_kvcache(("cuda", torch.bfloat16), layout, sparse)
    assert gluon_calls


@pytest.mark.parametrize("layout", ["v32", "model1"])
@pytest.mark.parametrize("sparse", [False, True], ids=["paged", "sparse"])
@pytest.mark.parametrize("h_q,s_q", [(8, 1), (1, 3)])
def test_gluon_fp8_few_rows(gluon_calls, layout, sparse, h_q, s_q):
    """FP8 caches with fewer packed rows than a 64-row block holds (one zero-padded block; the FP8 sparse decode's
    own kernel, `sparse_decode_sm90`, takes whole 64-row blocks only)."""
    test_mla._fp8_case(("cuda", torch.bfloat16), layout, sparse, h_q, s_q)
    assert gluon_calls


@pytest.mark.parametrize("with_sink", [False, True], ids=["", "sink"])
@pytest.mark.parametrize("layout", [None, "model1"], ids=["bf16", "fp8-model1"])
def test_gluon_extra_kv_source(gluon_calls, with_sink, layout):
    """DeepSeek-V4's two sources (page 256 + a page-64 sliding window) in one launch of the Gluon kernel."""
    test_mla.test_extra_kv_source(("cuda", torch.bfloat16), with_sink, layout)
    assert gluon_calls


@pytest.mark.parametrize("case", ["sparse", "extra", "extra-sink"])
def test_gluon_model1_loader(gluon_calls, monkeypatch, case):
    """model1's sparse calls through the loading warpgroup, which its rule gives only long token rows (the
    cases above are short: their calls keep their own loads), forced on here for the same cases."""
    monkeypatch.setattr(mla_decode_sm90, "MODEL1_LOADER_TILES", (0, 0))
    if case == "sparse":
        test_mla.test_fp8_kvcache(("cuda", torch.bfloat16), "model1", True)
    else:
        test_mla.test_extra_kv_source(("cuda", torch.bfloat16), case == "extra-sink", "model1")
    assert gluon_calls


def _fp8_source(layout, b, s_q, topk, page_size, tokens, short, g):
    """One FP8 sparse source: a packed cache of `tokens` keys in pages of page_size, its copy dequantised to bf16
    for the oracle (the kernels use the values so: a row of one key has the LSE of one score, whose error from
    the fp32 values' rounding alone, ~3e-3, is above the check's tolerance), topk random indices with 10% -1
    entries and a few past the cache, and topk_length = topk but `short` = {batch: topk_length}. Slots no valid
    index names hold 1e4 (NaN cannot be packed): a read of one shows."""
    d = test_mla.LAYOUTS[layout][0]
    blocks = -(-tokens // page_size)
    indices = torch.randint(0, tokens, (b, s_q, topk), generator=g, dtype=torch.int32)
    indices[torch.rand(b, s_q, topk, generator=g) < 0.1] = -1
    indices[..., 11::97] = blocks * page_size + 5
    topk_length = torch.full((b,), topk, dtype=torch.int32)
    for i, n in dict(short).items():
        topk_length[i] = n
    used = torch.zeros(blocks * page_size, dtype=torch.bool)
    for i in range(b):
        row = indices[i, :, :int(topk_length[i])].flatten()
        used[row[(row >= 0) & (row < tokens)].long()] = True
    kv = torch.randn(blocks, page_size, 1, d, generator=g).to(torch.bfloat16)
    kv.view(-1, d)[~used] = 1e4
    packed = flash_mla.quantize_kv_cache(kv.cuda(), layout)
    ref_cache = _dequantized(packed, layout, torch.bfloat16)
    return packed, ref_cache, indices.cuda(), topk_length.cuda()


def _fp8_sparse_decode(layout, b, s_q, h_q, page_size, topk, *, sink=True, short=(), tokens=20000, extra=None,
                       unpaired=None):
    """An FP8 sparse decode (V3.2's or model1's cache) against the oracle: `_fp8_source`'s main source, and with
    `extra` = (extra_topk, extra_page_size, extra_short) a second one (V4's sliding window), attended together.
    `unpaired` (a monkeypatch): the same call without 2-CTA clusters gives the same bits."""
    g = torch.Generator().manual_seed(page_size + h_q + topk + b)
    d = test_mla.LAYOUTS[layout][0]
    packed, ref_cache, indices, topk_length = _fp8_source(layout, b, s_q, topk, page_size, tokens, short, g)
    q = torch.randn(b, s_q, h_q, d, generator=g).to(torch.bfloat16).cuda()
    attn_sink = torch.randn(h_q, generator=g).cuda() if sink else None
    lens = torch.zeros(b, dtype=torch.int32, device="cuda")
    meta, splits = flash_mla.get_mla_metadata(lens, s_q * h_q, 1, num_heads_q=h_q, topk=topk, is_fp8_kvcache=True)
    kw = dict(indices=indices, topk_length=topk_length)
    ref_indices = torch.where(indices < ref_cache.shape[0] * ref_cache.shape[1], indices, -1)
    if extra is not None:
        extra_topk, extra_page, extra_short = extra
        x_packed, x_ref, x_indices, x_length = _fp8_source(layout, b, s_q, extra_topk, extra_page, tokens // 4,
                                                           extra_short, g)
        kw.update(extra_k_cache=x_packed, extra_indices_in_kvcache=x_indices, extra_topk_length=x_length)
        x_indices = torch.where(x_indices < x_ref.shape[0] * x_ref.shape[1], x_indices, -1)
        ref_cache, ref_indices = test_mla._union_of_sources([ref_cache, x_ref], [(ref_indices, topk_length),
                                                                                  (x_indices, x_length)])
        topk_length = None
    out, lse = flash_mla.flash_mla_with_kvcache(q, packed, None, lens, D_V, meta, splits, is_fp8_kvcache=True,
                                                attn_sink=attn_sink, **kw)
    ref = mla_sparse_decode_ref(q, ref_cache, ref_indices, D_V, topk_length=topk_length, attn_sink=attn_sink)
    _check(out, lse, *ref, torch.bfloat16)
    if unpaired is not None:
        unpaired.setattr(sparse_decode_sm90, "clusters_enabled", lambda: False)
        out1, lse1 = flash_mla.flash_mla_with_kvcache(q, packed, None, lens, D_V, meta, splits, is_fp8_kvcache=True,
                                                      attn_sink=attn_sink, **kw)
        assert torch.equal(out, out1) and torch.equal(lse, lse1)


@pytest.mark.parametrize("page_size", [64, 61])
def test_gluon_fp8_sparse_decode_h128(gluon_calls, page_size):
    """The V3.2 benchmark's shape at small scale: h_q = 128, s_q = 2 (two 64-row blocks per token, tokens split
    over parts), topk 2048 with -1 entries and a trimmed row, a sink, odd pages."""
    _fp8_sparse_decode("v32", 6, 2, 128, page_size, 2048, short={1: 700})
    assert gluon_calls


@pytest.fixture
def loader_calls(monkeypatch):
    """Counts launches of `sparse_decode_sm90` (FP8 sparse decode run whole); skips off sm_90."""
    return _launches(monkeypatch, sparse_decode_sm90, "sparse_decode_forward_sm90")


@pytest.mark.parametrize("b,s_q,h_q,page_size,topk,sink", [(33, 2, 128, 64, 2048, True), (64, 1, 128, 61, 1000, False),
                                                           (128, 1, 64, 64, 512, True), (64, 2, 64, 2, 130, True)],
                         ids=["h128-sq2", "h128-page61-topk1000", "h64", "h64-page2-topk130"])
def test_gluon_fp8_v32_sparse_decode_whole(loader_calls, b, s_q, h_q, page_size, topk, sink):
    """V3.2 FP8 sparse decode with enough tokens that the plan runs each whole: `sparse_decode_sm90` (the loader
    dequantises in registers; a scoring and a P·V-only warpgroup). topk not a multiple of 64, topk_length short,
    one, and 0 (a row with no key: output 0, LSE +inf), -1 entries and entries past the cache, odd pages."""
    _fp8_sparse_decode("v32", b, s_q, h_q, page_size, topk, sink=sink, short={1: 700 % topk, 3: 1, 5: 0})
    assert loader_calls


@pytest.mark.parametrize("layout,b,s_q,h_q,pages,topks", [
    ("v32", 33, 2, 128, (61, 2), (700, 130)), ("model1", 64, 1, 128, (61, None), (1000, None)),
    ("model1", 33, 2, 128, (256, 64), (128, 512)), ("v32", 66, 1, 128, (64, None), (64, None))],
    ids=["v32-extra-page61-page2", "model1-page61", "model1-extra", "v32-one-tile"])
def test_gluon_fp8_sparse_decode_pairs(monkeypatch, layout, b, s_q, h_q, pages, topks):
    """Heads in pairs of 64-row blocks run as 2-CTA clusters (`sm90.launch_pairs`): each CTA loads and converts half
    of every key tile and copies it into the other's shared memory. Against the oracle, and bit for bit the same as
    the call without clusters: either layout, with and without a second source, odd pages, one tile a token, trimmed
    rows and rows with no key. (Token counts that the plan runs whole: 66 parts of two programs.)"""
    pairs = _launches(monkeypatch, sparse_decode_sm90, "launch_pairs")
    extra = None if topks[1] is None else (topks[1], pages[1], {0: 0, 2: topks[1] // 3})
    short = {1: 0, 3: 1, 5: topks[0] // 2}
    _fp8_sparse_decode(layout, b, s_q, h_q, pages[0], topks[0], short=short, extra=extra, unpaired=monkeypatch)
    assert len(pairs) == 1


@pytest.mark.parametrize("layout,b,s_q,h_q,pages,topks,sink", [
    ("model1", 64, 2, 64, (256, 64), (128, 512), True), ("model1", 33, 2, 128, (256, 64), (128, 1024), False),
    ("model1", 128, 1, 64, (61, None), (130, None), True), ("v32", 64, 2, 64, (64, 2), (256, 100), True)],
    ids=["model1-h64-extra", "model1-h128-extra", "model1-page61-no-extra", "v32-extra-page2"])
def test_gluon_fp8_sparse_decode_whole(loader_calls, layout, b, s_q, h_q, pages, topks, sink):
    """DeepSeek-V4's FP8 sparse decode (model1's per-page layout, UE8M0 scales) and either layout with a second
    source, run whole by `sparse_decode_sm90`: the benchmark's shapes (topk 128 on pages of 256 + a window of
    512 / 1024 on pages of 64) at bench token counts, rows trimmed in one source, the other or both (batch 5
    sees nothing: output 0, LSE +inf), -1 entries and entries past either cache."""
    extra = None if topks[1] is None else (topks[1], pages[1], {2: 0, 3: 1, 5: 0, 6: topks[1] // 3})
    _fp8_sparse_decode(layout, b, s_q, h_q, pages[0], topks[0], sink=sink, short={1: 0, 4: 1, 5: 0, 6: 77},
                       extra=extra)
    assert loader_calls
