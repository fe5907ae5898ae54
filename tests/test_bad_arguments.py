"""Bad arguments, each in turn: every public call, given one argument made wrong, raises TypeError or ValueError
whose message starts with that argument's name (or the name of an argument it must agree with), and changes no
tensor it was given. test_validate.py spells out checks one by one; this file makes every such change it can.

Each call (`CALLS`: small shapes, every optional tensor given) is broken in one thing at a time:
- a tensor's dtype (float64 for a floating one, float32 for an integer one), its rank (one more dim, or one fewer),
  a size that must match another argument's (`Call.sizes`), its last dim's stride (2), its type (a list), a
  required tensor left out (None), or its device (the CPU, on a GPU machine);
- a scalar option set to a value of the wrong type or out of range (`Call.scalars`).
None of these can be valid, so the call must raise, naming the argument, and the tensors must be unchanged: the
check runs before any kernel launches or any in-place write (the KV-cache append's).
"""
import math
from dataclasses import dataclass, field

import pytest
import torch

import fmha
import fmha.mla as flash_mla
from conftest import ON_GPU
from test_kvcache import _slots

DEV = "cuda" if ON_GPU else "cpu"
pytestmark = pytest.mark.gpu if ON_GPU else pytest.mark.cpu
INTS = (torch.int32, torch.int64)


@dataclass
class Call:
    """One valid call: `fn(**kwargs)`. `sizes`: (argument, dim, names): changing that dim of that argument alone
    breaks the call, and the message may name any of `names` (the argument and those it must agree with).
    `ranks`: the ranks an argument may have (its own rank if not listed). `optional`: tensors that may be None.
    `scalars`: (argument, bad value) pairs. `partners`: more names that any change of an argument may be reported
    under (mla_decode's rope parts, given together or not at all). `any_strides`: the arguments that torch ops
    read, not kernels, so any layout does (True: all of them). 1-D tensors (per-head or per-sequence vectors) go to
    the kernels as copies when strided (`launch.dense`), so no last-dim stride is tried on them; nor on descales,
    which go as copies too."""
    fn: callable
    kwargs: dict
    sizes: list
    optional: set = field(default_factory=set)
    ranks: dict = field(default_factory=dict)
    scalars: list = field(default_factory=list)
    any_strides: object = ()
    partners: dict = field(default_factory=dict)


def _t(*shape, dtype):
    return torch.randn(shape, device=DEV).to(dtype)


def _i(values):
    return torch.tensor(values, dtype=torch.int32, device=DEV)


# Scalar options every dense entry point takes, each value wrong.
DENSE_SCALARS = [("causal", 1), ("causal", "yes"), ("softmax_scale", -1.0), ("softmax_scale", math.nan),
                 ("softmax_scale", math.inf), ("softmax_scale", "0.1"), ("softcap", -0.5), ("softcap", math.inf),
                 ("softcap", "3"), ("window", (-2, 0)), ("window", (0, -3)), ("window", (1.5, 0)), ("window", 3),
                 ("window", (1, 2, 3))]
DENSE_OPTIONAL = {"out", "sinks", "alibi_slopes"}


def _attention(dtype):
    b, sq, sk, hq, hk, d, dv = 2, 5, 7, 4, 2, 32, 16
    kw = dict(q=_t(b, sq, hq, d, dtype=dtype), k=_t(b, sk, hk, d, dtype=dtype), v=_t(b, sk, hk, dv, dtype=dtype),
              out=_t(b, sq, hq, dv, dtype=dtype), sinks=_t(hq, dtype=torch.float32),
              alibi_slopes=_t(hq, dtype=torch.float32).abs(), causal=True)
    sizes = [("q", 0, "q k"), ("k", 0, "k v"), ("v", 0, "v"), ("out", 0, "out"), ("q", 1, "out"), ("k", 1, "v"),
             ("v", 1, "v"), ("q", 2, "k out sinks alibi_slopes"), ("k", 2, "k v"), ("v", 2, "v"), ("out", 2, "out"),
             ("sinks", 0, "sinks"), ("alibi_slopes", 0, "alibi_slopes"), ("q", 3, "q k"), ("k", 3, "k"),
             ("v", 3, "v out"), ("out", 3, "out")]
    return Call(fmha.attention, kw, sizes, DENSE_OPTIONAL, scalars=DENSE_SCALARS)


def _attention_varlen(dtype):
    hq, hk, d, dv = 4, 2, 32, 16
    kw = dict(q=_t(9, hq, d, dtype=dtype), k=_t(11, hk, d, dtype=dtype), v=_t(11, hk, dv, dtype=dtype),
              cu_seqlens_q=_i([0, 4, 9]), cu_seqlens_k=_i([0, 5, 11]), max_seqlen_q=5, max_seqlen_k=6,
              out=_t(9, hq, dv, dtype=dtype), sinks=_t(hq, dtype=torch.float32),
              alibi_slopes=_t(hq, dtype=torch.float32).abs(), seqused_k=_i([4, 6]))
    sizes = [("q", 0, "out"), ("k", 0, "v"), ("v", 0, "v"), ("q", 1, "k out sinks alibi_slopes"), ("k", 1, "k v"),
             ("v", 1, "v"), ("q", 2, "q k"), ("k", 2, "k"), ("v", 2, "v out"), ("out", 0, "out"), ("out", 1, "out"),
             ("out", 2, "out"), ("cu_seqlens_q", 0, "cu_seqlens_q cu_seqlens_k seqused_k"),
             ("cu_seqlens_k", 0, "cu_seqlens_k"), ("seqused_k", 0, "seqused_k"), ("sinks", 0, "sinks")]
    scalars = DENSE_SCALARS + [("max_seqlen_q", -1), ("max_seqlen_q", 5.0), ("max_seqlen_k", -1),
                               ("max_seqlen_k", None), ("max_seqlen_k", True)]
    return Call(fmha.attention_varlen, kw, sizes, DENSE_OPTIONAL | {"seqused_k"}, scalars=scalars)


def _attention_with_kvcache(dtype):
    """A paged cache (pages shuffled) with new keys appended: the append writes the caches in place, so a check that
    ran after it would leave them changed."""
    b, sq, hq, hk, d, dv, page = 2, 3, 4, 2, 32, 16, 16
    kw = dict(q=_t(b, sq, hq, d, dtype=dtype), k_cache=_t(6, page, hk, d, dtype=dtype),
              v_cache=_t(6, page, hk, dv, dtype=dtype), cache_seqlens=_i([5, 17]),
              block_table=_i([[4, 0, 2], [1, 5, 3]]), k=_t(b, sq, hk, d, dtype=dtype), v=_t(b, sq, hk, dv, dtype=dtype),
              out=_t(b, sq, hq, dv, dtype=dtype), sinks=_t(hq, dtype=torch.float32),
              alibi_slopes=_t(hq, dtype=torch.float32).abs(), causal=True)
    sizes = [("q", 0, "q cache_seqlens block_table k out"), ("cache_seqlens", 0, "cache_seqlens"),
             ("block_table", 0, "block_table"), ("k", 0, "k"), ("v", 0, "v"), ("out", 0, "out"), ("q", 1, "out"),
             ("k", 1, "v"), ("v", 1, "v"), ("q", 2, "k_cache out sinks alibi_slopes"),
             ("k_cache", 2, "k_cache v_cache"), ("v_cache", 2, "v_cache"), ("k", 2, "k"), ("v", 2, "v"),
             ("q", 3, "q k_cache"), ("k_cache", 3, "k_cache"), ("k", 3, "k"), ("v_cache", 3, "v_cache out"),
             ("v", 3, "v"), ("out", 3, "out"),
             ("k_cache", 0, "k_cache v_cache"), ("v_cache", 0, "v_cache"), ("k_cache", 1, "k_cache v_cache"),
             ("v_cache", 1, "v_cache"), ("sinks", 0, "sinks")]
    scalars = DENSE_SCALARS + [("num_splits", -1), ("num_splits", 1.5), ("num_splits", True), ("num_splits", 65536),
                               ("cache_seqlens", -1), ("cache_seqlens", 2.0)]
    return Call(fmha.attention_with_kvcache, kw, sizes, DENSE_OPTIONAL | {"k", "v", "block_table"}, scalars=scalars,
                any_strides={"k", "v"})


def _attention_fp8(dtype):
    """FP8 q, k and v with their descales; the output in `dtype`."""
    b, sq, sk, hq, hk, d = 2, 5, 7, 4, 2, 32
    f8 = torch.float8_e4m3fn
    kw = dict(q=_t(b, sq, hq, d, dtype=f8), k=_t(b, sk, hk, d, dtype=f8), v=_t(b, sk, hk, d, dtype=f8),
              out=_t(b, sq, hq, d, dtype=dtype), q_descale=_t(b, hk, dtype=torch.float32).abs(),
              k_descale=_t(b, hk, dtype=torch.float32).abs(), v_descale=_t(b, hk, dtype=torch.float32).abs())
    sizes = [("q", 0, "k q_descale k_descale v_descale"), ("k", 0, "k v"), ("k", 1, "v"), ("v", 1, "v"),
             ("k", 2, "k v"), ("out", 3, "out")]
    sizes += [(f"{x}_descale", dim, f"{x}_descale") for x in "qkv" for dim in (0, 1)]
    descales = {"q_descale", "k_descale", "v_descale"}
    return Call(fmha.attention, kw, sizes, {"out"} | descales, any_strides=descales)


def _attention_varlen_paged(dtype):
    """Packed queries beside a paged cache (`block_table`), each sequence's key count from seqused_k."""
    hq, hk, d, page = 4, 2, 32, 16
    kw = dict(q=_t(9, hq, d, dtype=dtype), k=_t(4, page, hk, d, dtype=dtype), v=_t(4, page, hk, d, dtype=dtype),
              cu_seqlens_q=_i([0, 4, 9]), cu_seqlens_k=None, max_seqlen_q=5, max_seqlen_k=20,
              seqused_k=_i([12, 20]), block_table=_i([[3, 0], [1, 2]]), causal=True)
    sizes = [("q", 2, "q k"), ("k", 0, "k v"), ("k", 1, "k v"), ("k", 2, "k v"), ("k", 3, "k q"), ("v", 0, "v"),
             ("v", 3, "v"), ("seqused_k", 0, "seqused_k"), ("block_table", 0, "block_table"),
             ("cu_seqlens_q", 0, "cu_seqlens_q seqused_k block_table")]
    return Call(fmha.attention_varlen, kw, sizes, scalars=DENSE_SCALARS,
                partners={"seqused_k": "cu_seqlens_k", "block_table": "k"})


def _attention_with_kvcache_rows(dtype):
    """A contiguous cache read through cache_batch_idx and cache_leftpad, new keys rotated (rotary tables) and
    appended, a sliding window."""
    b, sq, hq, hk, d = 2, 3, 4, 2, 32
    kw = dict(q=_t(b, sq, hq, d, dtype=dtype), k_cache=_t(3, 24, hk, d, dtype=dtype),
              v_cache=_t(3, 24, hk, d, dtype=dtype), cache_seqlens=_i([5, 9]), cache_batch_idx=_i([2, 0]),
              cache_leftpad=_i([1, 0]), k=_t(b, sq, hk, d, dtype=dtype), v=_t(b, sq, hk, d, dtype=dtype),
              rotary_cos=_t(32, 8, dtype=torch.float32), rotary_sin=_t(32, 8, dtype=torch.float32), window=(4, 0))
    sizes = [("q", 0, "q cache_seqlens cache_batch_idx cache_leftpad k"), ("cache_batch_idx", 0, "cache_batch_idx"),
             ("cache_leftpad", 0, "cache_leftpad"), ("k_cache", 1, "k_cache v_cache"), ("v_cache", 1, "v_cache"),
             ("k", 0, "k"), ("k", 1, "v"), ("v", 3, "v_cache"), ("rotary_cos", 1, "rotary_sin"),
             ("rotary_sin", 0, "rotary_sin"), ("rotary_sin", 1, "rotary_sin")]
    scalars = DENSE_SCALARS + [("rotary_interleaved", 1), ("num_splits", -2)]
    return Call(fmha.attention_with_kvcache, kw, sizes, {"cache_batch_idx", "cache_leftpad", "k", "v", "rotary_cos",
                                                          "rotary_sin"},
                scalars=scalars, any_strides={"k", "v", "rotary_cos", "rotary_sin"},
                partners={"rotary_cos": "rotary_sin", "rotary_sin": "rotary_cos", "k": "v", "v": "k"})


def _attention_with_kvcache_fp8(dtype):
    """A paged FP8 cache beside 16-bit queries, with its descales."""
    b, sq, hq, hk, d, page = 2, 1, 4, 2, 32, 16
    f8 = torch.float8_e4m3fn
    kw = dict(q=_t(b, sq, hq, d, dtype=dtype), k_cache=_t(4, page, hk, d, dtype=f8),
              v_cache=_t(4, page, hk, d, dtype=f8), cache_seqlens=_i([5, 30]), block_table=_i([[3, 0], [1, 2]]),
              k_descale=_t(b, hk, dtype=torch.float32).abs(), v_descale=_t(b, hk, dtype=torch.float32).abs())
    sizes = [("q", 0, "q cache_seqlens block_table k_descale v_descale"), ("k_cache", 2, "k_cache v_cache"),
             ("k_descale", 0, "k_descale"), ("k_descale", 1, "k_descale"), ("v_descale", 1, "v_descale")]
    return Call(fmha.attention_with_kvcache, kw, sizes, {"block_table", "k_descale", "v_descale"},
                scalars=[("num_splits", -1)], any_strides={"k_descale", "v_descale"})


def _mla_plan(seqlens, tokens_per_head_k):
    plan = flash_mla.get_mla_metadata(seqlens, tokens_per_head_k, 1)
    return dict(zip(("tile_scheduler_metadata", "num_splits"), plan))


MLA_SCALARS = [("causal", 1), ("softmax_scale", -1.0), ("softmax_scale", math.nan), ("softmax_scale", "x")]


def _flash_mla_with_kvcache(dtype):
    b, sq, hq, d, dv, page = 2, 2, 4, 48, 32, 16
    seqlens = _i([5, 20])
    kw = dict(q=_t(b, sq, hq, d, dtype=dtype), k_cache=_t(4, page, 1, d, dtype=dtype),
              block_table=_i([[3, 1], [0, 2]]), cache_seqlens=seqlens, head_dim_v=dv,
              **_mla_plan(seqlens, sq * hq), causal=True, attn_sink=_t(hq, dtype=torch.float32))
    sizes = [("q", 0, "q block_table cache_seqlens num_splits"), ("block_table", 0, "block_table"),
             ("cache_seqlens", 0, "cache_seqlens"), ("num_splits", 0, "num_splits"),
             ("q", 3, "q k_cache head_dim_v"), ("k_cache", 3, "k_cache"), ("attn_sink", 0, "attn_sink"),
             ("tile_scheduler_metadata", 1, "tile_scheduler_metadata")]
    scalars = MLA_SCALARS + [("head_dim_v", 24), ("head_dim_v", 64), ("head_dim_v", 32.0)]
    return Call(flash_mla.flash_mla_with_kvcache, kw, sizes, {"attn_sink"}, scalars=scalars)


def _flash_mla_fp8(dtype):
    """DeepSeek-V3.2's FP8 cache (656 packed bytes a token: 512 e4m3 latent values, 4 fp32 scales, 64 bf16 rope)."""
    b, sq, hq, page = 2, 1, 16, 64
    seqlens = _i([5, 70])
    cache = flash_mla.quantize_kv_cache(_t(3, page, 1, 576, dtype=torch.bfloat16), "v32")
    kw = dict(q=_t(b, sq, hq, 576, dtype=dtype), k_cache=cache, block_table=_i([[2, 1], [0, 1]]), cache_seqlens=seqlens,
              head_dim_v=512, **_mla_plan(seqlens, sq * hq), is_fp8_kvcache=True)
    sizes = [("q", 0, "q block_table cache_seqlens num_splits"), ("q", 3, "q k_cache head_dim_v"),
             ("k_cache", 3, "k_cache"), ("k_cache", 2, "k_cache"), ("block_table", 0, "block_table")]
    return Call(flash_mla.flash_mla_with_kvcache, kw, sizes, scalars=[("head_dim_v", 256), ("head_dim_v", 576)])


def _flash_mla_sparse_decode(dtype):
    """Token-sparse decode from two sources (DeepSeek-V4's compressed cache and sliding window), each with its
    lengths, planned with `topk`."""
    b, sq, hq, d, dv, page = 2, 2, 4, 48, 32, 16
    lens = _i([5, 20])
    kw = dict(q=_t(b, sq, hq, d, dtype=dtype), k_cache=_t(4, page, 1, d, dtype=dtype), block_table=None,
              cache_seqlens=None, head_dim_v=dv,
              **dict(zip(("tile_scheduler_metadata", "num_splits"),
                         flash_mla.get_mla_metadata(lens, sq * hq, 1, num_heads_q=hq, topk=8))),
              indices=torch.randint(-1, 4 * page, (b, sq, 8), dtype=torch.int32, device=DEV), topk_length=_i([8, 5]),
              attn_sink=_t(hq, dtype=torch.float32), extra_k_cache=_t(3, page, 1, d, dtype=dtype),
              extra_indices_in_kvcache=torch.randint(-1, 3 * page, (b, sq, 4), dtype=torch.int32, device=DEV),
              extra_topk_length=_i([4, 1]))
    sizes = [("q", 0, "q indices"), ("q", 1, "q indices"), ("q", 3, "q k_cache head_dim_v"),
             ("indices", 0, "indices"), ("indices", 1, "indices"), ("topk_length", 0, "topk_length"),
             ("extra_indices_in_kvcache", 0, "extra_indices_in_kvcache"),
             ("extra_indices_in_kvcache", 1, "extra_indices_in_kvcache"),
             ("extra_topk_length", 0, "extra_topk_length"), ("k_cache", 3, "k_cache"),
             ("extra_k_cache", 3, "extra_k_cache"), ("extra_k_cache", 2, "extra_k_cache"),
             ("num_splits", 0, "num_splits"), ("tile_scheduler_metadata", 1, "tile_scheduler_metadata"),
             ("attn_sink", 0, "attn_sink")]
    scalars = [("causal", True), ("softmax_scale", 0.0), ("head_dim_v", 40)]
    return Call(flash_mla.flash_mla_with_kvcache, kw, sizes, {"attn_sink", "topk_length", "extra_topk_length",
                                                               "extra_k_cache", "extra_indices_in_kvcache"},
                scalars=scalars, partners={"extra_k_cache": "extra_indices_in_kvcache", "indices": "topk_length"})


def _mla_decode(dtype):
    b, sq, hq, dl, dr, page = 2, 2, 4, 32, 16, 16
    kw = dict(q_latent=_t(b, sq, hq, dl, dtype=dtype), q_rope=_t(b, sq, hq, dr, dtype=dtype),
              kv_latent_cache=_t(4, page, dl, dtype=dtype), k_rope_cache=_t(4, page, dr, dtype=dtype),
              block_table=_i([[3, 1], [0, 2]]), cache_seqlens=_i([5, 20]), causal=True,
              attn_sink=_t(hq, dtype=torch.float32))
    sizes = [("q_latent", 0, "q_latent q_rope block_table cache_seqlens"), ("q_rope", 0, "q_rope"),
             ("q_latent", 1, "q_latent q_rope"), ("q_rope", 1, "q_rope"), ("q_latent", 2, "q_latent q_rope attn_sink"),
             ("q_rope", 2, "q_rope"), ("q_latent", 3, "q_latent kv_latent_cache"), ("q_rope", 3, "q_rope k_rope_cache"),
             ("kv_latent_cache", 2, "kv_latent_cache"), ("k_rope_cache", 2, "k_rope_cache"),
             ("kv_latent_cache", 0, "k_rope_cache"), ("k_rope_cache", 0, "k_rope_cache"),
             ("kv_latent_cache", 1, "k_rope_cache"), ("k_rope_cache", 1, "k_rope_cache"),
             ("block_table", 0, "block_table"), ("cache_seqlens", 0, "cache_seqlens"), ("attn_sink", 0, "attn_sink")]
    return Call(flash_mla.mla_decode, kw, sizes, {"attn_sink"}, ranks={"q_latent": (3, 4), "q_rope": (3, 4)},
                scalars=MLA_SCALARS, partners={"k_rope_cache": "q_rope"})


def _flash_mla_sparse_fwd(dtype):
    sq, hq, d, skv, topk = 3, 4, 48, 20, 8
    kw = dict(q=_t(sq, hq, d, dtype=dtype), kv=_t(skv, 1, d, dtype=dtype),
              indices=torch.randint(-1, skv, (sq, 1, topk), dtype=torch.int32, device=DEV), d_v=32,
              attn_sink=_t(hq, dtype=torch.float32), topk_length=_i([8, 3, 0]))
    sizes = [("q", 0, "q indices topk_length"), ("indices", 0, "indices"), ("topk_length", 0, "topk_length"),
             ("q", 2, "q kv"), ("kv", 2, "kv"), ("kv", 1, "kv indices"), ("indices", 1, "indices"),
             ("attn_sink", 0, "attn_sink")]
    scalars = [("sm_scale", -1.0), ("sm_scale", math.inf), ("d_v", 24), ("d_v", 64), ("d_v", "32")]
    return Call(flash_mla.flash_mla_sparse_fwd, kw, sizes, {"attn_sink", "topk_length"}, scalars=scalars)


def _merge_attention_states(dtype):
    kw = dict(o_a=_t(2, 3, 4, 16, dtype=dtype), lse_a=_t(2, 3, 4, dtype=torch.float32),
              o_b=_t(2, 3, 4, 16, dtype=dtype), lse_b=_t(2, 3, 4, dtype=torch.float32))
    sizes = [(name, dim, f"{name} {'o_a lse_a' if name[-1] == 'b' else 'o_b lse_b'}")
             for name in kw for dim in range(kw[name].dim())]
    return Call(fmha.merge_attention_states, kw, sizes, any_strides=True, partners={"o_a": "lse_a", "o_b": "lse_b"})


def _apply_attention_sink(dtype):
    kw = dict(out=_t(2, 3, 4, 16, dtype=dtype), lse=_t(2, 3, 4, dtype=torch.float32), sinks=_t(4, dtype=torch.float32))
    sizes = [("out", 0, "out lse"), ("out", 1, "out lse"), ("out", 2, "out lse sinks"), ("lse", 0, "lse"),
             ("lse", 1, "lse"), ("lse", 2, "lse"), ("sinks", 0, "sinks")]
    return Call(fmha.apply_attention_sink, kw, sizes, any_strides=True, partners={"out": "lse"})


def _get_mla_metadata(dtype):
    kw = dict(cache_seqlens=_i([5, 20]), num_q_tokens_per_head_k=8, num_heads_k=1)
    scalars = [("num_q_tokens_per_head_k", 0), ("num_q_tokens_per_head_k", -8), ("num_q_tokens_per_head_k", 8.0),
               ("num_heads_k", 0), ("num_heads_k", "1"), ("topk", -1)]
    return Call(flash_mla.get_mla_metadata, kw, [], scalars=scalars)


def _flash_attn_varlen_func(dtype):
    """FlashMLA's dense prefill name for attention_varlen (d_qk 192 / d_v 128): its checks under FlashMLA's names."""
    hq, hk = 4, 2
    kw = dict(q=_t(9, hq, 192, dtype=dtype), k=_t(11, hk, 192, dtype=dtype), v=_t(11, hk, 128, dtype=dtype),
              cu_seqlens_qo=_i([0, 4, 9]), cu_seqlens_kv=_i([0, 5, 11]), max_seqlen_qo=5, max_seqlen_kv=6,
              causal=True)
    sizes = [("k", 0, "v"), ("v", 0, "v"), ("q", 1, "k"), ("k", 1, "k v"), ("v", 1, "v"),
             ("q", 2, "q k"), ("k", 2, "k"), ("v", 2, "v"), ("cu_seqlens_qo", 0, "cu_seqlens_qo cu_seqlens_kv"),
             ("cu_seqlens_kv", 0, "cu_seqlens_kv")]
    scalars = [("causal", 1), ("softmax_scale", -1.0), ("softmax_scale", "0.1"), ("max_seqlen_qo", -1),
               ("max_seqlen_kv", 5.0), ("dropout_p", 0.1), ("dropout_p", None), ("deterministic", "no"),
               ("is_varlen", False)]
    return Call(flash_mla.flash_attn_varlen_func, kw, sizes, scalars=scalars)


CALLS = {f.__name__[1:]: f for f in (_attention, _attention_fp8, _attention_varlen, _attention_varlen_paged,
                                     _attention_with_kvcache, _attention_with_kvcache_rows,
                                     _attention_with_kvcache_fp8, _flash_mla_with_kvcache, _flash_mla_fp8,
                                     _flash_mla_sparse_decode,
                                     _mla_decode, _flash_mla_sparse_fwd, _merge_attention_states,
                                     _apply_attention_sink, _get_mla_metadata, _flash_attn_varlen_func)}


def _resized(t, dim):
    """`t` with one more entry along `dim` (a copy of its first: indices stay in range, lengths plausible)."""
    return torch.cat([t, t.narrow(dim, 0, 1)], dim)


def _strided(t):
    """The same values with the last dim's stride 2."""
    wide = torch.zeros(*t.shape[:-1], 2 * t.shape[-1], dtype=t.dtype, device=t.device)
    wide[..., ::2] = t
    return wide[..., ::2]


def _mutations(call):
    """Every one-argument change of `call` that no valid call has: (argument, new value, names the message may
    start with, what was done)."""
    out = []
    for name, t in call.kwargs.items():
        if not isinstance(t, torch.Tensor):
            continue
        ranks = call.ranks.get(name, (t.dim(),))
        names = {name, *call.partners.get(name, "").split()}
        wrong = torch.float32 if t.dtype in INTS else torch.float64
        out.append((name, t.to(wrong), names, f"dtype {wrong}"))
        out.append((name, t.tolist(), names, "a list"))
        if t.dim() + 1 not in ranks:
            out.append((name, t.unsqueeze(0), names, "one more dim"))
        if t.dim() - 1 not in ranks:
            out.append((name, t[0], names, "one dim fewer"))
        strided_ok = call.any_strides is True or name in call.any_strides
        if t.dim() >= 2 and t.shape[-1] > 1 and not strided_ok:
            out.append((name, _strided(t), names, "last-dim stride 2"))
        if name not in call.optional:
            out.append((name, None, names, "None"))
        if ON_GPU:
            out.append((name, t.cpu(), names, "on the CPU"))
    for name, dim, names in call.sizes:
        names = {name, *names.split(), *call.partners.get(name, "").split()}
        out.append((name, _resized(call.kwargs[name], dim), names, f"size of dim {dim} + 1"))
    for name, value in call.scalars:
        out.append((name, value, {name}, f"= {value!r}"))
    return out


def _snapshot(kwargs):
    return {k: v.clone() for k, v in kwargs.items() if isinstance(v, torch.Tensor)}


def _same(a, b):
    """Bit-equal (NaN included)."""
    as_bytes = lambda t: t.reshape(-1).contiguous().view(torch.uint8)      # noqa: E731
    return a.shape == b.shape and torch.equal(as_bytes(a), as_bytes(b))


def _argument_named(message):
    """The argument a check's message starts with: `name: ...` or `name[i]: ...`."""
    return message.split(":", 1)[0].split("[", 1)[0].strip()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("call_name", sorted(CALLS))
def test_each_bad_argument(call_name, dtype):
    """Every change `_mutations` makes to the call raises TypeError / ValueError naming the argument (no kernel runs:
    bf16 is fine in the interpreter here), and leaves every tensor it was given as it was."""
    call = CALLS[call_name](dtype)
    for name, value, names, what in _mutations(call):
        kwargs = dict(call.kwargs, **{name: value})
        before = _snapshot(kwargs)
        case = f"{call_name}: {name} {what}"
        with pytest.raises((TypeError, ValueError)) as err:
            call.fn(**kwargs)
        assert _argument_named(str(err.value)) in names, f"{case}: the message names another argument: {err.value}"
        for key, t in before.items():
            assert _same(kwargs[key], t), f"{case}: {key} changed"
    if ON_GPU:
        torch.cuda.synchronize()


@pytest.mark.parametrize("call_name", sorted(CALLS))
def test_calls_are_valid(call_name):
    """Each unbroken call runs, so that a broken one fails for the change made, not for a fault of the base call;
    and it writes only `out` and, when it appends new keys, the caches' rows at cache_seqlens[b] .. + seqlen_new."""
    call = CALLS[call_name](torch.float16)
    before = _snapshot(call.kwargs)
    call.fn(**call.kwargs)
    if ON_GPU:
        torch.cuda.synchronize()
    appended = _appended_rows(call.kwargs)
    for key, t in before.items():
        if key in appended:
            changed = (call.kwargs[key] != t).flatten(2).any(-1)                 # (pages or rows, slots)
            assert not (changed & ~appended[key]).any(), f"{call_name}: {key} changed outside the appended rows"
            assert changed[appended[key]].all(), f"{call_name}: {key} not written at every appended row"
        elif key != "out":
            assert _same(call.kwargs[key], t), f"{call_name}: {key} changed"


def _appended_rows(kwargs):
    """For a KV-cache call given new keys: {cache name: bool (pages or rows, slots)} of the rows it may write."""
    if kwargs.get("k") is None or "k_cache" not in kwargs:
        return {}
    cache = kwargs["k_cache"]
    rows = torch.zeros(cache.shape[:2], dtype=torch.bool, device=cache.device)
    for _, _, at in _slots(kwargs["cache_seqlens"].tolist(), kwargs["k"].shape[1], cache.shape[1],
                           kwargs.get("block_table"), kwargs.get("cache_batch_idx")):
        rows[at] = True
    return {"k_cache": rows, "v_cache": rows}


# Numeric options each call form takes beside its tensors, as Python numbers (the base calls' own are kept).
NUMBERS = {"attention": dict(softmax_scale=0.125, softcap=30.0, window=(3, 0)),
           "attention_fp8": dict(softmax_scale=0.25),
           "attention_varlen": dict(softmax_scale=0.125, window=(2, 1)),
           "attention_varlen_paged": dict(softcap=20.0),
           "attention_with_kvcache": dict(num_splits=2, softmax_scale=0.125, window=(5, 0)),
           "attention_with_kvcache_rows": dict(num_splits=3, softcap=10.0),
           "attention_with_kvcache_fp8": dict(softmax_scale=0.5),
           "flash_mla_with_kvcache": dict(softmax_scale=0.0625),
           "flash_mla_fp8": dict(softmax_scale=0.0625),
           "flash_mla_sparse_decode": dict(softmax_scale=0.0625),
           "mla_decode": dict(softmax_scale=0.0625),
           "flash_mla_sparse_fwd": dict(sm_scale=0.0625),
           "get_mla_metadata": dict(num_heads_q=8, topk=12),
           "flash_attn_varlen_func": dict(softmax_scale=0.125, dropout_p=0.0)}


def _numpy(value):
    """A Python number (or a tuple of them) as numpy scalars: int32 for an int, float32 for a float."""
    import numpy as np
    if isinstance(value, tuple):
        return tuple(_numpy(v) for v in value)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return value
    return np.int32(value) if isinstance(value, int) else np.float32(value)


def _results(result):
    """A call's tensors, copied (an `out=` tensor is written again by the next call)."""
    parts = result if isinstance(result, (tuple, list)) else (result,)
    return [p.clone() for p in parts if isinstance(p, torch.Tensor)]


@pytest.mark.parametrize("call_name", sorted(CALLS))
def test_numpy_scalars(call_name):
    """Numeric options given as numpy scalars (np.int32 / np.float32, as engines that plan in numpy pass them, and
    as torch's own ops and FlashAttention's take them) give the call with the Python numbers they hold, bit for bit;
    they raised TypeError before. Every numeric option of the call form is given so (`NUMBERS` adds the ones its
    base call leaves at their defaults)."""
    call = CALLS[call_name](torch.float16)
    python = dict(call.kwargs, **NUMBERS.get(call_name, {}))
    numpy = {name: _numpy(value) for name, value in python.items()}
    changed = [name for name in python if numpy[name] is not python[name]]
    assert changed or call_name in ("merge_attention_states", "apply_attention_sink"), call_name
    want = _results(call.fn(**python))
    got = _results(call.fn(**numpy))
    assert len(got) == len(want) and all(_same(g, w) for g, w in zip(got, want)), f"{call_name}: {changed}"
