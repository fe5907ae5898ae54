"""Hopper (sm_90) MLA decode for a KV head's few packed query rows (at most 32: h_q * s_q <= 32), written in Gluon.

`mla_decode_sm90` runs its packed rows in 64-row blocks, wgmma's smallest M. With 16 or 32 real rows that is 4x or
2x the tensor-core work the call needs, and on Hopper those calls are memory-bound only just: at h_q = 16 the padded
products took about 0.7 of the time the tile's bytes take to arrive (H200), and issuing one latent half of Q·Kᵀ
twice (+24% of a tile's tensor work) cost these rows 10-11% (NOTES.md, hundred-and-twentieth session). This kernel
puts the keys on M instead (the products transposed, "swap AB"):
    Sᵀ (64 keys x NQ rows)  = K (64 x 576) · Qᵀ           NQ = 16 or 32, the rows rounded up
    Oᵀ (512 x NQ)          += Vᵀ (512 x 64) · Pᵀ (64 x NQ)  V = K's first 512 columns, read in place
so a tile costs 64 x NQ x (576 + 512) multiply-adds rather than 64 x 64 x 1088. The softmax runs down Sᵀ's columns
(one per query row). One warpgroup does everything: Q·Kᵀ, softmax, P·V, and the TMA loads of the tile two ahead
into the ring slot its P·V has just freed (two 72 KB slots; Q takes NQ rows).
On H200 (b = 128, s_k 4k-16k, h_q 16 with s_q 1 or 2, h_q 32 with s_q 1) it reads 4079-4457 GB/s against the
64-row block's 3922-4097: +2.7..+9.3%, and 1.046-1.103x FlashMLA in the same process
(`benchmarks/probe_mla.py --rows-kernel`, NOTES.md hundred-and-twentieth session).

Same arguments, plan, partial layout and combine as `mla_decode_sm90_kernel`: `mla_decode_sm90._plan` chooses this
kernel for dense bf16/fp16 calls (paged, pages of a multiple of 64 keys) with a RoPE part and at most
`mla_decode_sm90.ROWS_KERNEL_MAX` packed rows, sinks or not, so a call's binding does not change with the kernel:
the gather, FP8 and second-source arguments are accepted and unused.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_init, warpgroup_mma_wait)

from ..schedule import SCHED_FIELDS as _SCHED_FIELDS
from .forward_sm90 import bar, bars, zero_rows_from
from .mla_decode_sm90 import (BLOCK_N, DT, HALF, LN2, LOG2E, STAGES, _launch_dependents, _piece, _shift)

SCHED_FIELDS = gl.constexpr(_SCHED_FIELDS)


def rows_tile(rows_per_k):
    """NQ, the kernel's query rows (wgmma's N): the packed rows rounded up to 16 or 32."""
    return 16 if rows_per_k <= 16 else 32


@gluon.jit
def _load_tile(k_lat_desc, k_rope_desc, k_lat, k_rope, k_ready, table, page_size, n, t):
    """TMA key tile t (planned keys n .. n + 63 of one page) into ring slot t % STAGES: both latent halves and the
    RoPE columns, on the slot's barrier."""
    slot = t % STAGES
    page = gl.load(table + n // page_size)
    row = n % page_size
    ready = k_ready.index(slot)
    mbarrier.expect(ready, 2 * k_lat_desc.block_type.nbytes + k_rope_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(k_lat_desc, [page, row, 0], ready,
                                    k_lat.index(2 * slot).reshape(k_lat_desc.block_type.shape))
    tma.async_copy_global_to_shared(k_lat_desc, [page, row, HALF], ready,
                                    k_lat.index(2 * slot + 1).reshape(k_lat_desc.block_type.shape))
    tma.async_copy_global_to_shared(k_rope_desc, [page, row, 0], ready,
                                    k_rope.index(slot).reshape(k_rope_desc.block_type.shape))


@gluon.jit
def _store_half(stage, o, desc, coord, dtype: gl.constexpr):
    """One 256-column half of the output rows (o: Oᵀ, 256 x NQ, already normalised) to `desc` at `coord` (a TMA
    store through the staging buffer, which holds fp32 or, reinterpreted, `dtype`)."""
    NQ: gl.constexpr = stage.shape[1]
    if dtype == gl.float32:
        buf = stage
    else:
        buf = stage._reinterpret(dtype, [1, NQ, HALF], gl.NVMMASharedLayout.get_default_for([1, NQ, HALF], dtype))
    buf.reshape([NQ, HALF]).permute((1, 0)).store(o.to(dtype))
    fence_async_shared()
    gl.thread_barrier()
    tma.async_copy_shared_to_global(desc, coord, buf)
    tma.store_wait(0)
    gl.thread_barrier()


@gluon.jit
def mla_rows_sm90_kernel(q_lat_desc, q_rope_desc, k_lat_desc, k_rope_desc, o_desc, o_part_desc, LSE, LSE_PART,
                         SCHED, SEQLENS, SPLIT_OFFSETS, SINKS, BLOCK_TABLE, KV_LAT, K_ROPE, VALID_LENS, MAX_LOGITS,
                         X_LAT, X_ROPE, X_TABLE, X_VALID,
                         batch, seqlen_q, group, rows_per_k, page_size, stride_bt, qk_scale_log2,
                         stride_lb, stride_lh, stride_ls, seq_tokens, stride_lps,
                         index_bound, stride_kp, stride_ks, stride_rp, stride_rs, stride_mb, stride_mh,
                         main_span, main_topk, x_page_size, x_bound, stride_xt, stride_xp, stride_xs, stride_xrp,
                         stride_xrs, NQ: gl.constexpr, CAUSAL: gl.constexpr, HAS_SINKS: gl.constexpr):
    """Grid: the plan's parts, one warpgroup each; a single KV head whose rows_per_k <= NQ packed rows are all
    this program's (the module docstring)."""
    _launch_dependents()
    dtype: gl.constexpr = q_lat_desc.dtype
    # Sᵀ and Oᵀ halves: keys / value columns on M (64 a warpgroup's instruction), the NQ query rows on N.
    layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, NQ, 16])
    col: gl.constexpr = gl.SliceLayout(0, layout)       # one value per query row
    key: gl.constexpr = gl.SliceLayout(1, layout)       # one value per key of a tile
    q_lat = gl.allocate_shared_memory(dtype, [2, NQ, HALF], gl.NVMMASharedLayout.get_default_for([NQ, HALF], dtype))
    q_rope = gl.allocate_shared_memory(dtype, [1, NQ, DT], gl.NVMMASharedLayout.get_default_for([NQ, DT], dtype))
    k_lat = gl.allocate_shared_memory(dtype, [2 * STAGES, BLOCK_N, HALF],
                                      gl.NVMMASharedLayout.get_default_for([BLOCK_N, HALF], dtype))
    k_rope = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, DT],
                                       gl.NVMMASharedLayout.get_default_for([BLOCK_N, DT], dtype))
    # P (NQ x 64; read transposed as P·V's B) and the output's staging (one fp32 half; bf16/fp16 reinterpreted).
    p_smem = gl.allocate_shared_memory(dtype, [1, NQ, BLOCK_N],
                                       gl.NVMMASharedLayout.get_default_for([NQ, BLOCK_N], dtype))
    stage = gl.allocate_shared_memory(gl.float32, [1, NQ, HALF],
                                      gl.NVMMASharedLayout.get_default_for([1, NQ, HALF], gl.float32))
    q_ready = bar(1)
    k_ready = bars(STAGES, 1)

    rows = gl.arange(0, NQ, layout=col)
    q_pos = rows // group
    q_head = rows % group
    live = rows < rows_per_k
    if HAS_SINKS:
        sink = gl.load(SINKS + q_head, mask=live, other=0.0)
    meta = SCHED + gl.program_id(0) * SCHED_FIELDS
    b = gl.load(meta)
    blk = gl.load(meta + 1)
    remaining = gl.load(meta + 2)
    split = gl.load(meta + 3)
    c = 0                         # key tiles so far (ring slot and barrier phase)
    w = 0                         # sequence pieces so far (Q's barrier phase)
    while (remaining > 0) & (b < batch):
        seqlen, take = _piece(SEQLENS, b, blk, remaining)
        if take > 0:
            table = BLOCK_TABLE + b.to(gl.int64) * stride_bt
            # Q (every product of the last piece has completed) and the piece's first two tiles.
            mbarrier.expect(q_ready, 2 * q_lat_desc.block_type.nbytes + q_rope_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(q_lat_desc, [b, 0, 0], q_ready,
                                            q_lat.index(0).reshape(q_lat_desc.block_type.shape))
            tma.async_copy_global_to_shared(q_lat_desc, [b, 0, HALF], q_ready,
                                            q_lat.index(1).reshape(q_lat_desc.block_type.shape))
            tma.async_copy_global_to_shared(q_rope_desc, [b, 0, 0], q_ready,
                                            q_rope.index(0).reshape(q_rope_desc.block_type.shape))
            for j in gl.static_range(STAGES):
                if j < take:
                    _load_tile(k_lat_desc, k_rope_desc, k_lat, k_rope, k_ready, table, page_size,
                               (blk + j) * BLOCK_N, c + j)
            # Causal (bottom-right): query i sees keys j <= seqlen - seqlen_q + i.
            full = seqlen
            last_visible = gl.zeros([NQ], gl.int32, col) + (seqlen - 1)
            if CAUSAL:
                full = seqlen - seqlen_q + 1
                last_visible = seqlen - seqlen_q + q_pos
            o_l = gl.zeros([HALF, NQ], gl.float32, layout)
            o_r = gl.zeros([HALF, NQ], gl.float32, layout)
            l_i = gl.zeros([NQ], gl.float32, col)
            m_i = gl.full([NQ], float("-inf"), gl.float32, col)
            mbarrier.wait(q_ready, w & 1)
            for i in range(take):
                t = c + i
                n = (blk + i) * BLOCK_N
                slot = t % STAGES
                mbarrier.wait(k_ready.index(slot), (t // STAGES) & 1)
                v_l = k_lat.index(2 * slot)
                v_r = k_lat.index(2 * slot + 1)
                # Q's and P's buffers indexed by a run-time 0 (t >> 30: tiles never number 2^30), so that the
                # compiler cannot build their wgmma descriptors once before the loop and keep them in registers
                # (as in `mla_decode_sm90._score_part`).
                opaque = t >> 30
                s = warpgroup_mma_init(gl.zeros([BLOCK_N, NQ], gl.float32, layout))
                s = warpgroup_mma(v_l, q_lat.index(opaque).permute((1, 0)), s, is_async=True)
                s = warpgroup_mma(v_r, q_lat.index(1 + opaque).permute((1, 0)), s, is_async=True)
                s = warpgroup_mma(k_rope.index(slot), q_rope.index(opaque).permute((1, 0)), s, is_async=True)
                s = warpgroup_mma_wait(0, deps=[s])
                s = s * qk_scale_log2
                if n + BLOCK_N > full:
                    k_pos = n + gl.arange(0, BLOCK_N, layout=key)
                    ok = (k_pos[:, None] < seqlen) & (k_pos[:, None] <= last_visible[None, :])
                    s = gl.where(ok, s, float("-inf"))
                    # A page may hold anything past the sequence (NaN included): zero those value rows.
                    if n + BLOCK_N > seqlen:
                        zero_rows_from(v_l, seqlen - n)
                        zero_rows_from(v_r, seqlen - n)
                m_new = gl.maximum(m_i, gl.max(s, 0))
                m_use = _shift(m_new)
                alpha = gl.exp2(m_i - m_use)
                p = gl.exp2(s - m_use[None, :])
                l_i = l_i * alpha + gl.sum(p, 0)
                m_i = m_new
                p_t = p_smem.index(opaque).permute((1, 0))
                p_t.store(p.to(dtype))
                fence_async_shared()
                gl.thread_barrier()
                o_l = o_l * alpha[None, :]
                o_r = o_r * alpha[None, :]
                o_l = warpgroup_mma(v_l.permute((1, 0)), p_t, o_l, is_async=True)
                o_r = warpgroup_mma(v_r.permute((1, 0)), p_t, o_r, is_async=True)
                o_l, o_r = warpgroup_mma_wait(0, deps=[o_l, o_r])
                gl.thread_barrier()
                if i + STAGES < take:     # the slot is free: the tile two ahead into it
                    _load_tile(k_lat_desc, k_rope_desc, k_lat, k_rope, k_ready, table, page_size,
                               n + STAGES * BLOCK_N, t + STAGES)
            c += take

            empty = l_i == 0.0
            inv = gl.where(empty, 0.0, 1.0 / gl.where(empty, 1.0, l_i))
            lse2 = m_i + gl.log2(gl.where(empty, 1.0, l_i))        # log2 units
            if (blk == 0) & (take == gl.cdiv(seqlen, BLOCK_N)):
                # The whole sequence: final output. FlashMLA's convention for a row with no key: LSE +inf.
                lse = gl.where(empty, float("inf"), lse2 * LN2)
                if HAS_SINKS:
                    inv = inv * gl.where(empty, 1.0, 1.0 / (1.0 + gl.exp2((sink - gl.where(empty, 0.0, lse)) * LOG2E)))
                _store_half(stage, o_l * inv[None, :], o_desc, [b, 0, 0], dtype)
                _store_half(stage, o_r * inv[None, :], o_desc, [b, 0, HALF], dtype)
                # seq_tokens > 1: b is a query token of a flattened (batch, s_q) call (its s_q = 1)
                gl.store(LSE + (b // seq_tokens).to(gl.int64) * stride_lb + q_head * stride_lh
                         + (b % seq_tokens + q_pos) * stride_ls, lse, mask=live)
            else:
                # A piece: an fp32 partial at this batch's split slot; an empty piece has LSE -inf (weight 0).
                lse = gl.where(empty, float("-inf"), lse2 * LN2)
                slot = gl.load(SPLIT_OFFSETS + b) + split
                _store_half(stage, o_l * inv[None, :], o_part_desc, [slot, 0, 0], gl.float32)
                _store_half(stage, o_r * inv[None, :], o_part_desc, [slot, 0, HALF], gl.float32)
                gl.store(LSE_PART + slot.to(gl.int64) * stride_lps + rows, lse, mask=live)
            w += 1
        remaining -= gl.maximum(take, 0)
        b += 1
        blk = 0
        split = 0
