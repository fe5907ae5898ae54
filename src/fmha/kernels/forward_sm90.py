"""Hopper (sm_90) fast path of the dense prefill forward, written in Gluon.

The `triton.language` kernel in `forward.py` is the portable path (and the one the CPU tests run); this one
is what `attention_forward` dispatches to on an H100/H200 for the plain dense case: no softcap, ALiBi, sinks
or left window, `head_dim_qk == head_dim_v` in {64, 128, 256}, q/k/v strides that TMA accepts (16-byte
aligned). The schedule is FlashAttention-3's, without its persistence:

* one CTA per (128 query rows, batch, head); causal CTAs launched longest first;
* a one-warp producer partition: Q once, then K and V tiles through a `STAGES`-deep ring of shared-memory
  slots, each completing on its own mbarrier (K and V apart, so QKᵀ starts before V lands);
* two consumer warpgroups, each owning 64 of the 128 query rows and reading the same K/V slots. Within one
  warpgroup, tile j's softmax runs while the tensor cores do tile j-1's P·V (intra-warpgroup overlap):
  issue S_j = Q·K_jᵀ, issue O += P_{j-1}·V_{j-1}, wait for S_j, softmax, wait for O, release the slot.
  The two warpgroups are free-running, so one's softmax also overlaps the other's wgmma.

Each tensor is seen by TMA as (batch, seqlen, columns), head h starting at column h * head_stride, so a tile
that runs past a sequence's end gets TMA's zero fill (keys there are masked to -inf; query rows there are
never stored). The output is written with masked pointer stores, one row per query.
"""
from __future__ import annotations

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait

ROWS = gl.constexpr(64)           # query rows per consumer warpgroup; a CTA has two
_ROWS = 64                        # the same, for the host
LOG2E = 1.4426950408889634
LN2 = gl.constexpr(0.6931471805599453)

# head_dim -> (BLOCK_N, STAGES, consumer register budget)
_TILES = {64: (128, 3, 232), 128: (128, 2, 240), 256: (64, 2, 240)}


@gluon.jit
def _producer(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, k_ready, v_ready, kv_empty,
              b, q_row, q_col, k_col, v_col, n_tiles,
              BLOCK_N: gl.constexpr, STAGES: gl.constexpr):
    # The descriptors are 3-D, (batch, seqlen, columns) with boxes (1, rows, head_dim); each box lands in a
    # 2-D slot seen through a (1, rows, head_dim) view.
    q_box: gl.constexpr = q_desc.block_type.shape
    k_box: gl.constexpr = k_desc.block_type.shape
    v_box: gl.constexpr = v_desc.block_type.shape
    mbarrier.expect(q_bar, 2 * q_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(q_desc, [b, q_row, q_col], q_bar, q_smem.index(0).reshape(q_box))
    tma.async_copy_global_to_shared(q_desc, [b, q_row + ROWS, q_col], q_bar, q_smem.index(1).reshape(q_box))
    for i in range(n_tiles):
        slot = i % STAGES
        # A slot is free once both consumers released it; the first pass over the ring waits on nothing.
        mbarrier.wait(kv_empty.index(slot), ((i // STAGES) & 1) ^ 1)
        mbarrier.expect(k_ready.index(slot), k_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(k_desc, [b, i * BLOCK_N, k_col], k_ready.index(slot),
                                        k_smem.index(slot).reshape(k_box))
        mbarrier.expect(v_ready.index(slot), v_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(v_desc, [b, i * BLOCK_N, v_col], v_ready.index(slot),
                                        v_smem.index(slot).reshape(v_box))


@gluon.jit
def _softmax_tile(s, i, m_i, l_i, q_pos, diag, seqlen_k, qk_scale_log2, mask_from,
                  BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr, s_layout: gl.constexpr):
    """Fold the raw scores of key tile `i` into (m_i, l_i); returns the probabilities and the rescale factor."""
    if i >= mask_from:            # a tile that crosses the sequence end or the causal diagonal
        k_pos = i * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
        ok = k_pos[None, :] < seqlen_k
        if CAUSAL:
            ok = ok & (k_pos[None, :] <= (q_pos + diag)[:, None])
        s = gl.where(ok, s, float("-inf"))
    m_new = gl.maximum(m_i, gl.max(s, 1) * qk_scale_log2)
    # A row that has seen no key yet keeps m = -inf; shift it by 0 so exp2 gives 0, not NaN.
    m_shift = gl.where(m_new == float("-inf"), 0.0, m_new)
    p = gl.exp2(s * qk_scale_log2 - m_shift[:, None])
    alpha = gl.exp2(m_i - m_shift)
    l_i = l_i * alpha + gl.sum(p, 1)
    return p, m_new, l_i, alpha


@gluon.jit
def _consumer(q_smem, k_smem, v_smem, q_bar, k_ready, v_ready, kv_empty, O, LSE,
              b, h, m_start, seqlen_q, seqlen_k, n_tiles, qk_scale_log2,
              stride_ob, stride_os, stride_oh, stride_lb, stride_lh, stride_ls,
              WG: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DV: gl.constexpr, STAGES: gl.constexpr,
              CAUSAL: gl.constexpr):
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, HEAD_DV, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    dtype: gl.constexpr = q_smem.dtype

    m0 = m_start + WG * ROWS
    q_pos = m0 + gl.arange(0, ROWS, layout=row_s)
    diag = seqlen_k - seqlen_q
    # First key tile that needs a mask for some row of this warpgroup.
    mask_from = seqlen_k // BLOCK_N
    if CAUSAL:
        mask_from = gl.minimum(mask_from, gl.maximum(m0 + diag + 1, 0) // BLOCK_N)

    acc = gl.zeros([ROWS, HEAD_DV], gl.float32, o_layout)
    m_i = gl.full([ROWS], float("-inf"), gl.float32, row_s)
    l_i = gl.zeros([ROWS], gl.float32, row_s)
    zero_s = gl.zeros([ROWS, BLOCK_N], gl.float32, s_layout)
    q = q_smem.index(WG)
    mbarrier.wait(q_bar, 0)
    if n_tiles > 0:
        mbarrier.wait(k_ready.index(0), 0)
        s_tok = warpgroup_mma(q, k_smem.index(0).permute((1, 0)), zero_s, use_acc=False, is_async=True)
        s = warpgroup_mma_wait(0, deps=(s_tok,))
        p, m_i, l_i, alpha = _softmax_tile(s, 0, m_i, l_i, q_pos, diag, seqlen_k, qk_scale_log2, mask_from,
                                           BLOCK_N, CAUSAL, s_layout)
        for i in range(1, n_tiles):
            slot = i % STAGES
            prev = (i - 1) % STAGES
            mbarrier.wait(k_ready.index(slot), (i // STAGES) & 1)
            s_tok = warpgroup_mma(q, k_smem.index(slot).permute((1, 0)), zero_s, use_acc=False, is_async=True)
            acc = acc * gl.convert_layout(alpha, row_o)[:, None]
            p_op = gl.convert_layout(p.to(dtype), p_layout)
            mbarrier.wait(v_ready.index(prev), ((i - 1) // STAGES) & 1)
            o_tok = warpgroup_mma(p_op, v_smem.index(prev), acc, is_async=True)
            s = warpgroup_mma_wait(1, deps=(s_tok,))
            p, m_i, l_i, alpha = _softmax_tile(s, i, m_i, l_i, q_pos, diag, seqlen_k, qk_scale_log2, mask_from,
                                               BLOCK_N, CAUSAL, s_layout)
            acc = warpgroup_mma_wait(0, deps=(o_tok,))
            mbarrier.arrive(kv_empty.index(prev), count=1)
        last = (n_tiles - 1) % STAGES
        acc = acc * gl.convert_layout(alpha, row_o)[:, None]
        p_op = gl.convert_layout(p.to(dtype), p_layout)
        mbarrier.wait(v_ready.index(last), ((n_tiles - 1) // STAGES) & 1)
        o_tok = warpgroup_mma(p_op, v_smem.index(last), acc, is_async=True)
        acc = warpgroup_mma_wait(0, deps=(o_tok,))
        mbarrier.arrive(kv_empty.index(last), count=1)

    # Epilogue: normalise, write the rows that exist; a row with no visible key gives 0 and LSE -inf.
    empty = l_i == 0.0
    lse = gl.where(empty, float("-inf"), (m_i + gl.log2(gl.where(empty, 1.0, l_i))) * LN2)
    inv_l = gl.convert_layout(1.0 / gl.where(empty, 1.0, l_i), row_o)
    out = acc * inv_l[:, None]
    store_layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    out = gl.convert_layout(out.to(O.dtype.element_ty), store_layout)
    rows = m0 + gl.arange(0, ROWS, layout=gl.SliceLayout(1, store_layout))
    cols = gl.arange(0, HEAD_DV, layout=gl.SliceLayout(0, store_layout))
    o_ptrs = O + b * stride_ob + h * stride_oh + rows[:, None] * stride_os + cols[None, :]
    gl.store(o_ptrs, out, mask=(rows < seqlen_q)[:, None])
    gl.store(LSE + b * stride_lb + h * stride_lh + q_pos * stride_ls, lse, mask=q_pos < seqlen_q)


@gluon.jit
def attn_fwd_sm90_kernel(q_desc, k_desc, v_desc, O, LSE, seqlen_q, seqlen_k, heads_q, group,
                         stride_qh, stride_kh, stride_vh,
                         stride_ob, stride_os, stride_oh, stride_lb, stride_lh, stride_ls, qk_scale_log2,
                         BLOCK_N: gl.constexpr, HEAD_D: gl.constexpr, HEAD_DV: gl.constexpr,
                         STAGES: gl.constexpr, CAUSAL: gl.constexpr, CONSUMER_REGS: gl.constexpr):
    bh = gl.program_id(0)
    pid_m = gl.program_id(1)
    if CAUSAL:                    # the longest rows (most key tiles) start first
        pid_m = gl.num_programs(1) - 1 - pid_m
    b = bh // heads_q
    h = bh % heads_q
    hk = h // group
    m_start = pid_m * (2 * ROWS)
    hi = seqlen_k
    if CAUSAL:
        hi = gl.maximum(gl.minimum(hi, m_start + 2 * ROWS + seqlen_k - seqlen_q), 0)
    n_tiles = gl.cdiv(hi, BLOCK_N)

    dtype: gl.constexpr = q_desc.dtype
    q_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([ROWS, HEAD_D], dtype)
    k_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, HEAD_D], dtype)
    v_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, HEAD_DV], dtype)
    q_smem = gl.allocate_shared_memory(dtype, [2, ROWS, HEAD_D], q_layout)
    k_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_D], k_layout)
    v_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DV], v_layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    kv_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for s in gl.static_range(STAGES):
        mbarrier.init(k_ready.index(s), count=1)
        mbarrier.init(v_ready.index(s), count=1)
        mbarrier.init(kv_empty.index(s), count=2)       # both consumer warpgroups release a slot

    gl.warp_specialize([
        (_consumer, (q_smem, k_smem, v_smem, q_bar, k_ready, v_ready, kv_empty, O, LSE,
                     b, h, m_start, seqlen_q, seqlen_k, n_tiles, qk_scale_log2,
                     stride_ob, stride_os, stride_oh, stride_lb, stride_lh, stride_ls,
                     0, BLOCK_N, HEAD_DV, STAGES, CAUSAL)),
        (_consumer, (q_smem, k_smem, v_smem, q_bar, k_ready, v_ready, kv_empty, O, LSE,
                     b, h, m_start, seqlen_q, seqlen_k, n_tiles, qk_scale_log2,
                     stride_ob, stride_os, stride_oh, stride_lb, stride_lh, stride_ls,
                     1, BLOCK_N, HEAD_DV, STAGES, CAUSAL)),
        (_producer, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, k_ready, v_ready, kv_empty,
                     b, m_start, h * stride_qh, hk * stride_kh, hk * stride_vh,
                     n_tiles, BLOCK_N, STAGES)),
    ], [4, 1], [CONSUMER_REGS, 24])


def _view3(t):
    """(shape, strides) of the 3-D TMA view (batch, seqlen, columns) of a (batch, seqlen, heads, dim) tensor,
    or None when TMA's rules (16-byte aligned base and strides, unit last stride) are not met."""
    b, s, h, d = t.shape
    sb, ss, sh, sd = t.stride()
    el = t.element_size()
    if sd != 1 or (el * sb) % 16 or (el * ss) % 16 or t.data_ptr() % 16 or (h > 1 and sh < d):
        return None
    return [b, s, (h - 1) * sh + d], [sb, ss, 1]


def supported(q, k, v):
    """Whether a plain dense call (the caller has checked the options) can take this path: Hopper, fp16/bf16,
    head_dim_qk == head_dim_v in `_TILES`, keys present, and q/k/v strides that TMA accepts."""
    if not q.is_cuda or torch.cuda.get_device_capability(q.device)[0] != 9:
        return False
    if q.dtype not in (torch.float16, torch.bfloat16) or q.dim() != 4:
        return False
    d, dv = q.shape[-1], v.shape[-1]
    if d != dv or d not in _TILES or k.shape[1] == 0:
        return False
    return all(_view3(t) is not None for t in (q, k, v))


def attention_forward_sm90(q, k, v, out, lse, *, causal, softmax_scale):
    """Launch the Gluon kernel. q (b, sq, hq, d), k/v (b, sk, hk, d); out (b, sq, hq, d); lse (b, hq, sq)."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    batch, seqlen_q, heads_q, d = q.shape
    seqlen_k, heads_k = k.shape[1], k.shape[2]
    block_n, stages, regs = _TILES[d]
    el = gl.float16 if q.dtype == torch.float16 else gl.bfloat16

    def desc(t, rows):
        shape, strides = _view3(t)
        layout = gl.NVMMASharedLayout.get_default_for([1, rows, d], el)
        return TensorDescriptor(t, shape, strides, [1, rows, d], layout)

    grid = (batch * heads_q, triton.cdiv(seqlen_q, 2 * _ROWS))
    attn_fwd_sm90_kernel[grid](
        desc(q, _ROWS), desc(k, block_n), desc(v, block_n), out, lse, seqlen_q, seqlen_k, heads_q,
        heads_q // heads_k, q.stride(2), k.stride(2), v.stride(2),
        out.stride(0), out.stride(1), out.stride(2), *lse.stride(), softmax_scale * LOG2E,
        BLOCK_N=block_n, HEAD_D=d, HEAD_DV=d, STAGES=stages, CAUSAL=causal, CONSUMER_REGS=regs,
        num_warps=4)
