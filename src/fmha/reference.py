"""fp32 oracles: the tests' ground truth for every option of SPEC.md.

Written for clarity, not speed: every score is materialised. Inputs may be fp16/bf16; all math is fp32
(or fp64 when the caller passes fp64). Outputs are returned in fp32 so a test can compare at full precision.
"""
from __future__ import annotations

import math

import torch

__all__ = ["visible_mask", "attention_ref", "attention_varlen_ref", "gather_pages", "mla_decode_ref",
           "mla_sparse_decode_ref", "rotary_ref"]


def visible_mask(seqlen_q: int, seqlen_k: int, window=(-1, -1), device=None) -> torch.Tensor:
    """Boolean `(seqlen_q, seqlen_k)`: True where query i may see key j.

    Bottom-right aligned: key j is visible iff `i + Sk - Sq - left <= j <= i + Sk - Sq + right`,
    a negative bound meaning unbounded on that side. `causal=True` is `window=(left, 0)`.
    """
    left, right = window
    i = torch.arange(seqlen_q, device=device)[:, None]
    j = torch.arange(seqlen_k, device=device)[None, :]
    diag = i + seqlen_k - seqlen_q
    mask = torch.ones(seqlen_q, seqlen_k, dtype=torch.bool, device=device)
    if left >= 0:
        mask &= j >= diag - left
    if right >= 0:
        mask &= j <= diag + right
    return mask


def _effective_window(causal: bool, window) -> tuple[int, int]:
    left, right = int(window[0]), int(window[1])
    if causal:
        right = 0 if right < 0 else min(right, 0)
    return left, right


def attention_ref(q, k, v, *, causal=False, window=(-1, -1), softmax_scale=None, softcap=0.0,
                  alibi_slopes=None, sinks=None, q_descale=None, k_descale=None, v_descale=None):
    """Dense attention in fp32. q `(b, sq, hq, dqk)`, k `(b, sk, hk, dqk)`, v `(b, sk, hk, dv)`.

    Returns `(out (b, sq, hq, dv) fp32, lse (b, hq, sq) fp32)`. LSE is the natural log of the softmax
    denominator *without* the sink; rows that see no key give output 0 and LSE -inf. `window[0]` may be a
    `(b,)` tensor of per-sequence left bounds (negative = unbounded). `q_descale` / `k_descale` / `v_descale`
    `(b, hk)`: the inputs' values times these (FP8 inputs; query head h takes row h // (hq // hk)).
    """
    if isinstance(window[0], torch.Tensor):
        parts = [attention_ref(q[i:i + 1], k[i:i + 1], v[i:i + 1], causal=causal,
                               window=(_left_bound(window[0], i), window[1]), softmax_scale=softmax_scale,
                               softcap=softcap, alibi_slopes=alibi_slopes, sinks=sinks,
                               **_descales_of(i, q_descale=q_descale, k_descale=k_descale, v_descale=v_descale))
                 for i in range(q.shape[0])]
        return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
    b, sq, hq, dqk = q.shape
    sk, hk = k.shape[1], k.shape[2]
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    scale = softmax_scale if softmax_scale is not None else dqk ** -0.5
    group = hq // hk
    # Query head h reads KV head h // group. The group's query rows are stacked on the rows of one product per KV
    # head, so K and V are never copied per query head (at h_q = 128 that copy was 128 times the cache).
    qf = q.to(acc).view(b, sq, hk, group, dqk).permute(0, 2, 3, 1, 4).reshape(b, hk, group * sq, dqk)
    kf = k.to(acc).transpose(1, 2)                                      # (b, hk, sk, d)
    vf = v.to(acc).transpose(1, 2)
    if q_descale is not None:
        qf = qf * q_descale.to(acc).view(b, hk, 1, 1)
    if k_descale is not None:
        kf = kf * k_descale.to(acc).view(b, hk, 1, 1)
    if v_descale is not None:
        vf = vf * v_descale.to(acc).view(b, hk, 1, 1)
    s = (torch.matmul(qf, kf.transpose(-1, -2)) * scale).view(b, hq, sq, sk)
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    i = torch.arange(sq, device=q.device)[:, None]
    j = torch.arange(sk, device=q.device)[None, :]
    if alibi_slopes is not None:
        dist = (i + sk - sq - j).abs().to(acc)
        s = s - alibi_slopes.to(acc).view(1, hq, 1, 1) * dist
    mask = visible_mask(sq, sk, _effective_window(causal, window), device=q.device)
    s = s.masked_fill(~mask, -math.inf)
    lse = torch.logsumexp(s, dim=-1)                                    # -inf where no key is visible
    p = torch.exp(s - torch.where(torch.isinf(lse), 0.0, lse)[..., None])
    out = torch.matmul(p.view(b, hk, group * sq, sk), vf).view(b, hq, sq, vf.shape[-1])   # (b, hq, sq, dv)
    if sinks is not None:
        # o = o_nosink * e^lse / (e^lse + e^sink) = o_nosink * sigmoid(lse - sink)
        w = torch.sigmoid(lse - sinks.to(acc).view(1, hq, 1))
        out = out * torch.where(torch.isinf(lse) & (lse < 0), 0.0, w)[..., None]
    return out.transpose(1, 2).float(), lse.float()


def _descales_of(i, **descales):
    """Sequence i's rows of the FP8 descales (each None or `(batch, hk)`), as keyword arguments."""
    return {name: None if t is None else t[i:i + 1] for name, t in descales.items()}


def _left_bound(lefts, i):
    """Sequence i's left window bound from a per-sequence tensor (negative = unbounded)."""
    return max(int(lefts[i]), -1)


def attention_varlen_ref(q, k, v, cu_seqlens_q, cu_seqlens_k, **options):
    """Varlen attention in fp32: q `(total_q, hq, dqk)`; returns `(out (total_q, hq, dv), lse (hq, total_q))`."""
    window = options.pop("window", (-1, -1))
    descales = {name: options.pop(name, None) for name in ("q_descale", "k_descale", "v_descale")}
    cq = cu_seqlens_q.tolist()
    ck = cu_seqlens_k.tolist()
    hq, dv = q.shape[1], v.shape[2]
    out = torch.zeros(q.shape[0], hq, dv, dtype=torch.float32, device=q.device)
    lse = torch.full((hq, q.shape[0]), -math.inf, dtype=torch.float32, device=q.device)
    for b in range(len(cq) - 1):
        qs, qe, ks, ke = cq[b], cq[b + 1], ck[b], ck[b + 1]
        if qe == qs:
            continue
        left = _left_bound(window[0], b) if isinstance(window[0], torch.Tensor) else window[0]
        o_b, lse_b = attention_ref(q[None, qs:qe], k[None, ks:ke], v[None, ks:ke], window=(left, window[1]),
                                   **_descales_of(b, **descales), **options)
        out[qs:qe] = o_b[0]
        lse[:, qs:qe] = lse_b[0]
    return out, lse


def rotary_ref(x, cos, sin, positions, *, interleaved=False):
    """Rotary embedding of `x (batch, seqlen, heads, d)`: token t of batch b is at position `positions[b][t]`; its
    first `2 * cos.shape[1]` values, as pairs (i, i + half) or, `interleaved`, (2i, 2i + 1), are turned by the
    angle whose cosine and sine are `cos[pos, i]`, `sin[pos, i]` (a complex multiplication, one token at a time);
    the rest pass through. fp32 out."""
    half = cos.shape[1]
    out = x.float().clone()
    for b in range(x.shape[0]):
        for t in range(x.shape[1]):
            pos = int(positions[b][t])
            turn = torch.complex(cos[pos].float(), sin[pos].float())
            v = out[b, t, :, :2 * half]
            pairs = v.unflatten(-1, (half, 2)) if interleaved else v.unflatten(-1, (2, half)).transpose(-1, -2)
            z = torch.view_as_real(torch.view_as_complex(pairs.contiguous()) * turn)
            out[b, t, :, :2 * half] = z.flatten(-2) if interleaved else z.transpose(-1, -2).flatten(-2)
    return out


def gather_pages(cache, block_table, seqlen):
    """The first `seqlen` tokens of one sequence from a paged cache `(num_blocks, page_size, ...)`, given its
    row of the block table."""
    page_size = cache.shape[1]
    pages = block_table[: -(-seqlen // page_size)].long()
    return cache[pages].flatten(0, 1)[:seqlen]


def mla_decode_ref(q, k_cache, block_table, cache_seqlens, head_dim_v, *, causal=False, softmax_scale=None,
                   attn_sink=None):
    """flash_mla_with_kvcache in fp32: q `(b, s_q, h_q, d)`, k_cache `(num_blocks, page, h_k, d)`; the value
    is the first `head_dim_v` columns of the key; `attn_sink (h_q,)` as SPEC.md's sinks. Returns
    `(out (b, s_q, h_q, dv), lse (b, h_q, s_q))` with FlashMLA's convention for a row that sees no key:
    output 0, LSE +inf."""
    scale = softmax_scale if softmax_scale is not None else q.shape[-1] ** -0.5
    outs, lses = [], []
    for b, n in enumerate(cache_seqlens.tolist()):
        k = gather_pages(k_cache, block_table[b], n).unsqueeze(0)
        o, lse = attention_ref(q[b:b + 1], k, k[..., :head_dim_v], causal=causal, softmax_scale=scale,
                               sinks=attn_sink)
        outs.append(o)
        lses.append(torch.where(torch.isneginf(lse), math.inf, lse))
    return torch.cat(outs), torch.cat(lses)


def mla_sparse_decode_ref(q, k_cache, indices, head_dim_v, *, topk_length=None, softmax_scale=None, attn_sink=None):
    """Token-sparse flash_mla_with_kvcache in fp32: query token (b, s) attends to the cache tokens at the flat
    positions `indices[b, s, :topk_length[b]]` that are not -1 (positions `block * page_size + offset`; a length
    below 0 counts as 0, one past topk as topk). Returns `(out (b, s_q, h_q, dv), lse (b, h_q, s_q))`; a token with
    no valid index gets 0 and LSE +inf."""
    b, s_q, h_q, _ = q.shape
    scale = softmax_scale if softmax_scale is not None else q.shape[-1] ** -0.5
    tokens = k_cache.flatten(0, 1)
    out = torch.zeros(b, s_q, h_q, head_dim_v, dtype=torch.float32, device=q.device)
    lse = torch.full((b, h_q, s_q), math.inf, dtype=torch.float32, device=q.device)
    for i in range(b):
        n = indices.shape[2] if topk_length is None else max(int(topk_length[i]), 0)
        for s in range(s_q):
            row = indices[i, s, :n]
            k = tokens[row[row >= 0].long()].unsqueeze(0)
            o, l = attention_ref(q[i:i + 1, s:s + 1], k, k[..., :head_dim_v], softmax_scale=scale, sinks=attn_sink)
            out[i, s] = o[0, 0]
            lse[i, :, s] = torch.where(torch.isneginf(l[0, :, 0]), math.inf, l[0, :, 0])
    return out, lse


def mla_sparse_prefill_ref(q, kv, indices, d_v, *, sm_scale=None, attn_sink=None, topk_length=None, chunk=64):
    """flash_mla_sparse_fwd in fp32: q `(s_q, h_q, d)`, kv `(s_kv, h_kv, d)`, indices `(s_q, h_kv, topk)`; an index
    < 0 or >= s_kv, or past `topk_length[i]`, is skipped. Returns `(out (s_q, h_q, d_v), max_logits (s_q, h_q),
    lse (s_q, h_q))`: max_logits is -inf and lse +inf (FlashMLA's convention) for a row with no valid index, whose
    output is 0; `attn_sink` as SPEC.md's sinks (the LSE excludes it)."""
    s_q, h_q, d = q.shape
    s_kv, h_kv = kv.shape[:2]
    g = h_q // h_kv
    scale = sm_scale if sm_scale is not None else d ** -0.5
    topk = indices.shape[2]
    valid = (indices >= 0) & (indices < s_kv)
    if topk_length is not None:
        valid &= torch.arange(topk, device=q.device)[None, None, :] < topk_length.view(s_q, 1, 1)
    out = torch.empty(s_q, h_q, d_v, dtype=torch.float32, device=q.device)
    max_logits = torch.empty(s_q, h_q, dtype=torch.float32, device=q.device)
    lse = torch.empty(s_q, h_q, dtype=torch.float32, device=q.device)
    heads = torch.arange(h_kv, device=q.device).view(1, h_kv, 1)
    for i in range(0, s_q, chunk):
        sl = slice(i, i + chunk)
        k = kv[torch.where(valid[sl], indices[sl], 0).long(), heads].float()       # (c, h_kv, topk, d)
        k = torch.where(valid[sl].unsqueeze(-1), k, 0.0)        # an invalid slot's stand-in row may be NaN
        qc = q[sl].float().view(-1, h_kv, g, d)
        s = torch.einsum("chgd,chkd->chgk", qc, k) * scale
        s = s.masked_fill(~valid[sl].unsqueeze(2), -math.inf)
        m = s.amax(-1)
        l = torch.logsumexp(s, -1)
        p = torch.exp(s - torch.where(torch.isinf(l), 0.0, l).unsqueeze(-1))
        o = torch.einsum("chgk,chkd->chgd", p, k[..., :d_v])
        if attn_sink is not None:
            w = torch.sigmoid(l - attn_sink.float().view(h_kv, g))
            o = o * torch.where(torch.isneginf(l), 0.0, w).unsqueeze(-1)
        out[sl] = o.reshape(-1, h_q, d_v)
        max_logits[sl] = m.reshape(-1, h_q)
        lse[sl] = torch.where(torch.isneginf(l), math.inf, l).reshape(-1, h_q)
    return out, max_logits, lse
