"""Fused attention for prefill: `attention` (padded batch) and `attention_varlen` (packed sequences).

Data path: public function → `_validate` → allocate outputs → torch custom op → `kernels.forward`.
The custom op (`fmha::attention_fwd`) has a fake implementation, so `torch.compile(fullgraph=True)`
traces a model that calls these functions without graph breaks.
"""
from __future__ import annotations

from typing import Optional

import torch

from . import _validate as V
from ._ops import custom_op, forward_only
from .kernels.forward import attention_forward
from .schedule import MAX_FORCED_SPLITS

__all__ = ["attention", "attention_varlen", "attention_with_kvcache"]


@custom_op("fmha::attention_fwd", mutates_args=("out",))
def _attention_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                   cu_seqlens_q: Optional[torch.Tensor], cu_seqlens_k: Optional[torch.Tensor],
                   max_seqlen_q: int, max_seqlen_k: int, softmax_scale: float,
                   window_left: int, window_right: int, softcap: float,
                   alibi_slopes: Optional[torch.Tensor], sinks: Optional[torch.Tensor],
                   window_lefts: Optional[torch.Tensor] = None, q_descale: Optional[torch.Tensor] = None,
                   k_descale: Optional[torch.Tensor] = None, v_descale: Optional[torch.Tensor] = None,
                   seqused_k: Optional[torch.Tensor] = None,
                   block_table: Optional[torch.Tensor] = None) -> torch.Tensor:
    lse = torch.empty(_lse_shape(q, cu_seqlens_q), dtype=torch.float32, device=q.device)
    attention_forward(q, k, v, out, lse, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                      max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k, softmax_scale=softmax_scale,
                      window=(window_left, window_right), window_lefts=window_lefts, softcap=softcap,
                      alibi_slopes=alibi_slopes, sinks=sinks, descales=(q_descale, k_descale, v_descale),
                      cache_seqlens=seqused_k, block_table=block_table, interpret=q.device.type == "cpu")
    return lse


@_attention_fwd.register_fake
def _(q, k, v, out, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale,
      window_left, window_right, softcap, alibi_slopes, sinks, window_lefts=None, q_descale=None, k_descale=None,
      v_descale=None, seqused_k=None, block_table=None):
    return q.new_empty(_lse_shape(q, cu_seqlens_q), dtype=torch.float32)


def _lse_shape(q, cu_seqlens_q):
    if cu_seqlens_q is not None:                 # varlen q: (total_q, hq, d)
        return (q.shape[1], q.shape[0])
    return (q.shape[0], q.shape[2], q.shape[1])  # dense q: (b, sq, hq, d)


def _prepare(q, k, v, *, varlen, causal, window, softmax_scale, softcap, alibi_slopes, sinks, out, descales,
             check_batch=True, batch=None, paged=False, names=("q", "k", "v")):
    """Shared validation + output allocation. Returns (out, softmax_scale, (left, right), lefts): `lefts` is the
    `(batch,)` int32 tensor of per-sequence left bounds when `window[0]` is one (then left is -1), else None.
    `descales`: (q_descale, k_descale, v_descale) as the caller passed them. `paged`: k and v are paged caches
    beside packed queries. `names`: q, k and v's names in the caller's signature, for the messages."""
    V.check_qkv(q, k, v, varlen=varlen, check_batch=check_batch, paged=paged, names=names)
    if isinstance(window, (tuple, list)):
        window = tuple(V.python_number(w) for w in window)
    softmax_scale, softcap = V.python_number(softmax_scale), V.python_number(softcap)
    if not isinstance(causal, bool):
        raise TypeError(f"causal: expected a bool, got {type(causal).__name__}")
    batch = q.shape[0] if batch is None else batch
    V.check_options(q, window=window, softmax_scale=softmax_scale, softcap=softcap,
                    alibi_slopes=alibi_slopes, sinks=sinks, batch=batch)
    V.check_descales(q, k, v, descales, batch, names)
    out_shape = (*q.shape[:-1], v.shape[-1])
    # float8_e4m3fn q: a bf16 output by default (FlashAttention-3's), fp16 or fp32 on request.
    fp8 = q.dtype == V.FP8
    V.check_out(out, out_shape, (torch.bfloat16, torch.float16) if fp8 else (q.dtype,), q.device)
    if out is None:
        out = q.new_empty(out_shape, dtype=torch.bfloat16 if fp8 else q.dtype)
    left, right = window
    if causal:
        right = 0
    scale = float(softmax_scale) if softmax_scale is not None else q.shape[-1] ** -0.5
    if isinstance(left, torch.Tensor):
        return out, scale, (-1, int(right)), left
    return out, scale, (int(left), int(right)), None


@forward_only
def attention(q, k, v, *, causal=False, window=(-1, -1), softmax_scale=None, softcap=0.0,
              alibi_slopes=None, sinks=None, return_lse=False, out=None, q_descale=None, k_descale=None,
              v_descale=None):
    """Fused multi-head attention over a padded batch.

    Args:
        q: `(batch, seqlen_q, heads_q, head_dim_qk)`, fp16, bf16 or float8_e4m3fn, last dim contiguous.
        k: `(batch, seqlen_k, heads_k, head_dim_qk)`, `heads_q % heads_k == 0` (GQA/MQA); q's dtype, or
            float8_e4m3fn with fp16/bf16 q.
        v: `(batch, seqlen_k, heads_k, head_dim_v)`, k's dtype; head_dim_v may differ from head_dim_qk.
        causal: bottom-right aligned: query i sees key j iff `j <= i + seqlen_k - seqlen_q` (same as window right=0).
        window: `(left, right)`, -1 = unbounded; key j visible iff
            `i + Sk - Sq - left <= j <= i + Sk - Sq + right`. `left` may be a `(batch,)` int32 tensor: one
            sliding-window length per sequence (a negative entry = unbounded), e.g. a sliding-window branch
            whose sequences have different windows; no host synchronisation.
        softmax_scale: defaults to `head_dim_qk ** -0.5`.
        softcap: if > 0, scores become `softcap * tanh(scores / softcap)` before masking.
        alibi_slopes: `(heads_q,)` fp32; adds `-slope[h] * |i + Sk - Sq - j|` to the scaled score.
        sinks: `(heads_q,)` fp32; a logit that joins the softmax denominator only.
        return_lse: also return the log-sum-exp `(batch, heads_q, seqlen_q)` fp32 (natural log, sink excluded).
            For an external merge (`merge_attention_states`, e.g. a compressed-KV branch and a sliding-window
            branch), run each branch without `sinks`, merge, then `apply_attention_sink` once.
        out: optional output `(batch, seqlen_q, heads_q, head_dim_v)` in q's dtype (bf16 or fp16 for a
            float8_e4m3fn q, bf16 by default), or fp32 to keep partial results for a merge at full precision.
        q_descale, k_descale, v_descale: FP8 inputs only: `(batch, heads_k)` fp32 factors, FlashAttention-3's
            convention: the attention is that of `q * q_descale[b, h // group]`, `k * k_descale[b, h_k]` and
            `v * v_descale[b, h_k]` (None: 1). The portable kernel widens FP8 tiles to fp16 on load (exactly:
            every e4m3 value is an fp16 value) and applies the descales in fp32, so FP8 inputs halve the bytes
            read while the math is that of fp16; a bf16 q beside an FP8 K/V goes to fp16 scaled by a power of two
            per program of query rows (its largest |q| at 2^14), which keeps any bf16 magnitude in range. On
            Hopper, FP8 q, k and v without a cache (16-byte aligned rows and heads) run the Gluon kernel on
            e4m3 tensor cores instead, as FlashAttention-3: V transposed into a copy first, scores accumulated
            by the FP8 MMA (about 14 bits of mantissa), P rounded to e4m3 (scaled by 2^8; within 2^-4 of
            itself) for P·V; the LSE comes from the unrounded P.

    Returns:
        `out`, or `(out, lse)` with `return_lse=True`. Rows that see no key give 0 and LSE -inf.
    """
    out, scale, (left, right), lefts = _prepare(q, k, v, varlen=False, causal=causal, window=window,
                                                softmax_scale=softmax_scale, softcap=softcap,
                                                alibi_slopes=alibi_slopes, sinks=sinks, out=out,
                                                descales=(q_descale, k_descale, v_descale))
    lse = _attention_fwd(q, k, v, out, None, None, q.shape[1], k.shape[1], scale, left, right,
                         float(softcap), alibi_slopes, sinks, lefts, q_descale, k_descale, v_descale)
    return (out, lse) if return_lse else out


@forward_only
def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, causal=False,
                     window=(-1, -1), softmax_scale=None, softcap=0.0, alibi_slopes=None, sinks=None,
                     return_lse=False, out=None, q_descale=None, k_descale=None, v_descale=None, seqused_k=None,
                     block_table=None):
    """Fused attention over sequences packed along the token axis (no padding).

    Args:
        q: `(total_q, heads_q, head_dim_qk)`; sequence b is rows `cu_seqlens_q[b]:cu_seqlens_q[b+1]`.
        k, v: `(total_k, heads_k, head_dim_qk / head_dim_v)`, indexed by `cu_seqlens_k`. Rows past
            `cu_seqlens_k[-1]`, if any, must hold finite values: the Hopper kernel's key tiles may run into them
            (weighted 0, as the next sequence's rows are). With `block_table`: paged caches
            `(num_pages, page_size, heads_k, head_dim)` instead.
        cu_seqlens_q, cu_seqlens_k: `(batch + 1,)` int32 prefix sums; zero-length sequences are allowed.
            `cu_seqlens_k` may be None with `block_table` and `seqused_k`.
        max_seqlen_q, max_seqlen_k: Python ints, upper bounds of the sequence lengths (sizes the grid;
            passing them avoids a host synchronisation).
        seqused_k: optional `(batch,)` int32 (FlashAttention's): sequence b attends to only its first
            `seqused_k[b]` keys, at most its `cu_seqlens_k` count (masks bottom-right aligned over those). With
            `block_table` it is each sequence's key count (else `cu_seqlens_k`'s).
        block_table: optional `(batch, max_pages)` int32 (FlashAttention's paged varlen call, as vLLM makes it for
            a batch mixing prefills and decodes): key j of sequence b is slot `j % page_size` of page
            `block_table[b, j // page_size]` of k and v. With `seqused_k` or `block_table`, on Hopper with 16-bit
            k and v (pages of a multiple of 16 keys) and a longest sequence of 64 query rows or more, the call is
            two launches: the Hopper kernel runs the sequences of over min(256 / (heads_q / heads_k), 64) query rows
            (32 in an even GQA group, where a sequence's last row block of at most 64 rows runs two query heads:
            `forward_sm90.pairs_tails`; 16 / (heads_q / heads_k) at d = 64 on a paged cache), and beside it (on a
            second stream of the device, joined) the portable kernel the others (decodes, speculative decodes,
            short chunks), their GQA heads packed in tiles (a decode's of 16 rows, a longer sequence's of 64,
            several for more) and their keys split where the grid would not fill the GPU; other calls run the
            portable kernel alone, split the same way, in those tiles where the longest sequence fits them and the
            lengths are mixed, most of them short (`forward.SHORT_ALONE`: 64 decodes with two 48-row chunks 0.97,
            128 decodes with a 40-row chunk 1.04 of the calls below, 0.57 / 0.59 in one prefill tile a sequence).
            On the H200 against `attention_with_kvcache` called once a group of equal-length sequences, page 16, 32 / 8
            heads, d = 128: 1.00 / 1.00 on decodes alone (4k / 131k keys), 1.00 on 512-row chunks alone, 1.01 on 32
            decodes with two such chunks, 0.98 on 8 decodes with a 2048-row chunk at 16k keys, 1.01 / 1.02 on 32
            sequences of 4 / 8 rows alone, 0.99 / 1.00 / 0.89 on 32 of 8 / 16 / 32 rows beside a 512-row chunk (0.91 /
            0.90 on 32 of 16 / 32 rows at 64 / 8 heads) (`benchmarks/probe_varlen_paged.py` on 7872d4d:
            `history/probe_varlen_paged_h200_7872d4d.json`, `..._g8_h200_7872d4d.json`; the same within 2% on 35face3).
            32 sequences of 64 / 48 rows beside a 512-row chunk: 1.00 / 1.46 (0.59 / 1.11 before the paired row blocks;
            `..._tails_h200_35face3.json`). Without a cache the Hopper kernel pairs those row blocks too (an even
            GQA group): 48 sequences of 65-599 rows, 16 / 4 heads, d = 128, 1.06 / 1.08 (unmasked / causal) of the
            kernel without it (`benchmarks/probe_varlen.py --group 4`, NOTES.md, eighty-first session).
        Other options as in `attention` (FP8 descales are `(batch, heads_k)`, one row per sequence).

    Returns:
        `out (total_q, heads_q, head_dim_v)`, or `(out, lse)` with lse `(heads_q, total_q)` fp32.
    """
    batch = cu_seqlens_q.shape[0] - 1 if isinstance(cu_seqlens_q, torch.Tensor) and cu_seqlens_q.dim() == 1 else -1
    paged = block_table is not None
    out, scale, (left, right), lefts = _prepare(q, k, v, varlen=True, causal=causal, window=window,
                                                softmax_scale=softmax_scale, softcap=softcap,
                                                alibi_slopes=alibi_slopes, sinks=sinks, out=out,
                                                descales=(q_descale, k_descale, v_descale),
                                                batch=batch, paged=paged)
    V.check_cu_seqlens("cu_seqlens_q", cu_seqlens_q, device=q.device)
    if not paged or cu_seqlens_k is not None or seqused_k is None:     # optional only where the others say all
        V.check_cu_seqlens("cu_seqlens_k", cu_seqlens_k, batch_plus_one=cu_seqlens_q.shape[0], device=q.device)
    max_seqlen_q = V.check_max_seqlen("max_seqlen_q", max_seqlen_q)
    max_seqlen_k = V.check_max_seqlen("max_seqlen_k", max_seqlen_k)
    if seqused_k is not None:
        V.check_per_sequence("seqused_k", seqused_k, batch, q.device)
    if paged:
        V.check_block_table(block_table, batch, q.device)
        if seqused_k is None:                 # each sequence's key count from cu_seqlens_k (no host sync)
            seqused_k = cu_seqlens_k[1:] - cu_seqlens_k[:-1]
        cu_seqlens_k = None
    lse = _attention_fwd(q, k, v, out, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale,
                         left, right, float(softcap), alibi_slopes, sinks, lefts, q_descale, k_descale, v_descale,
                         seqused_k, block_table)
    return (out, lse) if return_lse else out


@custom_op("fmha::attention_kvcache_fwd", mutates_args=("out",))
def _attention_kvcache_fwd(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, out: torch.Tensor,
                           cache_seqlens: torch.Tensor, block_table: Optional[torch.Tensor], num_splits: int,
                           softmax_scale: float, window_left: int, window_right: int, softcap: float,
                           alibi_slopes: Optional[torch.Tensor], sinks: Optional[torch.Tensor],
                           window_lefts: Optional[torch.Tensor] = None, q_descale: Optional[torch.Tensor] = None,
                           k_descale: Optional[torch.Tensor] = None, v_descale: Optional[torch.Tensor] = None,
                           cache_leftpad: Optional[torch.Tensor] = None) -> torch.Tensor:
    lse = torch.empty(_lse_shape(q, None), dtype=torch.float32, device=q.device)
    attention_forward(q, k_cache, v_cache, out, lse, cu_seqlens_q=None, cu_seqlens_k=None,
                      max_seqlen_q=q.shape[1], max_seqlen_k=_cache_capacity(k_cache, block_table),
                      softmax_scale=softmax_scale, window=(window_left, window_right),
                      window_lefts=window_lefts, softcap=softcap, alibi_slopes=alibi_slopes, sinks=sinks,
                      descales=(q_descale, k_descale, v_descale), cache_seqlens=cache_seqlens,
                      block_table=block_table, k_starts=cache_leftpad, num_splits=num_splits,
                      interpret=q.device.type == "cpu")
    return lse


@_attention_kvcache_fwd.register_fake
def _(q, k_cache, v_cache, out, cache_seqlens, block_table, num_splits, softmax_scale, window_left,
      window_right, softcap, alibi_slopes, sinks, window_lefts=None, q_descale=None, k_descale=None,
      v_descale=None, cache_leftpad=None):
    return q.new_empty(_lse_shape(q, None), dtype=torch.float32)


def _check_new_kv(k, v, k_cache, v_cache, batch):
    """`attention_with_kvcache`'s k and v: both given, `(batch, seqlen_new, heads_k, head_dim)` each with the
    heads and head dims of its cache, in its cache's dtype and on its device."""
    if k is None or v is None:
        raise ValueError(f"{'v' if k is not None else 'k'}: k and v are appended together; got only one of them")
    for name, new, cache in (("k", k, k_cache), ("v", v, v_cache)):
        V.check_tensor(name, new, ndim=4, dtypes=(cache.dtype,), device=cache.device)
        if new.shape[0] != batch or new.shape[2:] != cache.shape[2:]:
            raise ValueError(f"{name}: expected shape ({batch}, seqlen_new, {cache.shape[2]}, {cache.shape[3]}), "
                             f"got {tuple(new.shape)}")
    if k.shape[1] != v.shape[1]:
        raise ValueError(f"v: expected seqlen_new = {k.shape[1]} (k's), got {v.shape[1]}")


def _new_tokens(q, k_cache, v_cache, cache_seqlens, block_table, k, v, cos, sin, interleaved, masked):
    """`attention_with_kvcache`'s k / v and rotary options, checked before anything is written: q rotated (at
    positions cache_seqlens + i when `masked`, else all at cache_seqlens), k rotated and appended with v. Returns
    (q, the key counts the attention sees)."""
    if k is not None or v is not None:
        _check_new_kv(k, v, k_cache, v_cache, q.shape[0])
    if cos is not None or sin is not None:
        _check_rotary(cos, sin, interleaved, q, k_cache)
        start = cache_seqlens.long()[:, None]
        q = _rotary(q, cos, sin, start + torch.arange(q.shape[1], device=q.device) * int(masked), interleaved)
        if k is not None:
            k = _rotary(k, cos, sin, start + torch.arange(k.shape[1], device=k.device), interleaved)
    if k is None:
        return q, cache_seqlens
    _append_to_cache(k_cache, v_cache, k, v, cache_seqlens, block_table)
    return q, cache_seqlens + k.shape[1]


def _check_rotary(cos, sin, interleaved, q, k_cache):
    """`attention_with_kvcache`'s rotary options: both tables, `(seqlen_ro, rotary_dim / 2)` alike, rotary_dim at
    most q's head dim, in q's dtype or fp32; a 16-bit cache (FP8 keys are not rotated)."""
    if cos is None or sin is None:
        raise ValueError(f"{'rotary_sin' if cos is not None else 'rotary_cos'}: rotary_cos and rotary_sin come "
                         "together; got only one of them")
    for name, t in (("rotary_cos", cos), ("rotary_sin", sin)):
        V.check_tensor(name, t, ndim=2, dtypes=(q.dtype, torch.float32), device=q.device)
    if sin.shape != cos.shape or not 1 <= 2 * cos.shape[1] <= q.shape[3]:
        raise ValueError(f"rotary_sin: expected rotary_cos's shape (seqlen_ro, rotary_dim / 2) with rotary_dim <= "
                         f"{q.shape[3]}, got {tuple(cos.shape)} and {tuple(sin.shape)}")
    if not isinstance(interleaved, bool):
        raise TypeError(f"rotary_interleaved: expected a bool, got {type(interleaved).__name__}")
    if k_cache.element_size() == 1:
        raise ValueError("rotary_cos: rotary embedding needs a 16-bit cache, got an FP8 one")


def _rotary(x, cos, sin, positions, interleaved):
    """x `(batch, seqlen, heads, d)` with its first 2 * cos.shape[1] values of each head turned by the angles at
    `positions (batch, seqlen)` (`reference.rotary_ref`), in fp32, back in x's dtype."""
    half = cos.shape[1]
    c, s = (t[positions].unsqueeze(2).float() for t in (cos, sin))
    head = x[..., :2 * half].float()
    if interleaved:
        a, b = head[..., 0::2], head[..., 1::2]
        turned = torch.stack((a * c - b * s, a * s + b * c), -1).flatten(-2)
    else:
        a, b = head[..., :half], head[..., half:]
        turned = torch.cat((a * c - b * s, a * s + b * c), -1)
    return torch.cat((turned.to(x.dtype), x[..., 2 * half:]), -1)


def _append_to_cache(k_cache, v_cache, k, v, cache_seqlens, block_table):
    """Write k, v `(batch, seqlen_new, ...)` into the caches at positions cache_seqlens[b] + i, in place, with
    device-side indices (no host synchronisation; a position past the cache fails torch's index check). Indexing
    the cache's first two axes writes through any strides; one-byte (FP8) caches are written as bytes, which
    index_put_ supports on every device."""
    pos = cache_seqlens.long()[:, None] + torch.arange(k.shape[1], device=k.device)
    if block_table is None:
        index = (torch.arange(k.shape[0], device=k.device)[:, None], pos)
    else:
        page_size = k_cache.shape[1]
        index = (block_table.long().gather(1, pos // page_size), pos % page_size)
    for cache, new in ((k_cache, k), (v_cache, v)):
        if cache.element_size() == 1:
            cache, new = cache.view(torch.uint8), new.view(torch.uint8)
        cache.index_put_(index, new)


def _cache_capacity(k_cache, block_table):
    return block_table.shape[1] * k_cache.shape[1] if block_table is not None else k_cache.shape[1]


@forward_only
def attention_with_kvcache(q, k_cache, v_cache, cache_seqlens, *, k=None, v=None, rotary_cos=None, rotary_sin=None,
                           rotary_interleaved=False, cache_batch_idx=None, cache_leftpad=None, block_table=None,
                           num_splits=0, causal=False, window=(-1, -1), softmax_scale=None, softcap=0.0,
                           alibi_slopes=None, sinks=None, return_lse=False, out=None, q_descale=None, k_descale=None,
                           v_descale=None):
    """Attention of new queries against a KV cache (decode, speculative decoding, chunked prefill).

    Args:
        q: `(batch, seqlen_q, heads_q, head_dim_qk)`; the queries are the last `seqlen_q` positions of each
            sequence (bottom-right aligned causal / window masks).
        k_cache, v_cache: contiguous `(batch, max_seqlen, heads_k, head_dim)`, or paged
            `(num_pages, page_size, heads_k, head_dim)` with `block_table`. An FP8 cache: float8_e4m3fn with
            fp16/bf16 q, and `k_descale` / `v_descale` `(batch, heads_k)` (as in `attention`).
        cache_seqlens: `(batch,)` int32, the number of valid keys of each sequence (0 allowed: output 0,
            LSE -inf), or one int for every sequence (as FlashAttention takes it). Keys past it are never read.
        k, v: optional `(batch, seqlen_new, heads_k, head_dim)` new keys and values in the caches' dtype
            (FlashAttention's `flash_attn_with_kvcache` k / v): written into the caches in place at positions
            `cache_seqlens[b] .. cache_seqlens[b] + seqlen_new - 1` (through `block_table` when paged), which must
            lie within each sequence's capacity, and attended as part of the cache: the call then sees
            `cache_seqlens + seqlen_new` keys. `cache_seqlens` itself is not changed. No host synchronisation.
        rotary_cos, rotary_sin: optional `(seqlen_ro, rotary_dim / 2)` (FlashAttention's rotary options): the
            rotary embedding of the first rotary_dim values of each head, applied to the new keys `k` at positions
            `cache_seqlens[b] + i` before they are written, and to q: at `cache_seqlens[b] + i` too under a causal
            or windowed mask, else every query at `cache_seqlens[b]` (FlashAttention's rule). `rotary_interleaved`
            pairs values (2i, 2i + 1) (GPT-J) instead of (i, i + rotary_dim / 2) (GPT-NeoX). Positions must be
            under seqlen_ro (torch's index check). 16-bit caches only.
        cache_batch_idx: optional `(batch,)` int32, contiguous caches only (FlashAttention's): sequence b's keys
            are row `cache_batch_idx[b]` of the caches, which may hold more rows than the batch. Run as a paged
            cache of one page a sequence (`block_table = cache_batch_idx[:, None]`). Repeated rows with `k` / `v`:
            the appended values may come from any of the sequences that share the row.
        cache_leftpad: optional `(batch,)` int32, contiguous caches only (FlashAttention's, for left-padded
            batches): sequence b's keys are cache rows `cache_leftpad[b] .. cache_seqlens[b] - 1` (the rows before
            it are never read). `cache_seqlens` still counts from row 0, so `k` / `v` are written at
            `cache_seqlens[b] + i` and rotary positions are row numbers, as in FlashAttention; the masks are
            bottom-right aligned over the `cache_seqlens[b] - cache_leftpad[b]` keys seen (none when that is
            negative). With `cache_batch_idx` the rows are those of row `cache_batch_idx[b]`.
        block_table: `(batch, max_pages)` int32; key j of sequence b is slot `j % page_size` of page
            `block_table[b, j // page_size]`. Pages may be in any order.
        num_splits: 0 = chosen from the SM count and the cache capacity (no host synchronisation);
            n from 1 to 65535 forces n key splits per sequence, merged exactly.
        Other options as in `attention`.

    Returns:
        `out (batch, seqlen_q, heads_q, head_dim_v)`, or `(out, lse)` with lse `(batch, heads_q, seqlen_q)`.
    """
    out, scale, (left, right), lefts = _prepare(q, k_cache, v_cache, varlen=False, causal=causal, window=window,
                                                softmax_scale=softmax_scale, softcap=softcap,
                                                alibi_slopes=alibi_slopes, sinks=sinks, out=out,
                                                descales=(q_descale, k_descale, v_descale),
                                                check_batch=False, names=("q", "k_cache", "v_cache"))
    batch = q.shape[0]
    cache_seqlens, num_splits = V.python_number(cache_seqlens), V.python_number(num_splits)
    if isinstance(cache_seqlens, int) and not isinstance(cache_seqlens, bool):
        if cache_seqlens < 0:
            raise ValueError(f"cache_seqlens: expected a length >= 0, got {cache_seqlens}")
        cache_seqlens = torch.full((batch,), cache_seqlens, dtype=torch.int32, device=q.device)
    V.check_per_sequence("cache_seqlens", cache_seqlens, batch, q.device)
    if cache_batch_idx is not None:
        if block_table is not None:
            raise ValueError("cache_batch_idx: for contiguous caches only; a paged cache's block_table names each "
                             "sequence's pages")
        V.check_per_sequence("cache_batch_idx", cache_batch_idx, batch, q.device)
        block_table = cache_batch_idx[:, None]
    elif block_table is not None:
        V.check_block_table(block_table, batch, q.device)
    elif k_cache.shape[0] != batch:
        raise ValueError(f"k_cache: batch must equal q's ({batch}) for a contiguous cache, got {k_cache.shape[0]}")
    if cache_leftpad is not None:
        if block_table is not None and cache_batch_idx is None:
            raise ValueError("cache_leftpad: for contiguous caches only (as in FlashAttention); a paged cache's "
                             "block_table names each sequence's pages from its first key")
        V.check_per_sequence("cache_leftpad", cache_leftpad, batch, q.device)
    if not isinstance(num_splits, int) or isinstance(num_splits, bool) or not 0 <= num_splits <= MAX_FORCED_SPLITS:
        raise ValueError(f"num_splits: expected an int from 0 (automatic) to {MAX_FORCED_SPLITS}, got {num_splits!r}")
    if k is not None or v is not None or rotary_cos is not None or rotary_sin is not None:
        masked = left != -1 or right != -1 or lefts is not None           # causal or windowed
        q, cache_seqlens = _new_tokens(q, k_cache, v_cache, cache_seqlens, block_table, k, v, rotary_cos,
                                       rotary_sin, rotary_interleaved, masked)
    lse = _attention_kvcache_fwd(q, k_cache, v_cache, out, cache_seqlens, block_table, num_splits, scale,
                                 left, right, float(softcap), alibi_slopes, sinks, lefts, q_descale, k_descale,
                                 v_descale, cache_leftpad)
    return (out, lse) if return_lse else out
