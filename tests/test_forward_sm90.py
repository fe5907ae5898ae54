"""The Hopper Gluon prefill kernel (`kernels/forward_sm90.py`) against the fp32 oracle, on the GPU only
(Gluon does not run in the interpreter). Every case first asserts that the dispatch really takes the Gluon
path, so a silent fall-back to the portable kernel cannot make these tests pass."""
import pytest
import torch

import fmha
from fmha.reference import attention_ref, attention_varlen_ref
from utils import assert_matches, assert_matches_fp8_p, poisoned, spy

pytestmark = pytest.mark.gpu

# (batch, seqlen_q, seqlen_k, heads_q, heads_k, head_dim[, head_dim_v when it differs])
SHAPES = [
    (2, 1000, 1500, 16, 4, 128),    # GQA, lengths off every tile, Sq < Sk
    (1, 2048, 2048, 8, 8, 128),
    (3, 700, 300, 4, 1, 128),       # MQA, Sq > Sk: under causal the first 400 rows see nothing
    (2, 1, 4096, 8, 2, 128),        # Sq = 1
    (2, 129, 65, 2, 2, 128),        # one row and one key past a tile
    (2, 700, 900, 8, 1, 64),
    (3, 700, 300, 4, 1, 64),        # Sq > Sk at d = 64 / 256: causal items with no key tile at all
    (2, 300, 100, 4, 2, 256),
    (1, 4096, 4096, 4, 4, 64),
    (1, 1000, 1064, 4, 2, 64),      # causal diagonal 64 keys off the tiles: warpgroup 0's last tile at half width
    (1, 1064, 1000, 4, 2, 64),      # (or not), on every item
    (2, 513, 1027, 4, 4, 256),
    (1, 100, 2000, 2, 1, 256),
    (2, 129, 40, 2, 2, 256),        # one key tile: the one Q buffer is released after the first Q·Kᵀ
    (2, 1000, 1500, 16, 4, 192, 128),   # DeepSeek's 192 / 128: Q and K in three column parts
    (3, 700, 300, 4, 1, 192, 128),
    (2, 129, 65, 2, 2, 192, 128),
    (1, 1000, 1064, 4, 2, 192, 128),    # the causal half-width diagonal tile over three parts
    (1, 2048, 2048, 8, 8, 192, 128),
    # head dims run padded (`padded_dims`: zeros past the real columns, TMA's fill over 4-D views; NaN columns
    # between the heads here): to 128, to 64 (three warpgroups at 4k rows) and to 256 (the TMA-store epilogue)
    (2, 1000, 1500, 16, 4, 96),
    (3, 700, 300, 4, 1, 80),
    (2, 129, 65, 2, 2, 112),
    (1, 4096, 4096, 4, 4, 40),
    (2, 700, 900, 8, 1, 56),
    (2, 513, 1027, 4, 4, 160),
    (1, 1000, 1064, 4, 2, 128, 96),     # head_dim_v alone padded
    (2, 700, 900, 8, 2, 72),            # the widest paddings taken: 72 -> 128, 136-152 -> 256
    (2, 513, 1027, 4, 4, 144),
    (1, 1000, 1064, 4, 2, 136),
    (2, 129, 65, 2, 2, 152),
    (2, 513, 1027, 4, 4, 192, 256),     # (192, 256) at its own dims, and (160, 128) padded to (192, 128)
    (1, 1000, 1064, 4, 2, 160, 128),
]


def _gluon_ok(q, k, v):
    """Whether these inputs can test the Gluon path: False off sm_90 (the callers skip); on sm_90 the test fails
    unless `supported` takes them, so that a case the path stopped taking cannot pass as a skip."""
    from fmha.kernels import forward_sm90
    if torch.cuda.get_device_capability()[0] != 9:
        return False
    assert forward_sm90.supported(q, k, v), "the Gluon path does not take this case's inputs"
    return True


def _dense_inputs(seed, b, s, h, d):
    """q, k, v of (b, s, h, d) bf16, plain contiguous tensors seeded by `seed`; skips unless the Gluon path takes
    them."""
    torch.manual_seed(seed)
    q, k, v = (torch.randn(b, s, h, d, dtype=torch.bfloat16, device="cuda") for _ in range(3))
    if not _gluon_ok(q, k, v):
        pytest.skip("not an sm_90 GPU")
    return q, k, v


def _inputs(shape, dtype=torch.bfloat16, seed=None):
    """q, k, v of `shape` (seeded by it, or by `seed`), with batch and sequence strides padded with NaN rows and
    columns the kernel must not read; skips unless the Gluon path takes them."""
    torch.manual_seed(sum(shape) if seed is None else seed)
    b, sq, sk, hq, hk, d, dv = (*shape, shape[-1])[:7]
    q = poisoned((b, sq, hq, d), sq, dtype, "cuda")
    k = poisoned((b, sk, hk, d), sk, dtype, "cuda")
    v = poisoned((b, sk, hk, dv), sk, dtype, "cuda")
    if not _gluon_ok(q, k, v):
        pytest.skip("not an sm_90 GPU")
    return q, k, v


def _packed(len_q, len_k, hq, hk, d, dv, device="cuda"):
    """Packed bf16 q, k, v of sequences with these lengths, NaN past the packed rows, and their cu_seqlens; skips
    unless the Gluon path takes them."""
    cu_q, cu_k = (torch.tensor([0, *torch.tensor(n).cumsum(0).tolist()], dtype=torch.int32, device=device)
                  for n in (len_q, len_k))
    tq, tk = sum(len_q), sum(len_k)
    q = poisoned((tq, hq, d), tq, torch.bfloat16, device, dim=0)
    k = poisoned((tk, hk, d), tk, torch.bfloat16, device, dim=0)
    v = poisoned((tk, hk, dv), tk, torch.bfloat16, device, dim=0)
    if device != "cuda" or not _gluon_ok(*(t.unsqueeze(0) for t in (q, k, v))):
        pytest.skip("not an sm_90 GPU")
    return q, k, v, cu_q, cu_k


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_gluon_prefill(shape, causal, dtype):
    q, k, v = _inputs(shape, dtype)
    out = torch.full((*q.shape[:3], v.shape[-1]), float("nan"), dtype=dtype, device="cuda")
    got, lse = fmha.attention(q, k, v, causal=causal, return_lse=True, out=out)
    assert_matches(got, lse, attention_ref(q, k, v, causal=causal), dtype)


def test_gluon_launch_plan_reuse(monkeypatch):
    """A launch plan (`forward_sm90._PLANS`) serves later calls of its key only: new tensors of the same shapes and
    strides take it (the output theirs, not the first call's); other strides, head dims, options, and a q whose
    address is not 16-byte aligned (which TMA cannot read: the portable kernel then) make their own."""
    from fmha.kernels import forward_sm90
    plans = []
    real = forward_sm90._plan
    monkeypatch.setattr(forward_sm90, "_plan", lambda *a, **kw: plans.append(1) or real(*a, **kw))
    shape = (2, 300, 500, 8, 2, 128)
    sink = torch.randn(8, device="cuda")

    def check(q, k, v, **options):
        got, lse = fmha.attention(q, k, v, return_lse=True, **options)
        assert_matches(got, lse, attention_ref(q, k, v, **options), torch.bfloat16)
    q, k, v = _inputs(shape)
    check(q, k, v, causal=True, sinks=sink)
    for seed in (1, 2):                                      # new data and buffers, the same key: the plan kept
        check(*_inputs(shape, seed=seed), causal=True, sinks=sink)
    assert len(plans) == 1
    check(*(t.contiguous() for t in (q, k, v)), causal=True, sinks=sink)    # other strides
    check(q, k, v, window=(100, 0), sinks=sink)                              # other options
    check(q, k, v, causal=True)
    assert len(plans) == 4
    buf = torch.randn(q.numel() + 1, dtype=q.dtype, device="cuda")
    q_off = buf[1:].view(q.shape)                            # 2 bytes past an aligned address
    assert forward_sm90.supported(q_off, k.contiguous(), v.contiguous()) is None
    gluon = []
    launched = forward_sm90.attention_forward_sm90

    def returns(*args, **kwargs):                           # records what the launcher returned, not a count
        gluon.append(launched(*args, **kwargs))
        return gluon[-1]
    monkeypatch.setattr(forward_sm90, "attention_forward_sm90", returns)
    check(q_off, k.contiguous(), v.contiguous(), causal=True, sinks=sink)     # the contiguous call's key, unaligned
    assert gluon == [False]


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_gluon_packed_plan_other_lengths(causal, monkeypatch):
    """Packed batches of other token counts and longest lengths (a server's prefill batches) take their launch
    plans from one (`forward_sm90._Plan.with_lengths`), each with its own grid, views and scalars: every batch
    against the oracle, NaN past its rows and in its output beforehand. The last two batches' longest queries reach
    WIDE_MIN_ROWS (a row bound of the tile choice, which the key holds whether or not it changes the tiles): one
    more plan, which both take."""
    from fmha.kernels import forward_sm90
    plans = []
    real = forward_sm90._plan
    monkeypatch.setattr(forward_sm90, "_plan", lambda *a, **kw: plans.append(1) or real(*a, **kw))
    batches = [([300, 1000, 17], [300, 1200, 40]), ([64, 5, 700], [2000, 64, 700]), ([1, 129, 1], [1, 129, 3000]),
               ([1500, 0, 2048], [1500, 0, 2048]), ([100, 3000, 40], [100, 3000, 40])]
    for i, (len_q, len_k) in enumerate(batches):
        torch.manual_seed(i)
        q, k, v, cu_q, cu_k = _packed(len_q, len_k, 8, 2, 64, 64)
        out = torch.full((q.shape[0], 8, 64), float("nan"), dtype=torch.bfloat16, device="cuda")
        got, lse = fmha.attention_varlen(q, k, v, cu_q, cu_k, max(len_q), max(len_k), causal=causal,
                                         return_lse=True, out=out)
        assert_matches(got, lse, attention_varlen_ref(q, k, v, cu_q, cu_k, causal=causal), torch.bfloat16)
    assert len(plans) == 2


# (lengths_q, lengths_k, heads_q, heads_k, head_dim[, head_dim_v when it differs]): packed sequences with empty
# ones, Sq > Sk (causal rows that see nothing), lengths off every tile, a long one (three warpgroups at d = 64).
VARLEN_CASES = [
    ([150, 0, 1000, 37, 513], [200, 5, 1000, 37, 300], 8, 2, 128),
    ([700, 1, 129, 64], [900, 64, 65, 0], 4, 1, 64),
    ([2500, 300], [2500, 3000], 4, 2, 64),
    ([300, 2048], [100, 2048], 4, 4, 256),
    ([1000, 37, 513], [1064, 0, 600], 8, 2, 192, 128),
    ([150, 0, 1000, 37, 513], [200, 5, 1000, 37, 300], 8, 2, 96),
    ([700, 1, 129, 64], [900, 64, 65, 0], 4, 1, 72),
]


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("case", VARLEN_CASES, ids=lambda c: f"{len(c[0])}seqs-d{c[4]}")
def test_gluon_varlen(case, causal):
    """`attention_varlen` on the Gluon kernel: each sequence's rows from cu_seqlens, NaN past the packed rows and
    in the output beforehand."""
    len_q, len_k, hq, hk, d, dv = (*case, case[4])[:6]
    torch.manual_seed(len(len_q) + d)
    q, k, v, cu_q, cu_k = _packed(len_q, len_k, hq, hk, d, dv)
    out = torch.full((q.shape[0], hq, dv), float("nan"), dtype=torch.bfloat16, device="cuda")
    got, lse = fmha.attention_varlen(q, k, v, cu_q, cu_k, max(len_q), max(len_k), causal=causal, return_lse=True,
                                     out=out)
    assert_matches(got, lse, attention_varlen_ref(q, k, v, cu_q, cu_k, causal=causal), torch.bfloat16)


# (shape as SHAPES, window): sliding windows as gpt-oss (128, 0), Mistral and Gemma use them, a right bound past the
# diagonal, a left bound alone, the diagonal alone; Sq > Sk (rows that see nothing), the causal half-width
# diagonal tile, 192 / 128; causal and unmasked calls (for sinks and softcap alone).
WINDOW_CASES = [
    ((2, 1000, 1500, 16, 4, 128), (-1, 0)),
    ((2, 513, 1027, 4, 4, 256), (-1, -1)),
    ((2, 1000, 1500, 16, 4, 128), (128, 0)),
    ((2, 1000, 1500, 16, 4, 128), (300, 17)),
    ((2, 1000, 1500, 16, 4, 128), (-1, 50)),
    ((2, 1000, 1500, 16, 4, 128), (100, -1)),
    ((2, 129, 65, 2, 2, 128), (0, 0)),
    ((1, 2048, 2048, 8, 1, 64), (128, 0)),
    ((3, 700, 300, 4, 1, 64), (64, 0)),
    ((1, 1000, 1064, 4, 2, 64), (200, 0)),
    ((1, 1064, 1000, 4, 2, 64), (1, 3)),
    ((2, 513, 1027, 4, 4, 256), (1000, 0)),
    ((1, 100, 2000, 2, 1, 256), (700, -1)),
    ((1, 1000, 1064, 4, 2, 192, 128), (256, 0)),
    ((1, 300, 500, 4, 2, 64), (2**31 - 1, 2**31 - 1)),    # bounds past every key, near int32's end
    ((2, 1000, 1500, 16, 4, 96), (128, 0)),
]


def _spy_gluon(monkeypatch):
    """Count the launches that reach the Gluon kernel, so that a fall-back to the portable one fails the test."""
    from fmha.kernels import forward_sm90
    return spy(monkeypatch, forward_sm90, "attention_forward_sm90", lambda args, kwargs: kwargs.get("window"))


@pytest.mark.parametrize("extra", ["", "sinks", "softcap", "sinks-softcap", "alibi", "alibi-sinks-softcap"])
@pytest.mark.parametrize("case", WINDOW_CASES, ids=lambda c: "x".join(map(str, c[0])) + f"-w{c[1][0]},{c[1][1]}")
def test_gluon_window_sinks_softcap(case, extra, monkeypatch):
    """Sliding windows (left, right), attention sinks, softcap and ALiBi on the Gluon kernel (SPEC.md's semantics;
    the LSE leaves the sink out), NaN-poisoned padding and output, fp16 and bf16 by turns."""
    shape, window = case
    dtype = torch.float16 if WINDOW_CASES.index(case) % 2 else torch.bfloat16
    q, k, v = _inputs(shape, dtype)
    q.mul_(2)                     # scores reach well into the cap
    calls = _spy_gluon(monkeypatch)
    sink = torch.randn(shape[3], device="cuda") * 2 if "sinks" in extra else None
    softcap = 5.0 if "softcap" in extra else 0.0
    slopes = torch.rand(shape[3], device="cuda") * 0.2 if "alibi" in extra else None
    options = dict(window=window, sinks=sink, softcap=softcap, alibi_slopes=slopes)
    out = torch.full((*q.shape[:3], v.shape[-1]), float("nan"), dtype=dtype, device="cuda")
    got, lse = fmha.attention(q, k, v, return_lse=True, out=out, **options)
    assert calls == [window]
    assert_matches(got, lse, attention_ref(q, k, v, **options), dtype)


@pytest.mark.parametrize("window", [(300, 0), (100, -1), (0, 130)], ids=lambda w: f"w{w[0]},{w[1]}")
def test_gluon_window_three_consumer_warpgroups(window, monkeypatch):
    """Windows over the 192-row items of three consumer warpgroups (each trims the tiles past its own rows'
    horizon; the leading ones its rows do not see run fully masked)."""
    from fmha.kernels import forward_sm90
    shape = (1, 2048, 2100, 4, 2, 64)
    q, k, v = _inputs(shape)
    monkeypatch.setitem(forward_sm90._TILES, 64, (128, 3, 2, 160, 3))
    calls = _spy_gluon(monkeypatch)
    sink = torch.randn(4, device="cuda")
    got, lse = fmha.attention(q, k, v, window=window, sinks=sink, return_lse=True)
    assert calls == [window]
    assert_matches(got, lse, attention_ref(q, k, v, window=window, sinks=sink), torch.bfloat16)
    # With a softcap the tables never take three warpgroups (registers); forced here, it must still be right.
    got, lse = fmha.attention(q, k, v, window=window, sinks=sink, softcap=20.0, return_lse=True)
    assert_matches(got, lse, attention_ref(q, k, v, window=window, sinks=sink, softcap=20.0), torch.bfloat16)


@pytest.mark.parametrize("window", [(100, 0), (50, 20)], ids=lambda w: f"w{w[0]},{w[1]}")
@pytest.mark.parametrize("case", VARLEN_CASES[:2] + VARLEN_CASES[4:], ids=lambda c: f"{len(c[0])}seqs-d{c[4]}")
def test_gluon_varlen_window_sinks(case, window, monkeypatch):
    """Packed sequences with a window, sinks and ALiBi: each sequence's diagonal and left bound are its own."""
    len_q, len_k, hq, hk, d, dv = (*case, case[4])[:6]
    torch.manual_seed(len(len_q) + d + window[0])
    q, k, v, cu_q, cu_k = _packed(len_q, len_k, hq, hk, d, dv)
    calls = _spy_gluon(monkeypatch)
    options = dict(window=window, sinks=torch.randn(hq, device="cuda"), alibi_slopes=torch.rand(hq, device="cuda") / 8)
    out = torch.full((q.shape[0], hq, dv), float("nan"), dtype=torch.bfloat16, device="cuda")
    got, lse = fmha.attention_varlen(q, k, v, cu_q, cu_k, max(len_q), max(len_k), return_lse=True, out=out, **options)
    assert calls == [window]
    assert_matches(got, lse, attention_varlen_ref(q, k, v, cu_q, cu_k, **options), torch.bfloat16)


@pytest.mark.parametrize("right", [0, 40, -1], ids=["causal", "right40", "noright"])
def test_gluon_window_per_sequence(right, monkeypatch):
    """One left bound a sequence (a (batch,) int32 tensor; negative, including below -1, for none; past int32's
    reach of a row), dense and packed, with sinks: DeepSeek-V4's sliding-window branch."""
    torch.manual_seed(5 + right)
    lefts = torch.tensor([128, -1, 0, 2**31 - 1, -7, 300], dtype=torch.int32, device="cuda")
    shape = (6, 700, 1000, 8, 2, 64)
    q, k, v = _inputs(shape)
    calls = _spy_gluon(monkeypatch)
    sink = torch.randn(8, device="cuda")
    got, lse = fmha.attention(q, k, v, window=(lefts, right), sinks=sink, return_lse=True)
    assert len(calls) == 1
    assert_matches(got, lse, attention_ref(q, k, v, window=(lefts, right), sinks=sink), torch.bfloat16)
    len_q, len_k = [700, 1, 129, 64, 0, 300], [900, 64, 65, 300, 10, 300]
    qv, kv, vv, cu_q, cu_k = _packed(len_q, len_k, 8, 2, 128, 128)
    got, lse = fmha.attention_varlen(qv, kv, vv, cu_q, cu_k, max(len_q), max(len_k), window=(lefts, right),
                                     sinks=sink, return_lse=True)
    assert len(calls) == 2
    assert_matches(got, lse, attention_varlen_ref(qv, kv, vv, cu_q, cu_k, window=(lefts, right), sinks=sink),
                   torch.bfloat16)


# (cache lengths, capacity, seqlen_q, heads_q, heads_k, head_dim[, head_dim_v], page size or None): chunked prefill
# over a KV cache, contiguous or paged (pages of 16: eight TMA boxes a 128-key tile; 48: boxes of 16 rows over pages
# that a tile does not divide; 256: one box, inside a page), lengths off every tile, an empty sequence and ones
# shorter than the chunk (causal rows that see nothing).
KVCACHE_CASES = [
    ([3000, 0, 17, 4096, 1500, 64], 4096, 256, 32, 8, 128, None),
    ([3000, 0, 17, 4096, 1500, 64], 4096, 256, 32, 8, 128, 16),
    ([1000, 777, 2048], 2048, 512, 8, 2, 128, 256),
    ([900, 64, 65, 1100], 1152, 700, 4, 1, 64, 16),
    ([900, 64, 65, 1100], 1152, 700, 4, 1, 64, None),
    ([513, 1027, 300], 1152, 300, 4, 4, 256, 64),
    ([1000, 37, 1064], 1104, 1000, 8, 2, 192, 128, 48),
    ([900, 64, 65, 1100], 1152, 700, 4, 1, 80, 16),
    ([3000, 0, 17, 1500], 4096, 256, 32, 8, 96, None),
    ([513, 1027, 300], 1152, 300, 4, 4, 144, 64),
]


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("case", KVCACHE_CASES, ids=lambda c: f"d{c[5]}-page{c[-1]}-sq{c[2]}")
def test_gluon_kvcache(case, causal, monkeypatch):
    """`attention_with_kvcache` with a chunk of queries (chunked prefill) on the Gluon kernel: contiguous and paged
    caches with shuffled pages, NaN in every slot past each length and in unused pages (V rows past a length are
    zeroed in shared memory before P·V), NaN in the output beforehand."""
    from test_kvcache import _cache, _oracle
    seqlens, capacity, sq, hq, hk, d = case[:6]
    dv, page = (case[6] if len(case) == 8 else d), case[-1]
    dtype = torch.float16 if KVCACHE_CASES.index(case) % 2 else torch.bfloat16
    k_cache, v_cache, table, k, v = _cache(seqlens, capacity, hk, d, dv, dtype, "cuda", page, seed=sq)
    q = torch.randn(len(seqlens), sq, hq, d, dtype=dtype, device="cuda")
    if not _gluon_ok(q, k_cache, v_cache):
        pytest.skip("not an sm_90 GPU")
    calls = _spy_gluon(monkeypatch)
    lens = torch.tensor(seqlens, dtype=torch.int32, device="cuda")
    out = torch.full((*q.shape[:3], dv), float("nan"), dtype=dtype, device="cuda")
    got, lse = fmha.attention_with_kvcache(q, k_cache, v_cache, lens, block_table=table, causal=causal, num_splits=1,
                                           return_lse=True, out=out)
    assert len(calls) == 1
    assert_matches(got, lse, _oracle(q, k, v, seqlens, causal=causal), dtype)


@pytest.mark.parametrize("page", [None, 16], ids=["contiguous", "page16"])
def test_gluon_kvcache_options(page, monkeypatch):
    """A KV cache with a window, sinks, softcap and ALiBi, and with one left bound a sequence; the dispatch's
    choice (num_splits=0) keeps a call with enough work items on the Gluon kernel."""
    from test_kvcache import _cache, _oracle
    seqlens = [2000, 0, 333, 1500]
    k_cache, v_cache, table, k, v = _cache(seqlens, 2048, 2, 128, 128, torch.bfloat16, "cuda", page, seed=3)
    q = torch.randn(4, 384, 16, 128, dtype=torch.bfloat16, device="cuda") * 2
    if not _gluon_ok(q, k_cache, v_cache):
        pytest.skip("not an sm_90 GPU")
    calls = _spy_gluon(monkeypatch)
    lens = torch.tensor(seqlens, dtype=torch.int32, device="cuda")
    sink = torch.randn(16, device="cuda")
    options = dict(window=(200, 0), sinks=sink, softcap=10.0, alibi_slopes=torch.rand(16, device="cuda") / 4)
    got, lse = fmha.attention_with_kvcache(q, k_cache, v_cache, lens, block_table=table, return_lse=True, **options)
    assert len(calls) == 1
    assert_matches(got, lse, _oracle(q, k, v, seqlens, **options), torch.bfloat16)
    lefts = torch.tensor([100, -1, 0, 700], dtype=torch.int32, device="cuda")
    got, lse = fmha.attention_with_kvcache(q, k_cache, v_cache, lens, block_table=table, window=(lefts, 0),
                                           return_lse=True, num_splits=1)
    assert len(calls) == 2
    for i, n in enumerate(seqlens):
        own = _oracle(q[i:i + 1], k[i:i + 1], v[i:i + 1], [n], window=(int(lefts[i]), 0))
        assert_matches(got[i:i + 1], lse[i:i + 1], own, torch.bfloat16)


# (batch, seqlen_q, seqlen_k, heads_q, heads_k, head_dim[, head_dim_v]): query lengths whose last 128-row block is
# at most half full, with an even GQA group, where `launch_args` pairs two query heads in an item (`pack_heads`).
PACK_SHAPES = [(2, 64, 1000, 8, 2, 128), (3, 192, 700, 4, 2, 64), (1, 50, 300, 16, 2, 256), (2, 320, 320, 4, 1, 64),
               (2, 130, 1500, 8, 4, 192, 128), (2, 1, 700, 8, 2, 128), (2, 64, 1000, 8, 2, 96)]


@pytest.mark.parametrize("extra", ["", "window-sinks-alibi"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", PACK_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_gluon_pack_heads(shape, causal, extra, monkeypatch):
    """GQA heads paired in a work item (each consumer warpgroup one query head of a KV head, the same 64 rows), the
    automatic choice for these lengths: against the oracle, NaN-poisoned; a spy asserts the pairing."""
    from fmha.kernels import forward_sm90
    q, k, v = _inputs(shape)
    heads = []
    real = forward_sm90._plan

    def spy(*args, **kwargs):
        plan = real(*args, **kwargs)
        heads.append(plan.meta["HEADS"])
        return plan
    monkeypatch.setattr(forward_sm90, "_plan", spy)
    hq = shape[3]
    options = dict(causal=causal)
    if extra:
        options = dict(window=(100, 0) if causal else (100, 60), sinks=torch.randn(hq, device="cuda"),
                       alibi_slopes=torch.rand(hq, device="cuda") / 4)
    out = torch.full((*q.shape[:3], v.shape[-1]), float("nan"), dtype=q.dtype, device="cuda")
    got, lse = fmha.attention(q, k, v, return_lse=True, out=out, **options)
    assert heads == [2]
    assert_matches(got, lse, attention_ref(q, k, v, **options), q.dtype)


def test_gluon_pack_heads_varlen():
    """Paired heads over packed sequences, forced (the automatic choice keeps packed sequences on single heads):
    each item's rows and key tiles come from its own sequence."""
    from fmha.kernels import forward_sm90
    len_q, len_k = [64, 0, 130, 17], [500, 30, 130, 900]
    q, k, v, cu_q, cu_k = _packed(len_q, len_k, 8, 2, 128, 128)
    for causal in (False, True):
        out = torch.full((q.shape[0], 8, 128), float("nan"), dtype=q.dtype, device="cuda")
        lse = torch.empty(8, q.shape[0], device="cuda")
        forward_sm90.attention_forward_sm90(q, k, v, out, lse, causal=causal, softmax_scale=128 ** -0.5,
                                            varlen=(cu_q, cu_k, max(len_q), max(len_k)), pack=True)
        ref, ref_lse = attention_varlen_ref(q, k, v, cu_q, cu_k, causal=causal)
        assert_matches(out, lse, (ref, ref_lse), q.dtype)


@pytest.mark.parametrize("heads, form", [((8, 2), "paged"), ((8, 4), "paged"), ((6, 2), "paged"), ((4, 4), "paged"),
                                         ((8, 2), "seqused"), ((8, 2), "no-cache")],
                         ids=["group4-paged", "group2-paged", "group3-paged", "mha-paged", "group4-seqused",
                              "group4-no-cache"])
def test_gluon_varlen_paired_tails(heads, form):
    """Packed sequences over a KV cache (16-key pages, shuffled, NaN past each sequence's keys; or packed keys of
    which each sequence uses its first seqused_k, NaN after) whose last 128-row block holds at most 64 rows
    (`forward_sm90._paired_tail`: in an even GQA group that block of two query heads runs as one item, the odd
    head's own item left out): tails of 1, 17, 63 and 64 rows (paired), 65 and 127 (not), a sequence of none, one
    with fewer keys than rows; causal, unmasked and a sliding window; and the same without a cache. The output
    starts as NaN and every head's rows must match the oracle, so a head or a row that the pairing drops, or writes
    to the wrong head, fails."""
    from fmha.kernels import forward_sm90
    from utils import paged_packed
    hq, hk = heads
    len_q, len_k = [64, 0, 129, 17, 191, 65, 1, 255, 63], [64, 30, 500, 17, 100, 300, 900, 255, 80]
    q, k, v, cu_q, cu_k = _packed(len_q, len_k, hq, hk, 128, 128)
    used = torch.tensor(len_k, dtype=torch.int32, device="cuda")
    if form == "paged":
        perm = torch.randperm(len(len_k) * -(-max(len_k) // 16), generator=torch.Generator().manual_seed(7)).cuda()
        k_cache, v_cache, table = paged_packed(16, k[:cu_k[-1]], v[:cu_k[-1]], cu_k, perm=perm)
        call = dict(varlen=(cu_q, None, max(len_q), max(len_k)), cache=(used, table, None))
    elif form == "seqused":
        k_cache, v_cache = k.clone(), v.clone()
        for i, n in enumerate(len_k[:-1]):             # each sequence uses its first n - 3 keys: NaN after them
            k_cache[cu_k[i] + n - 3:cu_k[i + 1]] = float("nan")
            v_cache[cu_k[i] + n - 3:cu_k[i + 1]] = float("nan")
            used[i] = max(n - 3, 0)
        call = dict(varlen=(cu_q, cu_k, max(len_q), max(len_k)), cache=(used, None, None))
    else:
        k_cache, v_cache = k, v
        call = dict(varlen=(cu_q, cu_k, max(len_q), max(len_k)))
    keys = [(int(cu_k[i]), int(cu_k[i]) + int(used[i])) for i in range(len(len_k))]
    cu_used = torch.tensor([0, *torch.tensor([b - a for a, b in keys]).cumsum(0).tolist()], dtype=torch.int32)
    k_used, v_used = (torch.cat([t[a:b] for a, b in keys]) for t in (k, v))
    assert not (k_used.isnan().any() or v_used.isnan().any())
    for mask in (dict(causal=False), dict(causal=True), dict(causal=True, window=(70, 0))):
        out = torch.full((q.shape[0], hq, 128), float("nan"), dtype=q.dtype, device="cuda")
        lse = torch.full((hq, q.shape[0]), float("nan"), device="cuda")
        assert forward_sm90.attention_forward_sm90(q, k_cache, v_cache, out, lse, softmax_scale=128 ** -0.5,
                                                   **call, **mask)
        ref, ref_lse = attention_varlen_ref(q, k_used, v_used, cu_q, cu_used.to("cuda"), **mask)
        assert_matches(out, lse, (ref, ref_lse), q.dtype)


def test_gluon_varlen_longer_buffer(monkeypatch):
    """Packed sequences in k / v buffers longer than cu_seqlens_k[-1], NaN past it: the last sequence's last key
    tile reaches those rows, and its V rows there are zeroed before P·V."""
    torch.manual_seed(9)
    len_q, len_k = [300, 200], [500, 333]
    cu_q, cu_k = (torch.tensor([0, *torch.tensor(n).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
                  for n in (len_q, len_k))
    q = torch.randn(sum(len_q), 8, 128, dtype=torch.bfloat16, device="cuda")
    k, v = (torch.full((sum(len_k) + 100, 2, 128), float("nan"), dtype=torch.bfloat16, device="cuda")
            for _ in range(2))
    k[:sum(len_k)].normal_()
    v[:sum(len_k)].normal_()
    if not _gluon_ok(*(t.unsqueeze(0) for t in (q, k, v))):
        pytest.skip("not an sm_90 GPU")
    calls = _spy_gluon(monkeypatch)
    for causal in (False, True):
        got, lse = fmha.attention_varlen(q, k, v, cu_q, cu_k, max(len_q), max(len_k), causal=causal, return_lse=True)
        ref = attention_varlen_ref(q, k[:sum(len_k)], v[:sum(len_k)], cu_q, cu_k, causal=causal)
        assert_matches(got, lse, ref, torch.bfloat16)
    assert len(calls) == 2


@pytest.mark.parametrize("ramp", [lambda j: 1 + j / 300, lambda j: 2.0 ** (j // 512), lambda j: 8 - j / 400],
                         ids=["rising", "steps", "falling"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", [(1, 2048, 2048, 4, 2, 64), (2, 1000, 1500, 4, 2, 128), (1, 3000, 3000, 2, 2, 64)],
                         ids=lambda s: "x".join(map(str, s)))
def test_gluon_prefill_moving_max(shape, causal, ramp):
    """Keys scaled up along the sequence, by a little every tile or in steps, or down: the running max moves by
    small and large amounts over many tiles (two and three consumer warpgroups at d = 64)."""
    q, k, v = _inputs(shape)
    k.mul_(ramp(torch.arange(shape[2], device="cuda", dtype=torch.float32))[None, :, None, None].to(k.dtype))
    got, lse = fmha.attention(q, k, v, causal=causal, return_lse=True)
    assert_matches(got, lse, attention_ref(q, k, v, causal=causal), torch.bfloat16)


def test_gluon_packed_qkv():
    """q, k, v as slices of one packed (b, s, 3, h, d) projection output: head stride d, token stride 3hd."""
    torch.manual_seed(0)
    qkv = torch.randn(2, 777, 3, 8, 128, dtype=torch.bfloat16, device="cuda")
    q, k, v = qkv.unbind(2)
    if not _gluon_ok(q, k, v):
        pytest.skip("not an sm_90 GPU")
    got, lse = fmha.attention(q, k, v, causal=True, return_lse=True, softmax_scale=0.07)
    assert_matches(got, lse, attention_ref(q, k, v, causal=True, softmax_scale=0.07), torch.bfloat16)


@pytest.mark.parametrize("d", [64, 256])
def test_gluon_fp32_out(d):
    torch.manual_seed(1)
    q, k, v = (torch.randn(1, 300, 4, d, dtype=torch.float16, device="cuda") for _ in range(3))
    if not _gluon_ok(q, k, v):
        pytest.skip("not an sm_90 GPU")
    out = torch.empty(1, 300, 4, d, dtype=torch.float32, device="cuda")
    got, lse = fmha.attention(q, k, v, return_lse=True, out=out)
    assert_matches(got, lse, attention_ref(q, k, v), torch.float16)


@pytest.mark.parametrize("d", [128, 256, 96, 160])
def test_gluon_out_view(d):
    """`out` a column slice of a wider NaN-filled tensor: each head's rows and columns are written, nothing of
    the padding (rows past seqlen_q, columns past head_dim). d = 256 writes it by TMA store; 96 and 160 run padded
    to 128 (pointer stores, masked) and 256 (TMA store, clipped by the 4-D view)."""
    torch.manual_seed(2)
    b, sq, h = 2, 333, 4
    q, k, v = (torch.randn(b, sq, h, d, dtype=torch.bfloat16, device="cuda") for _ in range(3))
    if not _gluon_ok(q, k, v):
        pytest.skip("not an sm_90 GPU")
    wide = torch.full((b, sq + 7, h, d + 8), float("nan"), dtype=torch.bfloat16, device="cuda")
    out = wide[:, :sq, :, :d]
    got, lse = fmha.attention(q, k, v, causal=True, return_lse=True, out=out)
    assert_matches(got, lse, attention_ref(q, k, v, causal=True), torch.bfloat16)
    assert wide[:, :, :, d:].isnan().all() and wide[:, sq:].isnan().all()


@pytest.mark.parametrize("tiles", [(128, 3, 2, 160, 3), (64, 4, 2, 160, 3)], ids=["3wg-n128", "3wg-n64"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", [(2, 700, 900, 8, 1, 64), (1, 1000, 400, 4, 2, 64), (1, 2048, 2048, 4, 4, 64)],
                         ids=lambda s: "x".join(map(str, s)))
def test_gluon_three_consumer_warpgroups(shape, causal, tiles, monkeypatch):
    """The 192-row variant (three consumer warpgroups, the tiles' last field) on masked and unmasked calls,
    whichever the tables pick."""
    from fmha.kernels import forward_sm90
    b, sq, sk, hq, hk, d = shape
    q, k, v = _inputs(shape)
    monkeypatch.setitem(forward_sm90._TILES, d, tiles)
    monkeypatch.setitem(forward_sm90._WIDE_TILES, d, tiles)
    got, lse = fmha.attention(q, k, v, causal=causal, return_lse=True)
    assert_matches(got, lse, attention_ref(q, k, v, causal=causal), torch.bfloat16)


@pytest.mark.parametrize("shape", [(2, 1000, 1500, 16, 4, 128), (3, 700, 300, 4, 1, 128), (1, 1000, 1064, 4, 2, 128)],
                         ids=lambda s: "x".join(map(str, s)))
def test_gluon_causal_half_tiles_d128(shape):
    """Causal d = 128 without ping-pong (the launcher's choice is with it): warpgroup 0 runs its diagonal tile at
    half width there too."""
    from fmha.kernels import forward_sm90
    b, sq, sk, hq, hk, d = shape
    q, k, v = _inputs(shape)
    out = torch.full((b, sq, hq, d), float("nan"), dtype=torch.bfloat16, device="cuda")
    lse = torch.full((b, hq, sq), float("nan"), device="cuda")
    forward_sm90.attention_forward_sm90(q, k, v, out, lse, causal=True, softmax_scale=d ** -0.5, pingpong=False)
    assert_matches(out, lse, attention_ref(q, k, v, causal=True), torch.bfloat16)


FP8 = torch.float8_e4m3fn
# (batch, seqlen_q, seqlen_k, heads_q, heads_k, head_dim[, head_dim_v]) of the FP8 cases: every tile shape's form.
FP8_SHAPES = [
    (2, 1000, 1500, 16, 4, 128),
    (3, 700, 300, 4, 1, 64),        # Sq > Sk: causal items with no key tile
    (1, 1000, 1064, 4, 2, 64),      # warpgroup 0's diagonal tile at half width
    (1, 4096, 4096, 4, 4, 64),      # three consumer warpgroups
    (2, 513, 1027, 4, 4, 256),      # ping-pong
    (2, 129, 65, 2, 2, 192, 128),
    (2, 64, 2000, 8, 2, 128),       # GQA heads paired in an item
]


def _fp8_inputs(shape, scale=2.0):
    """FP8 q, k, v of `shape` in buffers NaN past seqlen (16 NaN columns past head_dim keep rows 16-byte aligned,
    as TMA needs) and per-(batch, KV head) descales; skips unless the Gluon path takes them."""
    torch.manual_seed(sum(shape))
    b, sq, sk, hq, hk, d, dv = (*shape, shape[-1])[:7]
    q = poisoned((b, sq, hq, d), sq, FP8, "cuda", pad_cols=16, scale=scale)
    k = poisoned((b, sk, hk, d), sk, FP8, "cuda", pad_cols=16, scale=scale)
    v = poisoned((b, sk, hk, dv), sk, FP8, "cuda", pad_cols=16, scale=scale)
    if not _gluon_ok(q, k, v):
        pytest.skip("not an sm_90 GPU")
    descales = {name: torch.rand(b, hk, device="cuda") + 0.5 for name in ("q_descale", "k_descale", "v_descale")}
    return q, k, v, descales


@pytest.mark.parametrize("v_path", ["in-kernel", "copy"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", FP8_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_gluon_fp8(shape, causal, v_path, monkeypatch):
    """FP8 (e4m3) q, k and v with descales on the Gluon kernel (e4m3 wgmma; V transposed in the kernel where it
    can be, or into a copy first) against the oracle on the descaled values; the output bf16, NaN-poisoned before."""
    from fmha.kernels import forward_sm90
    q, k, v, descales = _fp8_inputs(shape)
    # The launcher's default either way (`forward_sm90.transpose_by_default`); where the in-kernel form cannot run
    # (three consumer warpgroups, d = 256), the copy in both.
    monkeypatch.setattr(forward_sm90, "transpose_by_default", lambda *shape: v_path == "in-kernel")
    calls = _spy_gluon(monkeypatch)
    out = torch.full((*q.shape[:3], v.shape[-1]), float("nan"), dtype=torch.bfloat16, device="cuda")
    got, lse = fmha.attention(q, k, v, causal=causal, return_lse=True, out=out, **descales)
    assert len(calls) == 1
    assert_matches_fp8_p(got, lse, attention_ref(q, k, v, causal=causal, **descales), q, k, v, descales)


# (shape, mask, whether V is transposed in the kernel by default) of `test_gluon_fp8_default_v_path`
FP8_DEFAULT_V_CASES = [((2, 1000, 1000, 4, 4, 128), "causal", True), ((2, 1000, 1000, 4, 4, 128), "full", False),
                       ((2, 1000, 1000, 4, 2, 64), "causal", False), ((1, 2048, 2048, 4, 4, 64), "causal", False),
                       ((2, 900, 1000, 4, 4, 64), "window-sinks-softcap-alibi", True)]


@pytest.mark.parametrize("case", FP8_DEFAULT_V_CASES, ids=["causal-mha", "full", "causal-gqa", "causal-2k",
                                                           "window-sinks-softcap-alibi-mha"])
def test_gluon_fp8_default_v_path(case, monkeypatch):
    """The launcher's own choice of V's form (`forward_sm90.transpose_by_default`): short causal MHA calls (a window
    with a right bound counts) transpose V in the kernel and make no copy; the others copy it (`transposed_v`
    called once). Checked against the oracle."""
    from fmha.kernels import forward_sm90
    shape, mask, in_kernel = case
    q, k, v, descales = _fp8_inputs(shape)
    options = dict(causal=mask == "causal")
    if mask == "window-sinks-softcap-alibi":
        options = dict(window=(300, 0), sinks=torch.randn(4, device="cuda") * 2, softcap=5.0,
                       alibi_slopes=torch.rand(4, device="cuda") * 0.2)
    copies = []
    real = forward_sm90.transposed_v
    monkeypatch.setattr(forward_sm90, "transposed_v", lambda *a, **kw: copies.append(1) or real(*a, **kw))
    calls = _spy_gluon(monkeypatch)
    got, lse = fmha.attention(q, k, v, return_lse=True, **options, **descales)
    assert len(calls) == 1 and len(copies) == (0 if in_kernel else 1)
    assert_matches_fp8_p(got, lse, attention_ref(q, k, v, **options, **descales), q, k, v, descales)


@pytest.mark.parametrize("extra", ["window-sinks", "softcap-alibi", "window-sinks-softcap-alibi"])
@pytest.mark.parametrize("descaled", [True, False], ids=["descales", "no-descales"])
def test_gluon_fp8_options(extra, descaled, monkeypatch):
    """FP8 with a window, sinks, softcap and ALiBi (the descales go into the softcap's input scale and the slopes'
    units), with and without descales (each then 1)."""
    shape = (2, 1000, 1200, 8, 2, 128)
    q, k, v, descales = _fp8_inputs(shape)
    if not descaled:
        descales = {}
    calls = _spy_gluon(monkeypatch)
    options = dict(window=(300, 0) if "window" in extra else (-1, -1),
                   sinks=torch.randn(8, device="cuda") * 2 if "sinks" in extra else None,
                   softcap=5.0 if "softcap" in extra else 0.0,
                   alibi_slopes=torch.rand(8, device="cuda") * 0.2 if "alibi" in extra else None)
    got, lse = fmha.attention(q, k, v, return_lse=True, **options, **descales)
    assert len(calls) == 1 and got.dtype == torch.bfloat16
    assert_matches_fp8_p(got, lse, attention_ref(q, k, v, **options, **descales), q, k, v, descales)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("case", VARLEN_CASES[:5], ids=lambda c: f"{len(c[0])}seqs-d{c[4]}")   # FP8: no padded dims
def test_gluon_fp8_varlen(case, causal, monkeypatch):
    """FP8 packed sequences (empty ones, Sq > Sk, three warpgroups at d = 64) with one descale row a sequence, in
    buffers 100 rows longer than the packed keys, NaN there: the copy of V has zeros past cu_seqlens_k[-1]."""
    len_q, len_k, hq, hk, d, dv = (*case, case[-1])[:6]
    torch.manual_seed(len(len_q) + d)
    cu_q, cu_k = (torch.tensor([0, *torch.tensor(n).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
                  for n in (len_q, len_k))
    tq, tk = sum(len_q), sum(len_k)
    q = poisoned((tq, hq, d), tq, FP8, "cuda", dim=0, pad_cols=16, scale=2.0)
    k = poisoned((tk + 100, hk, d), tk, FP8, "cuda", dim=0, pad_cols=16, scale=2.0)
    v = poisoned((tk + 100, hk, dv), tk, FP8, "cuda", dim=0, pad_cols=16, scale=2.0)
    if not _gluon_ok(*(t.unsqueeze(0) for t in (q, k, v))):
        pytest.skip("not an sm_90 GPU")
    descales = {name: torch.rand(len(len_q), hk, device="cuda") + 0.5
                for name in ("q_descale", "k_descale", "v_descale")}
    calls = _spy_gluon(monkeypatch)
    got, lse = fmha.attention_varlen(q, k, v, cu_q, cu_k, max(len_q), max(len_k), causal=causal, return_lse=True,
                                     **descales)
    assert len(calls) == 1 and got.dtype == torch.bfloat16
    ref = attention_varlen_ref(q, k[:tk], v[:tk], cu_q, cu_k, causal=causal, **descales)
    assert_matches_fp8_p(got, lse, ref, q, k[:tk], v[:tk], descales)


def test_gluon_launch_cache_alignment():
    """One call three times with `out` 16-byte aligned, 2 bytes off, aligned again: the unaligned output is a new
    argument class for `launch.launch`, so it gets its own compile instead of the aligned one's (whose stores assume
    the alignment); each result is checked. The second aligned call is a cache hit."""
    b, sq, h, d = 2, 300, 4, 64
    q, k, v = _dense_inputs(4, b, sq, h, d)
    ref = attention_ref(q, k, v, causal=True)
    n = b * sq * h * d
    buf = torch.full((n + 8,), float("nan"), dtype=torch.bfloat16, device="cuda")
    for off in (0, 1, 0):
        buf.fill_(float("nan"))
        out = buf[off:off + n].view(b, sq, h, d)
        got, lse = fmha.attention(q, k, v, causal=True, return_lse=True, out=out)
        assert_matches(got, lse, ref, torch.bfloat16)
        assert buf[:off].isnan().all() and buf[off + n:].isnan().all()


def test_gluon_causal_counter_reuse():
    """Causal calls share one work counter per stream, which each launch leaves zeroed for the next: many launches
    back to back on the default stream and on a side stream (of different grids: the counter must not depend on
    the grid), then a CUDA graph captured with its own counter and replayed twice; every result checked, and the
    shared counters read zero at the end. A launch that left its counter dirty would have the next one skip
    items (NaN rows in `out`)."""
    from fmha.kernels import launch
    torch.manual_seed(5)
    cases = [(2, 700, 8, 64), (1, 1500, 4, 128), (2, 300, 2, 256)]
    inputs = [tuple(torch.randn(b, s, h, d, dtype=torch.bfloat16, device="cuda") for _ in range(3))
              for b, s, h, d in cases]
    if not _gluon_ok(*inputs[0]):
        pytest.skip("not an sm_90 GPU")
    refs = [attention_ref(q, k, v, causal=True) for q, k, v in inputs]

    def run_all():
        outs = [torch.full_like(q, float("nan")) for q, _, _ in inputs]
        lses = [fmha.attention(q, k, v, causal=True, return_lse=True, out=o)[1]
                for (q, k, v), o in zip(inputs, outs)]
        return outs, lses

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    for stream in (torch.cuda.current_stream(), side, torch.cuda.current_stream()):
        with torch.cuda.stream(stream):
            for _ in range(3):
                outs, lses = run_all()
        stream.synchronize()
        for o, lse, ref in zip(outs, lses, refs):
            assert_matches(o, lse, ref, torch.bfloat16)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs, lses = run_all()
    for _ in range(2):
        for o in outs:
            o.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        for o, lse, ref in zip(outs, lses, refs):
            assert_matches(o, lse, ref, torch.bfloat16)
    assert len(launch._COUNTERS) >= 2
    for counter in launch._COUNTERS.values():
        assert not counter.any()


def test_gluon_causal_counter_under_compiled_graphs():
    """torch.compile's CUDA graphs (mode="reduce-overhead"): its warm-up runs are eager calls whose allocations the
    calling thread routes to the graph's private pool, then it records and replays. Compiled calls (warm-up,
    recording, replays) and eager ones on the same inputs alternate, every result checked. A counter first made
    inside the pool fails here: torch refuses a block left alive there untracked (the side-stream form did), and
    one that a graph were given memory over would show as wrong rows in a later call."""
    q, k, v = _dense_inputs(6, 2, 900, 4, 128)
    ref = attention_ref(q, k, v, causal=True)

    def block(q, k, v):
        out, lse = fmha.attention(q, k, v, causal=True, return_lse=True)
        return out * 1.0, lse * 1.0          # copies the graph owns
    compiled = torch.compile(block, mode="reduce-overhead", fullgraph=True)
    for _ in range(5):
        out, lse = compiled(q, k, v)
        assert_matches(out.clone(), lse.clone(), ref, torch.bfloat16)
        out, lse = fmha.attention(q, k, v, causal=True, return_lse=True)
        assert_matches(out, lse, ref, torch.bfloat16)
