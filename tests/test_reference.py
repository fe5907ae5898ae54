"""The oracle checked on its own: `fmha.reference.attention_ref`, the ground truth of every kernel test, against torch's
scaled_dot_product_attention (its math, in float64) given each option as an additive mask: the bottom-right causal
and window masks, ALiBi, GQA, a value width other than the key's, and sinks as one more key (score = the sink's
logit, value 0), which is what SPEC.md's sink is. The LSE against a logsumexp of the same masked scores."""
import math

import pytest
import torch
import torch.nn.functional as F

from fmha.reference import attention_ref

pytestmark = pytest.mark.cpu


def _bias(sq, sk, hq, causal, window, slopes):
    """(hq, sq, sk) additive float64 mask: -inf where a key is hidden, -slope * |i + sk - sq - j| with ALiBi."""
    i = torch.arange(sq)[:, None] + sk - sq          # each query's position among the keys (bottom-right)
    j = torch.arange(sk)[None, :]
    left, right = window
    if causal:
        right = 0
    hidden = torch.zeros(sq, sk, dtype=torch.bool)
    if left >= 0:
        hidden |= j < i - left
    if right >= 0:
        hidden |= j > i + right
    bias = torch.zeros(hq, sq, sk, dtype=torch.float64).masked_fill(hidden, -math.inf)
    if slopes is not None:
        bias = bias - slopes.double()[:, None, None] * (i - j).abs()
    return bias


@pytest.mark.parametrize("seed", range(40))
def test_attention_ref_against_sdpa(seed):
    g = torch.Generator().manual_seed(seed)
    pick = lambda *xs: xs[int(torch.randint(len(xs), (1,), generator=g))]      # noqa: E731
    b, sq, sk = pick(1, 2), pick(1, 5, 17), pick(1, 6, 17, 40)
    hk, group, d, dv = pick(1, 2), pick(1, 3), pick(8, 16), pick(8, 24)
    hq = hk * group
    causal = pick(False, True)
    window = (pick(-1, 0, 3), pick(-1, 0, 2))
    slopes = pick(None, torch.rand(hq, generator=g))
    sinks = pick(None, torch.randn(hq, generator=g) * 2)
    scale = pick(None, 0.3)
    q = torch.randn(b, sq, hq, d, generator=g, dtype=torch.float64)
    k = torch.randn(b, sk, hk, d, generator=g, dtype=torch.float64)
    v = torch.randn(b, sk, hk, dv, generator=g, dtype=torch.float64)
    out, lse = attention_ref(q, k, v, causal=causal, window=window, softmax_scale=scale, alibi_slopes=slopes,
                             sinks=sinks)

    bias = _bias(sq, sk, hq, causal, window, slopes)
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))                         # (b, h, s, d)
    kt, vt = (t.repeat_interleave(group, dim=1) for t in (kt, vt))               # query head h reads KV head h // group
    s = scale if scale is not None else d ** -0.5
    scores = qt @ kt.transpose(-1, -2) * s + bias
    want_lse = torch.logsumexp(scores, dim=-1)                                   # (b, hq, sq)
    if sinks is not None:      # the sink as one more key: score = its logit, value 0
        kt = torch.cat([kt, torch.zeros_like(kt[:, :, :1])], 2)
        vt = torch.cat([vt, torch.zeros_like(vt[:, :, :1])], 2)
        bias = torch.cat([bias, torch.zeros(hq, sq, 1, dtype=torch.float64)], 2)
        bias[..., -1] = sinks.double()[:, None]       # its score: q . 0 x scale + bias = the sink's logit
    seen = torch.isfinite(bias[..., :sk]).any(-1)                                # (hq, sq): rows with a key
    want = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=bias, scale=s)
    want = torch.where(seen[None, :, :, None], want, 0.0).transpose(1, 2)       # a row with no key: 0
    assert torch.allclose(out.double(), want, atol=1e-5, rtol=1e-5), (out.double() - want).abs().max()
    assert torch.equal(torch.isneginf(lse), ~seen.expand_as(lse))
    assert torch.allclose(lse.double()[seen.expand_as(lse)], want_lse[seen.expand_as(lse)], atol=1e-5)


@pytest.mark.parametrize("seed", range(10))
def test_sparse_prefill_ref_against_attention_ref(seed):
    """`mla_sparse_prefill_ref` (batched over tokens, with gathers and masks) against a loop of `attention_ref`, one
    query token and KV head at a time over the rows its valid indices name, duplicates kept (each index is a slot):
    indices past either end or past topk_length skipped, a token with none giving 0, max_logits -inf and LSE +inf,
    the sink as in attention_ref."""
    from fmha.reference import mla_sparse_prefill_ref
    g = torch.Generator().manual_seed(seed)
    s_q, h_kv, group, d, d_v, s_kv, topk = 5, 2, 3, 24, 16, 11, 9
    q = torch.randn(s_q, h_kv * group, d, generator=g, dtype=torch.float64)
    kv = torch.randn(s_kv, h_kv, d, generator=g, dtype=torch.float64)
    indices = torch.randint(-3, s_kv + 3, (s_q, h_kv, topk), generator=g, dtype=torch.int32)
    indices[0] = -1                                                  # token 0 sees nothing
    topk_length = torch.randint(0, topk + 2, (s_q,), generator=g, dtype=torch.int32)
    sinks = torch.randn(h_kv * group, generator=g) if seed % 2 else None
    out, max_logits, lse = mla_sparse_prefill_ref(q, kv, indices, d_v, sm_scale=0.2, attn_sink=sinks,
                                                  topk_length=topk_length)
    for i in range(s_q):
        for h in range(h_kv):
            row = indices[i, h, :max(int(topk_length[i]), 0)]
            keys = kv[row[(row >= 0) & (row < s_kv)].long(), h][None, :, None]          # (1, n, 1, d)
            heads = slice(h * group, (h + 1) * group)
            o, l = attention_ref(q[i:i + 1, heads][None], keys, keys[..., :d_v], softmax_scale=0.2,
                                 sinks=None if sinks is None else sinks[heads])
            assert torch.allclose(out[i, heads].double(), o[0, 0].double(), atol=1e-5)
            if keys.shape[1] == 0:
                assert torch.isposinf(lse[i, heads]).all() and torch.isneginf(max_logits[i, heads]).all()
                continue
            assert torch.allclose(lse[i, heads].double(), l[0, :, 0].double(), atol=1e-5)
            scores = (q[i, heads] @ keys[0, :, 0].T) * 0.2
            assert torch.allclose(max_logits[i, heads].double(), scores.amax(-1), atol=1e-5)
