"""MLA decode, a drop-in for DeepSeek's `flash_mla` package: `import fmha.mla as flash_mla`.

Plan once per decode step, run per layer, as with FlashMLA:

    tile_scheduler_metadata, num_splits = get_mla_metadata(cache_seqlens, s_q * h_q // h_k, h_k)
    for layer in layers:
        out, lse = flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, 512,
                                          tile_scheduler_metadata, num_splits, causal=True)

or in FlashMLA's newer form, where the first call plans and the later ones of the step reuse its plan:

    sched_meta, _ = get_mla_metadata()                       # an empty FlashMLASchedMeta, once per step
    for layer in layers:
        out, lse = flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, 512, sched_meta, None,
                                          causal=True)

The math is absorbed multi-head latent attention: each token's cache row is [latent (512), rope (64)];
the key is the whole row (576 columns) and the value is the latent part, read once for both.
`mla_decode` is the same operation with the latent and rope parts in separate tensors (vLLM's form).
`flash_mla_sparse_fwd` is DeepSeek-V3.2's token-sparse prefill on the same kernel (one part per query token).
`flash_attn_varlen_func` and its `qkvpacked` / `kvpacked` forms are FlashMLA's dense prefill (its SM100 MHA kernel,
DeepSeek's d_qk 192 / d_v 128 shape) as calls of `fmha.attention_varlen`, so code written for them runs on Hopper.
`quantize_kv_cache` / `dequantize_kv_cache` pack and unpack the FP8 cache layouts of DeepSeek-V3.2 and V4,
byte for byte FlashMLA's (`_kv_fp8.py` documents them; V4's is laid out per page, not per token);
`is_fp8_kvcache=True` decodes from them, dequantising on load.

Data path: validation → plan (`schedule.plan_mla`, on the device, no host sync) → `kernels.mla_decode`
(split-KV decode kernel, then the combine kernel, which token-sparse calls skip when their plan runs every
token whole, `schedule.runs_whole`; on Hopper, with one KV head and >= 16 query rows per KV
head, the Gluon kernel of `kernels.mla_decode_sm90` for dense, sparse and FP8 calls alike). Conventions kept
from FlashMLA: `lse (b, h_q, s_q)` fp32 natural log, and a query row that sees no key gives output 0 and LSE
**+inf**.
"""
from __future__ import annotations

import dataclasses
from typing import NamedTuple, Optional

import torch

from . import _validate as V
from ._ops import custom_op, forward_only
from ._kv_fp8 import check_model1_cache, dequantize_kv_cache, quantize_kv_cache
from .attention import attention_varlen
from .kernels.mla_decode import mla_decode_forward
from .schedule import (SCHED_BLOCK, SCHED_FIELDS, mla_num_parts, num_sms, plan_mla, runs_whole, uniform_lengths,
                       uniform_plan)

__all__ = ["get_mla_metadata", "flash_mla_with_kvcache", "flash_mla_sparse_fwd", "mla_decode", "quantize_kv_cache",
           "dequantize_kv_cache", "FlashMLASchedMeta", "flash_attn_varlen_func", "flash_attn_varlen_qkvpacked_func",
           "flash_attn_varlen_kvpacked_func"]


@dataclasses.dataclass
class FlashMLASchedMeta:
    """FlashMLA's newer scheduling handle: `get_mla_metadata()` returns an empty one; the first
    `flash_mla_with_kvcache` call given it plans from that call (its shapes and, dense, its `cache_seqlens`) and
    keeps the plan here; later calls of the same configuration (the other layers of the step) reuse it. A call of
    another configuration raises ValueError. Take a new one when the lengths change (every decode step): as in
    FlashMLA, a reused plan is not checked against new length values. Token-sparse calls take their plan from
    the query shape alone (`schedule.uniform_plan`), so they keep only the configuration here."""

    class Config(NamedTuple):        # a NamedTuple, not a frozen dataclass: dynamo builds it from symbolic sizes
        b: int
        s_q: int
        h_q: int
        page_block_size: int
        h_k: int
        causal: bool
        is_fp8_kvcache: bool
        topk: Optional[int]
        extra_page_block_size: Optional[int]
        extra_topk: Optional[int]

    have_initialized: bool = False
    config: Optional[Config] = None
    tile_scheduler_metadata: Optional[torch.Tensor] = None      # (num_parts, SCHED_FIELDS) int32, dense calls
    num_splits: Optional[torch.Tensor] = None                   # (b + 1,) int32, dense calls


def get_mla_metadata(cache_seqlens=None, num_q_tokens_per_head_k=None, num_heads_k=None, num_heads_q=None,
                     is_fp8_kvcache=False, topk=None):
    """Plan the split-KV schedule of one decode step; reuse the result for every layer.

    Called with no arguments (FlashMLA's newer form) it returns `(FlashMLASchedMeta(), None)`: the first
    `flash_mla_with_kvcache` call given that handle plans, the later ones reuse its plan.

    Args:
        cache_seqlens: `(batch,)` int32, the cache length of each sequence (on the GPU).
        num_q_tokens_per_head_k: `s_q * h_q // h_k`, the packed query rows that share a KV head.
        num_heads_k: KV heads (1 for DeepSeek MLA).
        num_heads_q: query heads; needed with `topk`.
        topk: token-sparse decode (`indices` at call time): every query token attends to up to `topk` tokens,
            so the plan covers `batch * s_q` rows of `topk` keys each and `cache_seqlens` only gives the batch.
        is_fp8_kvcache: accepted for flash_mla's signature; the plan is the same.

    Returns:
        tile_scheduler_metadata: `(num_parts, 8)` int32, each part's run of key blocks (see `schedule.plan_mla`).
        num_splits: `(batch + 1,)` int32 prefix sums of the pieces each sequence is split into
            (`(batch * s_q + 1,)`, one entry per query token, with `topk`).
    """
    if cache_seqlens is None and num_q_tokens_per_head_k is None and num_heads_k is None and topk is None:
        return FlashMLASchedMeta(), None
    V.check_tensor("cache_seqlens", cache_seqlens, ndim=1, dtypes=(torch.int32,))
    V.check_device("cache_seqlens", cache_seqlens)
    num_q_tokens_per_head_k, num_heads_k, num_heads_q, topk = map(
        V.python_number, (num_q_tokens_per_head_k, num_heads_k, num_heads_q, topk))
    for name, value in (("num_q_tokens_per_head_k", num_q_tokens_per_head_k), ("num_heads_k", num_heads_k)):
        if not V.is_int(value):
            raise TypeError(f"{name}: expected an int, got {type(value).__name__}")
        if value < 1:
            raise ValueError(f"{name}: expected >= 1, got {value}")
    sms = num_sms(cache_seqlens.device)
    if topk is None:
        return plan_mla(cache_seqlens, mla_num_parts(num_q_tokens_per_head_k, num_heads_k, sms))
    if not V.is_int(topk) or topk < 1:
        raise ValueError(f"topk: expected a positive int, got {topk!r}")
    if not V.is_int(num_heads_q) or num_heads_q < num_heads_k or num_heads_q % num_heads_k:
        raise ValueError(f"num_heads_q: expected a multiple of num_heads_k ({num_heads_k}) with topk, "
                         f"got {num_heads_q!r}")
    heads_per_k = num_heads_q // num_heads_k
    if num_q_tokens_per_head_k % heads_per_k:
        raise ValueError(f"num_q_tokens_per_head_k: expected s_q * {heads_per_k}, got {num_q_tokens_per_head_k}")
    tokens = cache_seqlens.shape[0] * (num_q_tokens_per_head_k // heads_per_k)
    # The plan `_sparse_decode` runs (`uniform_plan`), made fresh here: the caller owns the tensors returned.
    lengths = torch.full((tokens,), topk, dtype=torch.int32, device=cache_seqlens.device)
    return plan_mla(lengths, mla_num_parts(heads_per_k, num_heads_k, sms))


@custom_op("fmha::mla_decode_fwd", mutates_args=())
def _mla_decode_fwd(q_lat: torch.Tensor, q_rope: Optional[torch.Tensor], kv_lat: torch.Tensor,
                    k_rope: Optional[torch.Tensor], block_table: torch.Tensor, cache_seqlens: Optional[torch.Tensor],
                    metadata: Optional[torch.Tensor], split_offsets: Optional[torch.Tensor], softmax_scale: float,
                    causal: bool, attn_sink: Optional[torch.Tensor],
                    valid_lens: Optional[torch.Tensor], fp8_layout: Optional[str],
                    x_lat: Optional[torch.Tensor] = None, x_rope: Optional[torch.Tensor] = None,
                    x_table: Optional[torch.Tensor] = None, x_valid: Optional[torch.Tensor] = None,
                    main_span: int = 0, whole: bool = False, seq_tokens: int = 1, uniform: int = 0
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """`uniform` > 0: token-sparse decode whose every row is planned `uniform` keys long. The plan and the
    lengths of `valid_lens` / `x_valid` left None (every index counts) are then taken here, inside the op, from
    the kept ones (`schedule.uniform_plan`), so that torch.compile never traces the keeping."""
    out, lse = _empty_outputs(q_lat, seq_tokens)
    if uniform:
        tokens, device = q_lat.shape[0], q_lat.device
        parts = mla_num_parts(q_lat.shape[2] // kv_lat.shape[2], kv_lat.shape[2], num_sms(device))
        cache_seqlens, metadata, split_offsets = uniform_plan(tokens, uniform, parts, device)
        whole = runs_whole(tokens, parts)
        if valid_lens is None:
            valid_lens = uniform_lengths(tokens // seq_tokens, block_table.shape[-1], device)
        if x_lat is not None and x_valid is None:
            x_valid = uniform_lengths(tokens // seq_tokens, x_table.shape[-1], device)
    extra = None if x_lat is None else (x_lat, x_rope, x_table, x_valid, main_span)
    mla_decode_forward(q_lat, q_rope, kv_lat, k_rope, block_table, cache_seqlens, metadata, split_offsets, out, lse,
                       softmax_scale=softmax_scale, causal=causal, sinks=attn_sink, valid_lens=valid_lens,
                       fp8_layout=fp8_layout, extra=extra, whole=whole, interpret=q_lat.device.type == "cpu")
    return out, lse


@_mla_decode_fwd.register_fake
def _(q_lat, q_rope, kv_lat, k_rope, block_table, cache_seqlens, metadata, split_offsets, softmax_scale, causal,
      attn_sink, valid_lens, fp8_layout, x_lat=None, x_rope=None, x_table=None, x_valid=None, main_span=0,
      whole=False, seq_tokens=1, uniform=0):
    return _empty_outputs(q_lat, seq_tokens)


@custom_op("fmha::mla_sparse_prefill_fwd", mutates_args=())
def _mla_sparse_prefill_fwd(q_lat: torch.Tensor, q_rope: Optional[torch.Tensor], kv_lat: torch.Tensor,
                            k_rope: Optional[torch.Tensor], indices: torch.Tensor,
                            valid_lens: Optional[torch.Tensor],
                            softmax_scale: float, attn_sink: Optional[torch.Tensor]
                            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    out, lse = _empty_outputs(q_lat)
    max_logits = lse.new_empty(lse.shape[:2])
    tokens, topk = q_lat.shape[0], indices.shape[-1]
    if valid_lens is None:            # every index counts; made here, as the plan is (see `_mla_decode_fwd`)
        valid_lens = uniform_lengths(tokens, topk, q_lat.device)
    if tokens:
        # One part per query token: each is run whole, so max_logits needs no combining.
        lengths, metadata, split_offsets = uniform_plan(tokens, topk, tokens, q_lat.device)
        mla_decode_forward(q_lat, q_rope, kv_lat, k_rope, indices, lengths, metadata, split_offsets, out, lse,
                           softmax_scale=softmax_scale, causal=False, sinks=attn_sink, valid_lens=valid_lens,
                           max_logits=max_logits, interpret=q_lat.device.type == "cpu")
    return out.squeeze(1), max_logits, lse.squeeze(2)


@_mla_sparse_prefill_fwd.register_fake
def _(q_lat, q_rope, kv_lat, k_rope, indices, valid_lens, softmax_scale, attn_sink):
    out, lse = _empty_outputs(q_lat)
    return out.squeeze(1), lse.new_empty(lse.shape[:2]), lse.squeeze(2)


def _empty_outputs(q_lat, seq_tokens=1):
    """out like q_lat's latent part, lse `(b, h_q, s_q)` fp32; with `seq_tokens` = t > 1 (q_lat's b batches the
    query tokens of a flattened call, s_q = 1) lse is `(b // t, h_q, t)`, the call's own shape."""
    b, s_q, h_q, dv = q_lat.shape
    out = q_lat.new_empty((b, s_q, h_q, dv))
    lse = q_lat.new_empty((b // seq_tokens, h_q, s_q * seq_tokens), dtype=torch.float32)
    return out, lse


def _check_cache_heads(name, cache, d, h_q):
    """A `(num_blocks, page_size, h_k, d)` cache matching the query's last dim, h_k dividing h_q; returns h_k."""
    if cache.shape[3] != d:
        raise ValueError(f"{name}: last dim must equal the query's ({d}), got {cache.shape[3]}")
    h_k = cache.shape[2]
    if h_k == 0 or h_q % h_k:
        raise ValueError(f"{name}: heads_k must divide h_q ({h_q}), got {h_k}")
    return h_k


def _check_value_dim(name, dv, dqk):
    """The kernel holds the value in two power-of-two halves and the rest of the key as a power-of-two tail."""
    half = dv // 2
    tail = dqk - dv
    if dv % 2 or half < 16 or half > 256 or half & (half - 1):
        raise ValueError(f"{name}: expected 2 * a power of two in [32, 512] (512 for DeepSeek MLA), got {dv}")
    if tail and (tail < 16 or tail & (tail - 1)):
        raise ValueError(f"{name}: head_dim - head_dim_v must be 0 or a power of two >= 16, got {tail}")


def _check_plan(batch, cache_seqlens, block_table, tile_scheduler_metadata, num_splits, device):
    _check_lengths(batch, cache_seqlens, block_table, device)
    _check_metadata(batch, tile_scheduler_metadata, num_splits, device)


def _check_lengths(batch, cache_seqlens, block_table, device):
    V.check_per_sequence("cache_seqlens", cache_seqlens, batch, device)
    V.check_block_table(block_table, batch, device, columns="max_blocks")


def _sched_config(sched, num_splits, q, k_cache, causal, is_fp8, indices, extra_k_cache, extra_indices):
    """The configuration of a call given a FlashMLASchedMeta, checked against the one it was planned for."""
    if num_splits is not None:
        raise ValueError(f"num_splits: None with a FlashMLASchedMeta (get_mla_metadata() with no arguments), got "
                         f"{type(num_splits).__name__}")
    config = FlashMLASchedMeta.Config(
        *q.shape[:3], k_cache.shape[1], k_cache.shape[2], causal, bool(is_fp8),
        None if indices is None else indices.shape[-1], None if extra_k_cache is None else extra_k_cache.shape[1],
        None if extra_indices is None else extra_indices.shape[-1])
    if sched.have_initialized and sched.config != config:
        raise ValueError(f"tile_scheduler_metadata: this FlashMLASchedMeta was planned for {sched.config}, the call is "
                         f"{config}; take a new one from get_mla_metadata() for another configuration")
    return config


def _check_metadata(batch, tile_scheduler_metadata, num_splits, device):
    """get_mla_metadata's two tensors for `batch` sequences (token-sparse calls: query tokens)."""
    V.check_tensor("tile_scheduler_metadata", tile_scheduler_metadata, ndim=2, dtypes=(torch.int32,), device=device)
    if tile_scheduler_metadata.shape[1] != SCHED_FIELDS or not tile_scheduler_metadata.is_contiguous():
        raise ValueError(f"tile_scheduler_metadata: expected a contiguous (num_parts, {SCHED_FIELDS}) tensor from "
                         f"get_mla_metadata, got shape {tuple(tile_scheduler_metadata.shape)}")
    V.check_tensor("num_splits", num_splits, ndim=1, dtypes=(torch.int32,), device=device)
    if num_splits.shape[0] != batch + 1:
        raise ValueError(f"num_splits: expected shape ({batch + 1},) from get_mla_metadata, "
                         f"got {tuple(num_splits.shape)}")


def _check_scale(softmax_scale, default, name="softmax_scale"):
    softmax_scale = V.python_number(softmax_scale)
    V.check_softmax_scale(softmax_scale, name)
    return default if softmax_scale is None else float(softmax_scale)


@forward_only
def flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, head_dim_v, tile_scheduler_metadata, num_splits,
                           softmax_scale=None, causal=False, is_fp8_kvcache=False, indices=None, attn_sink=None,
                           extra_k_cache=None, extra_indices_in_kvcache=None, topk_length=None,
                           extra_topk_length=None):
    """MLA decode over a paged cache, flash_mla's signature.

    Args:
        q: `(batch, s_q, h_q, head_dim)` fp16/bf16, head_dim 576 (512 latent + 64 rope) for DeepSeek MLA;
            s_q > 1 for MTP / speculative decoding (with `causal`).
        k_cache: `(num_blocks, page_block_size, h_k, head_dim)`, q's dtype; any page size (FlashMLA uses 64).
        block_table: `(batch, max_blocks)` int32; key j of sequence b is row `j % page_block_size` of block
            `block_table[b, j // page_block_size]`.
        cache_seqlens: `(batch,)` int32; keys past each length are never read (0 is allowed).
        head_dim_v: the value width; the value is the first `head_dim_v` columns of each key row.
        tile_scheduler_metadata, num_splits: from `get_mla_metadata` on the same `cache_seqlens`; or FlashMLA's
            newer form, a `FlashMLASchedMeta` from `get_mla_metadata()` and None (the first call plans into it).
        softmax_scale: defaults to `head_dim ** -0.5` (models pass their own).
        causal: bottom-right aligned: query i of s_q sees keys `j <= cache_seqlens[b] - s_q + i`.
        attn_sink: `(h_q,)` fp32, a logit per query head that joins the softmax denominator only:
            out * e^lse / (e^lse + e^sink); +inf silences the head, -inf has no effect; the LSE excludes it.
        indices: token-sparse decode: `(batch, s_q, topk)` int32 flat token positions
            `block * page_block_size + offset` into k_cache, -1 = none; replaces block_table (may be None) and the
            causal mask; plan with `get_mla_metadata(..., num_heads_q=h_q, topk=topk)`.
        topk_length: `(batch,)` int32, with indices: only the first topk_length[b] indices of batch b count.
        is_fp8_kvcache: k_cache holds packed FP8 rows (uint8 or float8_e4m3fn), `(num_blocks, page, 1, 656)` for
            DeepSeek-V3.2 (head_dim 576) or `(..., 584)` for V4 "model1" (head_dim 512, FlashMLA's per-block
            layout: stride(1) 584, blocks stride(0) bytes apart); see `quantize_kv_cache`. Dequantised on load;
            the math is in q's dtype.
        extra_k_cache, extra_indices_in_kvcache, extra_topk_length: a second KV source with its own page size
            (DeepSeek-V4's sliding-window branch), sparse like the first: `extra_indices_in_kvcache (batch, s_q,
            extra_topk)` index `extra_k_cache` (same row format as k_cache). Both sources are attended in one
            launch (one softmax over the union), then the sink applied.

    Returns:
        `out (batch, s_q, h_q, head_dim_v)` in q's dtype and `lse (batch, h_q, s_q)` fp32 (natural log; +inf
        for a row that sees no key, whose output is 0).
    """
    V.check_tensor("q", q, ndim=4, dtypes=V.HALF_DTYPES)
    V.check_device("q", q)
    batch, s_q, h_q, dqk = q.shape
    V.check_last_dim_contiguous("q", q)
    head_dim_v = V.python_number(head_dim_v)
    if not isinstance(head_dim_v, int) or isinstance(head_dim_v, bool):
        raise TypeError(f"head_dim_v: expected an int, got {type(head_dim_v).__name__}")
    if not 0 < head_dim_v <= dqk:
        raise ValueError(f"head_dim_v: expected 0 < head_dim_v <= head_dim ({dqk}), got {head_dim_v}")
    _check_value_dim("head_dim_v", head_dim_v, dqk)
    k_lat, k_rope, fp8_layout = _cache_parts("k_cache", k_cache, q, head_dim_v, is_fp8_kvcache)
    if not isinstance(causal, bool):
        raise TypeError(f"causal: expected a bool, got {type(causal).__name__}")
    scale = _check_scale(softmax_scale, dqk ** -0.5)
    V.check_per_head("attn_sink", attn_sink, h_q, q.device)
    q_lat = q[..., :head_dim_v]
    q_rope = q[..., head_dim_v:] if dqk > head_dim_v else None
    sched = tile_scheduler_metadata if isinstance(tile_scheduler_metadata, FlashMLASchedMeta) else None
    if indices is None:
        for name, value in (("topk_length", topk_length), ("extra_k_cache", extra_k_cache),
                            ("extra_indices_in_kvcache", extra_indices_in_kvcache),
                            ("extra_topk_length", extra_topk_length)):
            if value is not None:
                raise ValueError(f"{name}: only used with indices (token-sparse decode)")
        if sched is None:
            _check_plan(batch, cache_seqlens, block_table, tile_scheduler_metadata, num_splits, q.device)
        else:
            config = _sched_config(sched, num_splits, q, k_cache, causal, is_fp8_kvcache, None, None, None)
            _check_lengths(batch, cache_seqlens, block_table, q.device)
            if not sched.have_initialized:         # the plan get_mla_metadata(cache_seqlens, ...) would make
                sched.tile_scheduler_metadata, sched.num_splits = get_mla_metadata(
                    cache_seqlens, s_q * h_q // k_cache.shape[2], k_cache.shape[2])
                sched.config, sched.have_initialized = config, True
            tile_scheduler_metadata, num_splits = sched.tile_scheduler_metadata, sched.num_splits
        return _mla_decode_fwd(q_lat, q_rope, k_lat, k_rope, block_table, cache_seqlens,
                               tile_scheduler_metadata, num_splits, scale, causal, attn_sink, None, fp8_layout)
    if causal:
        raise ValueError("causal: not used with indices (the indices say which tokens each query sees)")
    if extra_k_cache is None and (extra_indices_in_kvcache is not None or extra_topk_length is not None):
        raise ValueError("extra_indices_in_kvcache: given without extra_k_cache")
    main = _sparse_inputs(q_lat, "indices", indices, "topk_length", topk_length)
    table = main[0]
    if sched is None:
        _check_metadata(table.shape[0], tile_scheduler_metadata, num_splits, q.device)
    length, extra = table.shape[1], None
    if extra_k_cache is not None:
        # Two sources (DeepSeek-V4: compressed KV + sliding window) in one launch: each query token's planned row
        # is the main source's topk keys (rounded up to a whole scheduling block) followed by the extra source's,
        # one online softmax runs over both, and the sink comes last.
        e_lat, e_rope, _ = _cache_parts("extra_k_cache", extra_k_cache, q, head_dim_v, is_fp8_kvcache)
        if extra_indices_in_kvcache is None:
            raise ValueError("extra_indices_in_kvcache: required with extra_k_cache")
        if extra_k_cache.shape[-1] != k_cache.shape[-1] or extra_k_cache.shape[2] != k_cache.shape[2]:
            raise ValueError(f"extra_k_cache: heads and row width must match k_cache's {tuple(k_cache.shape[2:])}, "
                             f"got {tuple(extra_k_cache.shape[2:])}")
        x_table, x_valid = _sparse_inputs(q_lat, "extra_indices_in_kvcache", extra_indices_in_kvcache,
                                          "extra_topk_length", extra_topk_length)
        main_span = -(-table.shape[1] // SCHED_BLOCK) * SCHED_BLOCK
        length, extra = main_span + x_table.shape[1], (e_lat, e_rope, x_table, x_valid, main_span)
    if sched is not None:      # the op plans from the query shape; the handle keeps the configuration
        sched.config = _sched_config(sched, num_splits, q, k_cache, causal, is_fp8_kvcache, indices, extra_k_cache,
                                     extra_indices_in_kvcache)
        sched.have_initialized = True
    return _sparse_decode(q_lat, q_rope, k_lat, k_rope, fp8_layout, main, length, scale, attn_sink, extra=extra)


def _cache_parts(name, cache, q, head_dim_v, is_fp8):
    """Validate a paged cache against q; return (latent part, rope part or None, FP8 layout or None). An FP8
    cache is read through one byte pointer, so both parts are the packed tensor itself."""
    dqk, h_q = q.shape[-1], q.shape[-2]
    if is_fp8:
        V.check_tensor(name, cache, ndim=4, dtypes=(torch.uint8, torch.float8_e4m3fn), device=q.device)
        cache = cache.view(torch.uint8)
        layout = {656: "v32", 584: "model1"}.get(cache.shape[-1])
        want = {"v32": 576, "model1": 512}.get(layout)
        if want is None or dqk != want or head_dim_v != 512 or cache.shape[2] != 1:
            raise ValueError(f"{name}: an FP8 cache is (num_blocks, page, 1, 656) with head_dim 576 (v32) or "
                             f"(..., 584) with head_dim 512 (model1), head_dim_v 512; got {name} "
                             f"{tuple(cache.shape)}, head_dim {dqk}, head_dim_v {head_dim_v}")
        V.check_last_dim_contiguous(name, cache)
        if layout == "model1":
            check_model1_cache(name, cache)
        return cache, (cache if dqk > head_dim_v else None), layout
    V.check_tensor(name, cache, ndim=4, dtypes=(q.dtype,), device=q.device)
    V.check_last_dim_contiguous(name, cache)
    _check_cache_heads(name, cache, dqk, h_q)
    return cache[..., :head_dim_v], (cache[..., head_dim_v:] if dqk > head_dim_v else None), None


def _sparse_inputs(q_lat, indices_name, indices, length_name, topk_length):
    """Check one source's token indices; return (index table (b * s_q, topk), valid lengths (b,)): each query
    token is its own "sequence" of topk keys, its index row the table; the kernels read a sequence's valid length
    for each of its s_q tokens and count a length past topk as topk."""
    batch, s_q = q_lat.shape[:2]
    V.check_tensor(indices_name, indices, ndim=3, dtypes=(torch.int32,), device=q_lat.device)
    if indices.shape[:2] != (batch, s_q) or indices.shape[2] == 0 or indices.stride(-1) != 1:
        raise ValueError(f"{indices_name}: expected a (batch, s_q, topk) = ({batch}, {s_q}, topk >= 1) tensor with a "
                         f"contiguous last dim, got shape {tuple(indices.shape)}")
    topk = indices.shape[2]
    tokens = batch * s_q
    if topk_length is not None:
        V.check_per_sequence(length_name, topk_length, batch, q_lat.device)
    valid = None if topk_length is None else topk_length.contiguous()     # None: every index counts
    return indices.reshape(tokens, topk), valid


def _sparse_decode(q_lat, q_rope, k_lat, k_rope, fp8_layout, inputs, length, scale, attn_sink, extra=None):
    """Token-sparse decode (`inputs` from `_sparse_inputs`; every query token's planned row `length` keys; `extra`
    a second source, as `mla_decode_forward` takes it). Returns (out (b, s_q, h_q, dv), lse (b, h_q, s_q)).
    The plan is `uniform_plan`'s, the one `get_mla_metadata(..., topk=...)` makes for the main source alone
    (`flash_mla_with_kvcache` checks the one passed in but runs this one, which the op takes, `uniform`; it is kept
    per shape, so a call makes none): every row has the same length, so the host knows whether the plan runs every
    token whole (`runs_whole`) and then launches no combine (a no-op one cost the sparse rows 2-10%, NOTES.md)."""
    batch, s_q, h_q, dv = q_lat.shape
    table, valid = inputs
    tokens = table.shape[0]
    flat = lambda t: None if t is None else t.reshape(tokens, 1, *t.shape[2:])      # noqa: E731
    x = extra or (None, None, None, None, 0)
    # The kernels write the LSE in place as (batch, h_q, s_q) (seq_tokens = s_q): no copy kernel after the call.
    out, lse = _mla_decode_fwd(flat(q_lat), flat(q_rope), k_lat, k_rope, table, None, None, None, scale, False,
                               attn_sink, valid, fp8_layout, *x, False, s_q, length)
    return out.view(batch, s_q, h_q, dv), lse


@forward_only
def flash_mla_sparse_fwd(q, kv, indices, sm_scale=None, d_v=512, attn_sink=None, topk_length=None):
    """Token-sparse MLA prefill (DeepSeek-V3.2 DSA), flash_mla's signature: each query token attends to the kv
    rows its indices name.

    Args:
        q: `(s_q, h_q, d_qk)` fp16/bf16 (d_qk 576 for V3.2, 512 for V4).
        kv: `(s_kv, h_kv, d_qk)`, q's dtype; h_kv divides h_q (1 for DeepSeek). The value is the first d_v columns.
        indices: `(s_q, h_kv, topk)` int32 rows of kv; an entry < 0 or >= s_kv is invalid (skipped).
        sm_scale: the softmax scale (None: `d_qk ** -0.5`).
        d_v: the value width (512 for DeepSeek).
        attn_sink: `(h_q,)` fp32, as in `flash_mla_with_kvcache`: out * e^lse / (e^lse + e^sink).
        topk_length: `(s_q,)` int32: only the first topk_length[i] indices of token i count.

    Returns:
        out `(s_q, h_q, d_v)` in q's dtype; max_logits `(s_q, h_q)` fp32, the largest scaled score q·k * sm_scale
        of each row (-inf with no valid index); lse `(s_q, h_q)` fp32, natural log, excluding the sink, +inf for a
        row with no valid index (its output is 0), FlashMLA's conventions.
    """
    V.check_tensor("q", q, ndim=3, dtypes=V.HALF_DTYPES)
    V.check_device("q", q)
    s_q, h_q, dqk = q.shape
    V.check_tensor("kv", kv, ndim=3, dtypes=(q.dtype,), device=q.device)
    if kv.shape[2] != dqk:
        raise ValueError(f"kv: last dim must equal q's ({dqk}), got {kv.shape[2]}")
    h_kv = kv.shape[1]
    if h_kv == 0 or h_q % h_kv:
        raise ValueError(f"kv: heads must divide h_q ({h_q}), got {h_kv}")
    V.check_tensor("indices", indices, ndim=3, dtypes=(torch.int32,), device=q.device)
    if indices.shape[:2] != (s_q, h_kv) or indices.shape[2] == 0:
        raise ValueError(f"indices: expected ({s_q}, {h_kv}, topk >= 1), got {tuple(indices.shape)}")
    for name, t in (("q", q), ("kv", kv), ("indices", indices)):
        V.check_last_dim_contiguous(name, t)
    d_v = V.python_number(d_v)
    if not isinstance(d_v, int) or isinstance(d_v, bool):
        raise TypeError(f"d_v: expected an int, got {type(d_v).__name__}")
    if not 0 < d_v <= dqk:
        raise ValueError(f"d_v: expected 0 < d_v <= d_qk ({dqk}), got {d_v}")
    _check_value_dim("d_v", d_v, dqk)
    scale = _check_scale(sm_scale, dqk ** -0.5, "sm_scale")
    V.check_per_head("attn_sink", attn_sink, h_q, q.device)
    valid = None                                   # every index counts
    if topk_length is not None:
        V.check_per_sequence("topk_length", topk_length, s_q, q.device)        # one per query token
        valid = topk_length.contiguous()           # the kernels count a length past topk as topk
    # The kernel's view: s_q "sequences" of one query token each, kv as a cache of pages holding one row.
    q1 = q.unsqueeze(1)
    cache = kv.unsqueeze(1)
    rope = (q1[..., d_v:], cache[..., d_v:]) if dqk > d_v else (None, None)
    return _mla_sparse_prefill_fwd(q1[..., :d_v], rope[0], cache[..., :d_v], rope[1], indices, valid, scale,
                                   attn_sink)


@forward_only
def mla_decode(q_latent, q_rope, kv_latent_cache, k_rope_cache, block_table, cache_seqlens, *,
               tile_scheduler_metadata=None, num_splits=None, softmax_scale=None, causal=False, attn_sink=None):
    """MLA decode with the latent and rope parts in separate tensors (vLLM's form); same math as
    `flash_mla_with_kvcache`.

    Args:
        q_latent: `(batch, s_q, h_q, d_latent)` or `(batch, h_q, d_latent)` (s_q = 1); d_latent 512 for DeepSeek.
        q_rope: `(batch, [s_q,] h_q, d_rope)` (64 for DeepSeek), or None for no rope part.
        kv_latent_cache: `(num_blocks, page_size, [h_k,] d_latent)`: keys' latent part, also the values.
        k_rope_cache: `(num_blocks, page_size, [h_k,] d_rope)`, or None with q_rope None.
        block_table, cache_seqlens, causal: as in `flash_mla_with_kvcache`.
        tile_scheduler_metadata, num_splits: from `get_mla_metadata`; planned here when omitted (plan once per
            step and pass them to avoid repeating that work in every layer).
        softmax_scale: defaults to `(d_latent + d_rope) ** -0.5`.
        attn_sink: as in `flash_mla_with_kvcache`.

    Returns:
        `out (batch, [s_q,] h_q, d_latent)` and `lse (batch, h_q, [s_q])` fp32, with the s_q axis only when
        q_latent has one.
    """
    V.check_tensor("q_latent", q_latent, dtypes=V.HALF_DTYPES)
    V.check_device("q_latent", q_latent)
    if q_latent.dim() not in (3, 4):
        raise ValueError(f"q_latent: expected (batch, [s_q,] h_q, d_latent), got shape {tuple(q_latent.shape)}")
    squeeze = q_latent.dim() == 3
    q_lat = q_latent.unsqueeze(1) if squeeze else q_latent
    if kv_latent_cache is None or not isinstance(kv_latent_cache, torch.Tensor):
        V.check_tensor("kv_latent_cache", kv_latent_cache)
    if kv_latent_cache.dim() not in (3, 4):
        raise ValueError(f"kv_latent_cache: expected (num_blocks, page_size, [h_k,] d_latent), "
                         f"got shape {tuple(kv_latent_cache.shape)}")
    kv_lat = kv_latent_cache.unsqueeze(2) if kv_latent_cache.dim() == 3 else kv_latent_cache
    V.check_tensor("kv_latent_cache", kv_lat, dtypes=(q_lat.dtype,), device=q_lat.device)
    batch, s_q, h_q, d_lat = q_lat.shape
    h_k = _check_cache_heads("kv_latent_cache", kv_lat, d_lat, h_q)
    if (q_rope is None) != (k_rope_cache is None):
        raise ValueError("q_rope: q_rope and k_rope_cache must be given together (or both None)")
    q_r = k_r = None
    d_rope = 0
    if q_rope is not None:
        V.check_tensor("q_rope", q_rope, ndim=q_latent.dim(), dtypes=(q_lat.dtype,), device=q_lat.device)
        q_r = q_rope.unsqueeze(1) if squeeze else q_rope
        d_rope = q_r.shape[-1]
        if q_r.shape[:-1] != q_lat.shape[:-1]:
            raise ValueError(f"q_rope: leading dims must equal q_latent's {tuple(q_lat.shape[:-1])}, "
                             f"got {tuple(q_r.shape[:-1])}")
        V.check_tensor("k_rope_cache", k_rope_cache, ndim=kv_latent_cache.dim(), dtypes=(q_lat.dtype,),
                       device=q_lat.device)
        k_r = k_rope_cache.unsqueeze(2) if k_rope_cache.dim() == 3 else k_rope_cache
        if k_r.shape[:-1] != kv_lat.shape[:-1] or k_r.shape[-1] != d_rope:
            raise ValueError(f"k_rope_cache: expected shape {(*kv_lat.shape[:-1], d_rope)}, got {tuple(k_r.shape)}")
    for name, t in (("q_latent", q_lat), ("q_rope", q_r), ("kv_latent_cache", kv_lat), ("k_rope_cache", k_r)):
        if t is not None:
            V.check_last_dim_contiguous(name, t)
    _check_value_dim("q_latent", d_lat, d_lat + d_rope)
    if not isinstance(causal, bool):
        raise TypeError(f"causal: expected a bool, got {type(causal).__name__}")
    scale = _check_scale(softmax_scale, (d_lat + d_rope) ** -0.5)
    if (tile_scheduler_metadata is None) != (num_splits is None):
        raise ValueError("tile_scheduler_metadata: pass it together with num_splits (or neither)")
    if tile_scheduler_metadata is None:
        V.check_tensor("cache_seqlens", cache_seqlens, ndim=1, dtypes=(torch.int32,), device=q_lat.device)
        tile_scheduler_metadata, num_splits = get_mla_metadata(cache_seqlens, s_q * h_q // h_k, h_k)
    _check_plan(batch, cache_seqlens, block_table, tile_scheduler_metadata, num_splits, q_lat.device)
    V.check_per_head("attn_sink", attn_sink, h_q, q_lat.device)
    out, lse = _mla_decode_fwd(q_lat, q_r, kv_lat, k_r, block_table, cache_seqlens, tile_scheduler_metadata,
                               num_splits, scale, causal, attn_sink, None, None)
    if squeeze:
        return out.squeeze(1), lse.squeeze(2)
    return out, lse


# FlashMLA's dense prefill names (`flash_attn_varlen_func` and the packed forms) for attention_varlen's.
_PREFILL_NAMES = {"cu_seqlens_q": "cu_seqlens_qo", "cu_seqlens_k": "cu_seqlens_kv", "max_seqlen_q": "max_seqlen_qo",
                  "max_seqlen_k": "max_seqlen_kv"}
_KV_PACKED_NAMES = {**_PREFILL_NAMES, "k": "kv", "v": "kv"}
_QKV_PACKED_NAMES = {"q": "qkv", "k": "qkv", "v": "qkv", "cu_seqlens_q": "cu_seqlens", "cu_seqlens_k": "cu_seqlens",
                     "max_seqlen_q": "max_seqlen", "max_seqlen_k": "max_seqlen"}


def _dense_prefill(q, k, v, cu_q, cu_k, max_q, max_k, dropout_p, softmax_scale, causal, deterministic, is_varlen,
                   names):
    """`flash_attn_varlen_func`'s call of fmha.attention_varlen; `names` maps attention_varlen's argument names to
    the caller's, for the messages."""
    if V.python_number(dropout_p) != 0 or isinstance(dropout_p, bool):
        raise ValueError(f"dropout_p: fmha computes attention without dropout (0.0 only), got {dropout_p!r}")
    if not isinstance(deterministic, bool):
        raise TypeError(f"deterministic: expected a bool, got {type(deterministic).__name__}")
    if is_varlen is not True:
        raise ValueError(f"is_varlen: only the varlen form (sequences given by the cu_seqlens) is implemented, got "
                         f"{is_varlen!r}")
    with V.renamed(names):
        out, lse = attention_varlen(q, k, v, cu_q, cu_k, max_q, max_k, softmax_scale=softmax_scale, causal=causal,
                                    return_lse=True)
    return out, lse.T


@forward_only
def flash_attn_varlen_func(q, k, v, cu_seqlens_qo, cu_seqlens_kv, max_seqlen_qo, max_seqlen_kv, dropout_p=0.0,
                           softmax_scale=None, causal=False, deterministic=False, is_varlen=True):
    """FlashMLA's dense prefill over packed sequences: `fmha.attention_varlen` under FlashMLA's names and return.

    Args:
        q: `(total_q, h_q, d_qk)` fp16/bf16; k: `(total_k, h_k, d_qk)`; v: `(total_k, h_k, d_v)` (d_qk 192 and d_v
            128 for DeepSeek's MLA prefill; any pair `attention_varlen` takes), `h_q % h_k == 0`.
        cu_seqlens_qo, cu_seqlens_kv: `(batch + 1,)` int32 prefix sums of the query / key counts.
        max_seqlen_qo, max_seqlen_kv: ints, at least the longest sequence's counts.
        dropout_p: 0.0 only. deterministic: accepted (the forward pass is deterministic either way).
        softmax_scale: defaults to `d_qk ** -0.5`.
        causal: bottom-right aligned, as FlashMLA's: query i of s_q sees key j of s_k iff `j <= i + s_k - s_q`.
        is_varlen: True only (the call form above).

    Returns:
        `out (total_q, h_q, d_v)` in q's dtype and `lse (total_q, h_q)` fp32 (natural log; -inf for a row that sees
        no key), as FlashMLA lays it out: a transposed view of an `(h_q, total_q)` tensor. Forward only: a backward
        through them raises.
    """
    return _dense_prefill(q, k, v, cu_seqlens_qo, cu_seqlens_kv, max_seqlen_qo, max_seqlen_kv, dropout_p,
                          softmax_scale, causal, deterministic, is_varlen, _PREFILL_NAMES)


def _check_packed(name, t, head_dim_qk, values):
    """Checks a packed tensor `name` whose last dim holds `values` (2 or 1) blocks of head_dim_qk columns, then the
    values' d_v; returns head_dim_qk as a Python int."""
    V.check_tensor(name, t, ndim=3)
    head_dim_qk = V.check_int("head_dim_qk", head_dim_qk)
    if not 0 < values * head_dim_qk < t.shape[-1]:
        raise ValueError(f"head_dim_qk: {values} x head_dim_qk must be under {name}'s last dim ({t.shape[-1]}), "
                         f"got {head_dim_qk}")
    return head_dim_qk


@forward_only
def flash_attn_varlen_qkvpacked_func(qkv, cu_seqlens, max_seqlen, head_dim_qk, dropout_p=0.0, softmax_scale=None,
                                     causal=False, deterministic=False, is_varlen=True):
    """`flash_attn_varlen_func` with q, k and v packed along the last dim of one tensor, FlashMLA's layout: qkv
    `(total, h, 2 * head_dim_qk + d_v)` = [q | k | v] a head (read in place), one `cu_seqlens` / `max_seqlen` for
    queries and keys. Returns `(out, lse)` as `flash_attn_varlen_func`."""
    d = _check_packed("qkv", qkv, head_dim_qk, 2)
    return _dense_prefill(qkv[..., :d], qkv[..., d:2 * d], qkv[..., 2 * d:], cu_seqlens, cu_seqlens, max_seqlen,
                          max_seqlen, dropout_p, softmax_scale, causal, deterministic, is_varlen, _QKV_PACKED_NAMES)


@forward_only
def flash_attn_varlen_kvpacked_func(q, kv, cu_seqlens_qo, cu_seqlens_kv, max_seqlen_qo, max_seqlen_kv, head_dim_qk,
                                    dropout_p=0.0, softmax_scale=None, causal=False, deterministic=False,
                                    is_varlen=True):
    """`flash_attn_varlen_func` with k and v packed along the last dim, FlashMLA's layout: kv `(total_k, h_k,
    head_dim_qk + d_v)` = [k | v] a head (read in place). Returns `(out, lse)` as `flash_attn_varlen_func`."""
    d = _check_packed("kv", kv, head_dim_qk, 1)
    return _dense_prefill(q, kv[..., :d], kv[..., d:], cu_seqlens_qo, cu_seqlens_kv, max_seqlen_qo, max_seqlen_kv,
                          dropout_p, softmax_scale, causal, deterministic, is_varlen, _KV_PACKED_NAMES)
