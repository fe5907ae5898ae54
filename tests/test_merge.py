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
    """A part with LSE -inf contributes nothing (even if its output holds garbage: large values, NaN, inf); all -inf
    gives 0, -inf."""
    device, dtype = target
    o_a = torch.randn(3, 5, 16, device=device, dtype=dtype)
    lse_a = torch.randn(3, 5, device=device)
    o_b = torch.full_like(o_a, 1e4)
    o_b[0], o_b[1, :, 3] = float("nan"), float("inf")
    lse_b = torch.full_like(lse_a, -math.inf)
    o, lse = fmha.merge_attention_states(o_a, lse_a, o_b, lse_b)
    assert torch.equal(lse, lse_a) and torch.allclose(o.float(), o_a.float(), atol=1e-3)
    o, lse = fmha.merge_attention_states(o_b, lse_b, o_a, lse_a)
    assert torch.equal(lse, lse_a) and torch.allclose(o.float(), o_a.float(), atol=1e-3)
    o, lse = fmha.merge_attention_states(o_b, lse_b, o_b, lse_b)
    assert torch.equal(o, torch.zeros_like(o)) and torch.isneginf(lse).all()


@pytest.mark.parametrize("target", TARGETS)
def test_merge_pos_inf(target):
    """An LSE of +inf (FlashMLA's API marks a row with no key so, output 0) weighs nothing, as -inf does; a row of
    only such parts gives 0 and -inf; apply_attention_sink leaves such a row's 0, an infinite sink included."""
    device, dtype = target
    o_a = torch.randn(3, 5, 16, device=device, dtype=dtype)
    lse_a = torch.randn(3, 5, device=device)
    o_b, lse_b = torch.zeros_like(o_a), torch.full_like(lse_a, math.inf)
    for pair in ((o_a, lse_a, o_b, lse_b), (o_b, lse_b, o_a, lse_a)):
        o, lse = fmha.merge_attention_states(*pair)
        assert torch.equal(lse, lse_a) and torch.allclose(o.float(), o_a.float(), atol=1e-3)
    o, lse = fmha.merge_attention_states_list([o_b, o_b, o_b], [lse_b, lse_b.neg(), lse_b])
    assert torch.equal(o, torch.zeros_like(o)) and torch.isneginf(lse).all()
    sinks = torch.tensor([0.5, math.inf, -math.inf, 2.0, 0.0], device=device)
    assert torch.equal(fmha.apply_attention_sink(o_b, lse_b, sinks), o_b)


@pytest.mark.parametrize("target", TARGETS)
def test_merge_mla_halves(target):
    """Context-parallel MLA decode: the keys of each sequence cut at a page boundary, each half attended by
    `fmha.mla.flash_mla_with_kvcache` without the sink (a half with no key: output 0, LSE +inf, FlashMLA's
    convention), merged, the sink applied once: the whole cache's answer, with the sink. The sequence with no key
    at all gives 0 (and LSE -inf, the merge's convention, where the whole call says +inf)."""
    import fmha.mla as flash_mla

    device, dtype = target
    torch.manual_seed(3)
    page, d, dv, h_q = 16, (48 if device == "cpu" else 576), (32 if device == "cpu" else 512), 16
    lens = torch.tensor([0, 20, 40, 16], dtype=torch.int32, device=device)
    q = torch.randn(len(lens), 1, h_q, d, device=device, dtype=dtype)
    cache = torch.randn(12, page, 1, d, device=device, dtype=dtype)
    table = torch.randperm(12, device=device).to(torch.int32).view(4, 3)
    sinks = torch.randn(h_q, device=device)

    def mla(lengths, blocks, sink=None):
        meta, splits = flash_mla.get_mla_metadata(lengths, h_q, 1)
        return flash_mla.flash_mla_with_kvcache(q, cache, blocks, lengths, dv, meta, splits, attn_sink=sink)

    whole, whole_lse = mla(lens, table, sinks)
    parts = [mla(lens.clamp(max=page), table[:, :1]), mla((lens - page).clamp(min=0), table[:, 1:].contiguous())]
    assert torch.isposinf(parts[0][1][0]).all() and torch.isposinf(parts[1][1][3]).all()    # the empty halves
    o, lse = fmha.merge_attention_states(*(t.squeeze(1) if t.dim() == 4 else t.squeeze(-1) for part in parts
                                           for t in part))
    got = fmha.apply_attention_sink(o, lse, sinks)
    torch.testing.assert_close(got.float(), whole.squeeze(1).float(), atol=2e-2 if dtype == torch.bfloat16 else 4e-3,
                               rtol=0)
    torch.testing.assert_close(lse[1:], whole_lse.squeeze(-1)[1:], atol=1e-3, rtol=0)
    assert (got[0] == 0).all() and torch.isneginf(lse[0]).all() and torch.isposinf(whole_lse[0]).all()


def test_merge_bad_input():
    o = torch.zeros(2, 3, 8)
    lse = torch.zeros(2, 3)
    with pytest.raises(ValueError, match=r"lse_b: expected shape"):
        fmha.merge_attention_states(o, lse, o, lse.T)
    with pytest.raises(TypeError, match=r"lse_a: expected dtype"):
        fmha.merge_attention_states(o, lse.half(), o, lse)
    with pytest.raises(ValueError, match=r"o_b: expected shape"):
        fmha.merge_attention_states(o, lse, o[:1], lse[:1])
    with pytest.raises(ValueError, match=r"outs\[2\]: expected shape"):
        fmha.merge_attention_states_list([o, o, o[:1]], [lse, lse, lse[:1]])
    with pytest.raises(TypeError, match=r"o_a: expected a torch.Tensor, got list"):
        fmha.merge_attention_states(o.tolist(), lse, o, lse)
    with pytest.raises(TypeError, match=r"sinks: expected a torch.Tensor, got None"):
        fmha.apply_attention_sink(o, lse, None)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("dv,parts,variable,pdl", [(128, 5, False, False), (128, 33, False, False),
                                                   (512, 40, True, False), (64, 1, True, False), (512, 40, True, True)])
def test_combine_kernel(target, dv, parts, variable, pdl):
    """The split-KV combine (`kernels.combine`) against a float64 merge: uniform parts per batch, or a variable
    number per batch (the MLA scheduler's numbering, where more parts than one tile holds are merged in chunks);
    parts with LSE -inf (no key) weigh nothing; a row of only such parts gives 0 and the empty LSE; sinks.
    `pdl` (GPU): launched as a programmatic dependent launch, as after the Gluon MLA kernel (here after no kernel
    that lets it start early): the batch of one part is left alone, the others merged after the wait."""
    from fmha.kernels.combine import combine

    device, dtype = target
    if pdl and device == "cpu":
        pytest.skip("programmatic dependent launch: CUDA only (the interpreter has no griddepcontrol)")
    torch.manual_seed(parts)
    batch, s_q, h_q, group = 3, 2, 4, 2
    rows_per_k = s_q * group
    rows = (h_q // group) * rows_per_k
    if variable:
        counts = [parts, max(1, parts // 3), 2 if parts > 1 else 1]
        offsets = torch.tensor([0] + list(torch.tensor(counts).cumsum(0)), dtype=torch.int32, device=device)
        o_part = torch.randn(sum(counts), rows, dv, device=device)
        lse_part = torch.randn(sum(counts), rows, device=device) * 4
        slots = [list(range(int(offsets[b]), int(offsets[b + 1]))) for b in range(batch)]
        kw = dict(split_offsets=offsets)
        get = lambda t, b, s: t[s]
    else:
        o_part = torch.randn(parts, batch, rows, dv, device=device)
        lse_part = torch.randn(parts, batch, rows, device=device) * 4
        slots = [list(range(parts))] * batch
        kw = dict(num_splits=parts)
        get = lambda t, b, s: t[s, b]
    # Some parts saw no key; all of row 0 of batch 0's parts did not.
    for b in range(batch):
        for s in slots[b][::3]:
            get(lse_part, b, s)[1] = float("-inf")
        for s in slots[b]:
            if b == 0:
                get(lse_part, b, s)[0] = float("-inf")
    sinks = torch.randn(h_q, device=device)
    out = torch.full((batch, s_q, h_q, dv), float("nan"), dtype=dtype, device=device)
    lse = torch.full((batch, h_q, s_q), float("nan"), device=device)
    combine(out, lse, o_part, lse_part, rows_per_k=rows_per_k, group=group, sinks=sinks, pdl=pdl, **kw)
    for b in range(batch):
        if len(slots[b]) == 1 and variable:   # one part: the split kernel wrote it as final output
            assert out[b].isnan().all() and lse[b].isnan().all()
            continue
        o = torch.stack([get(o_part, b, s) for s in slots[b]]).double().cpu()
        l = torch.stack([get(lse_part, b, s) for s in slots[b]]).double().cpu()
        lse_ref = torch.logsumexp(l, 0)
        w = torch.where(torch.isinf(lse_ref), 0.0, torch.exp(l - lse_ref))
        o_ref = (w[..., None] * o).sum(0)
        for r in range(rows):
            q_pos, q_head = (r % rows_per_k) // group, (r // rows_per_k) * group + r % group
            keep = 1.0 if torch.isinf(lse_ref[r]) else 1.0 / (1.0 + math.exp(float(sinks[q_head]) - float(lse_ref[r])))
            tol = 3e-2 if dtype == torch.bfloat16 else 5e-3
            torch.testing.assert_close(out[b, q_pos, q_head].double().cpu(), o_ref[r] * keep, atol=tol, rtol=tol)
            got = float(lse[b, q_head, q_pos])
            assert got == float(lse_ref[r]) if torch.isinf(lse_ref[r]) else abs(got - float(lse_ref[r])) < 1e-4


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("group", [1, 2])
def test_combine_kernel_packed(target, group):
    """The combine into packed rows (`cu_seqlens_q`: a varlen call's short launch, `forward.attention_forward`):
    each slab holds s_q positions of a sequence, of which it merges those the sequence has; a sequence of more rows
    than s_q (the other launch's) and the rows past each sequence's end are left as they were (NaN here), and so is
    the slab of a sequence with none. Decodes beside longer short sequences leave most programs of the grid with no
    row of theirs (skipped), the others one row or more (merged)."""
    from fmha.kernels.combine import combine

    device, dtype = target
    torch.manual_seed(group)
    s_q, h_q, dv, parts = 8, 4, 64, 3
    lens = [1, 0, 3, 1, 9, 8, 2, 1]
    rows_per_k = s_q * group
    cu_q = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32, device=device)
    o_part = torch.randn(parts, len(lens), (h_q // group) * rows_per_k, dv, device=device)
    lse_part = torch.randn(parts, len(lens), (h_q // group) * rows_per_k, device=device) * 4
    out = torch.full((sum(lens), h_q, dv), float("nan"), dtype=dtype, device=device)
    lse = torch.full((h_q, sum(lens)), float("nan"), device=device)
    combine(out, lse, o_part, lse_part, rows_per_k=rows_per_k, group=group, num_splits=parts, cu_seqlens_q=cu_q)
    tol = 3e-2 if dtype == torch.bfloat16 else 5e-3
    for b, n in enumerate(lens):
        first = int(cu_q[b])
        if n > s_q:
            assert out[first:first + n].isnan().all() and lse[:, first:first + n].isnan().all()
            continue
        for pos in range(n):
            for head in range(h_q):
                r = (head // group) * rows_per_k + pos * group + head % group
                l = lse_part[:, b, r].double().cpu()
                lse_ref = torch.logsumexp(l, 0)
                o_ref = (torch.exp(l - lse_ref)[:, None] * o_part[:, b, r].double().cpu()).sum(0)
                torch.testing.assert_close(out[first + pos, head].double().cpu(), o_ref, atol=tol, rtol=tol)
                assert abs(float(lse[head, first + pos]) - float(lse_ref)) < 1e-4
