"""merge_attention_states: attention over [K_a; K_b] equals the merge of attention over K_a and over K_b."""
import math

import pytest
import torch

import fmha
from fmha.reference import attention_ref
from utils import TARGETS, assert_matches


def _split_case(device, dtype, seed=0):
    torch.manual_seed(seed)
    b, sq, sk, hq, hk, d = (2, 9, 70, 4, 2, 64) if device == "cpu" else (2, 300, 3000, 16, 4, 128)
    q = torch.randn(b, sq, hq, d, device=device, dtype=dtype)
    k = torch.randn(b, sk, hk, d, device=device, dtype=dtype)
    v = torch.randn(b, sk, hk, d, device=device, dtype=dtype)
    return q, k, v


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("parts", [2, 3])
def test_merge_equals_whole(target, parts):
    device, dtype = target
    q, k, v = _split_case(device, dtype)
    cuts = [0, 20, 45, k.shape[1]] if parts == 3 else [0, 31, k.shape[1]]
    outs, lses = [], []
    for lo, hi in zip(cuts, cuts[1:]):
        o, lse = fmha.attention(q, k[:, lo:hi], v[:, lo:hi], return_lse=True)
        outs.append(o)
        lses.append(lse.transpose(1, 2))            # (b, sq, hq): o's shape without head_dim
    if parts == 2:
        o, lse = fmha.merge_attention_states(outs[0], lses[0], outs[1], lses[1])
    else:
        o, lse = fmha.merge_attention_states_list(outs, lses)
    assert_matches(o, lse.transpose(1, 2), attention_ref(q, k, v), dtype)


@pytest.mark.parametrize("target", TARGETS)
def test_external_merge_with_sink(target):
    """The Stage D flow: two branches (a compressed-KV stand-in and a sliding window over the recent keys, causal)
    run without sinks into fp32 outputs, merged, then the sink applied once: equal to one attention with sinks
    over the union. Sinks include +inf (head silenced) and -inf (no effect)."""
    device, dtype = target
    q, k, v = _split_case(device, dtype, seed=3)
    b, sq, hq, _ = q.shape
    cut = k.shape[1] // 3
    sinks = torch.randn(hq, device=device) * 2
    sinks[:2] = torch.tensor([math.inf, -math.inf])
    outs, lses = [], []
    for lo, hi, causal in ((0, cut, False), (cut, k.shape[1], True)):
        out = torch.empty(b, sq, hq, v.shape[-1], device=device, dtype=torch.float32)
        o, lse = fmha.attention(q, k[:, lo:hi], v[:, lo:hi], causal=causal, return_lse=True, out=out)
        assert o is out
        outs.append(o)
        lses.append(lse.transpose(1, 2))
    o, lse = fmha.merge_attention_states(outs[0], lses[0], outs[1], lses[1])
    o = fmha.apply_attention_sink(o, lse, sinks)
    # The oracle: causal over the whole key range is the second branch's mask; the first branch sees all of
    # its keys (they lie before every query's causal limit here).
    assert k.shape[1] - q.shape[1] >= cut
    assert_matches(o.to(dtype), lse.transpose(1, 2), attention_ref(q, k, v, causal=True, sinks=sinks), dtype)
    assert (o[:, :, 0] == 0).all()


@pytest.mark.parametrize("target", TARGETS)
def test_merge_neg_inf(target):
    """A part with LSE -inf contributes nothing (even if its output holds garbage); all -inf gives 0, -inf."""
    device, dtype = target
    o_a = torch.randn(3, 5, 16, device=device, dtype=dtype)
    lse_a = torch.randn(3, 5, device=device)
    o_b = torch.full_like(o_a, 1e4)
    lse_b = torch.full_like(lse_a, -math.inf)
    o, lse = fmha.merge_attention_states(o_a, lse_a, o_b, lse_b)
    assert torch.equal(lse, lse_a) and torch.allclose(o.float(), o_a.float(), atol=1e-3)
    o, lse = fmha.merge_attention_states(o_b, lse_b, o_a, lse_a)
    assert torch.equal(lse, lse_a) and torch.allclose(o.float(), o_a.float(), atol=1e-3)
    o, lse = fmha.merge_attention_states(o_b, lse_b, o_b, lse_b)
    assert torch.equal(o, torch.zeros_like(o)) and torch.isneginf(lse).all()


def test_merge_bad_input():
    o = torch.zeros(2, 3, 8)
    lse = torch.zeros(2, 3)
    with pytest.raises(ValueError, match=r"lse\[1\]: expected shape"):
        fmha.merge_attention_states(o, lse, o, lse.T)
    with pytest.raises(TypeError, match=r"lse\[0\]: expected dtype"):
        fmha.merge_attention_states(o, lse.half(), o, lse)
    with pytest.raises(ValueError, match=r"o\[1\]: expected shape"):
        fmha.merge_attention_states(o, lse, o[:1], lse[:1])
