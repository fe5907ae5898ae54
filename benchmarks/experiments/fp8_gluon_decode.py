"""FP8 KV-cache decode at 33-64 packed query rows as a warp-specialised Gluon kernel (experiment).

Written in the ninety-eighth session and compiled for sm_90 on the CPU; **not yet run on a GPU** (the session's
device time was spent). Why: the package's 64-row FP8 form (`forward.py`, (64, 128, 4, 3)) reads 0.46 of an FP8
cache's bandwidth, no faster than a bf16 cache. ncu (`results/history/ncu_decode_fp8_rows64_p64_*_h200_c327e2e.txt`)
puts DRAM at 44%: each tile is one serial chain (its single-buffered FP8 loads, the widening to fp16 through
registers and back to shared memory, Q·Kᵀ, the softmax, P·V) and two programs an SM are too few to hide it;
more programs (register caps) and more buffers (one program an SM) were both slower (NOTES.md).

This form splits the chain over partitions of one persistent program an SM:
* producer (1 warp): TMA loads of each key tile's FP8 K and V into a ring of RAW_STAGES raw slots (paged: one box
  per page piece, from the block table), tiles ahead of the others;
* widener (4 warps): each raw tile to fp16 in a ring of W_STAGES K and V slots in wgmma's layout (every e4m3 value
  is an fp16 value, one conversion a pair); V rows past the sequence's length zeroed (they may hold NaN);
* CONSUMERS consumer warpgroups: the query heads of one KV head (tokens x group <= 64 rows) in one 64-row tile, Q·Kᵀ
  and P·V on wgmma, each tile's Q·Kᵀ issued with the P·V of the consumer's previous one (the prefill kernel's
  overlap). With two, consumer g takes the item's tiles g, g + 2, ... (one's softmax runs beside the other's
  products) and consumer 1 hands its (m, l, O) to consumer 0 through shared memory at the item's end.
Work items are (batch, KV head, split), round-robin over the programs; `splits` > 1 cuts each sequence's key
tiles into that many runs, whose (out, lse) an fp32 workspace takes and `fmha.merge` merges (for b x h_k under the
SM count). The math as the package's FP8 path: q scaled by a power of two into fp16's range, the
descales per (batch, KV head) on the scores and the output, fp32 accumulation.

    python3 benchmarks/experiments/fp8_gluon_decode.py compile [BN RAW W D PAGED CONSUMERS]  (CPU: sm_90 compile)
    python3 benchmarks/experiments/fp8_gluon_decode.py check-cpu                            (CPU: `emulate`)
    python3 benchmarks/experiments/fp8_gluon_decode.py check                                (GPU: vs the oracle)
    python3 benchmarks/experiments/fp8_gluon_decode.py time --out F.json                    (GPU: vs the package)
    python3 benchmarks/experiments/fp8_gluon_decode.py profile [PAGE [BN RAW W CONSUMERS]]  (GPU: for ncu)

On the GPU run each under `timeout`: a barrier phase wrong anywhere hangs the kernel rather than failing. Compiled
here (sm_90, paged, d = 128), shared memory and registers a thread (setmaxnreg):
* one consumer: (128, 2, 2) 221 KB, (128, 3, 1) 189 KB, (64, 4, 3) / (64, 6, 2) 189 KB; the consumer at 256, the
  widener 160, the producer 40; the 128-key forms spill 112-120 bytes of item-loop values (reloaded once an item,
  none in the key loop); d = 64 (128, 4, 3) 180 KB, d = 256 (64, 3, 1) 205 KB;
* two consumers: (64, 4, 3) / (64, 6, 2) 222 KB, the consumers at 208, the producer 24, the widener the rest (72);
  no spill in the consumers' key loops, one 4-byte spill and reload in the widener's.
"""
import json
import math
import os
import sys

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)

ROWS = gl.constexpr(64)
LN2 = gl.constexpr(0.6931471805599453)
LOG2E = 1.4426950408889634


@gluon.jit
def _item(t, n_hk, n_splits, SEQLENS, BLOCK_N: gl.constexpr):
    """Work item t: (batch, KV head, split, key count, first key tile, key tiles): split sp of n_splits takes the
    sp-th run of cdiv(tiles, n_splits) of the sequence's key tiles (fewer or none at the end)."""
    sp = t % n_splits
    b = t // n_splits // n_hk
    hk = t // n_splits % n_hk
    sk = gl.load(SEQLENS + b)
    tiles = gl.cdiv(sk, BLOCK_N)
    per = gl.cdiv(tiles, n_splits)
    lo = gl.minimum(sp * per, tiles)
    return b, hk, sp, sk, lo, gl.minimum(lo + per, tiles) - lo


@gluon.jit
def _producer(k_desc, v_desc, raw_k, raw_v, raw_ready, raw_empty, SEQLENS, BLOCK_TABLE, stride_bt, n_items, n_hk,
              n_splits, seq_rows, page_size, BLOCK_N: gl.constexpr, RAW_STAGES: gl.constexpr, PAGED: gl.constexpr):
    """Every key tile of this program's items, K and V, into the raw ring: BLOCK_N // box rows TMA boxes each,
    paged boxes from the page the block table names (past the last page, the last page again: rows past the end,
    masked and zeroed downstream, and no block-table entry past the sequence's is read)."""
    BOX: gl.constexpr = k_desc.block_type.shape[0]
    D: gl.constexpr = k_desc.block_type.shape[1]
    BOXES: gl.constexpr = BLOCK_N // BOX
    c = 0
    for t in range(gl.program_id(0), n_items, gl.num_programs(0)):
        b, hk, sp, sk, lo, n_tiles = _item(t, n_hk, n_splits, SEQLENS, BLOCK_N)
        last_page = gl.maximum(gl.cdiv(sk, page_size) - 1, 0)
        for i in range(lo, lo + n_tiles):
            slot = c % RAW_STAGES
            mbarrier.wait(raw_empty.index(slot), ((c // RAW_STAGES) & 1) ^ 1)
            mbarrier.expect(raw_ready.index(slot), 2 * BOXES * k_desc.block_type.nbytes)
            for r in gl.static_range(BOXES):
                key = i * BLOCK_N + r * BOX
                if PAGED:
                    page = gl.minimum(key // page_size, last_page)
                    row = gl.load(BLOCK_TABLE + b * stride_bt + page) * page_size + (key - page * page_size)
                else:
                    row = b * seq_rows + key
                tma.async_copy_global_to_shared(k_desc, [row, hk * D], raw_ready.index(slot),
                                                raw_k.index(slot).slice(r * BOX, BOX, dim=0))
                tma.async_copy_global_to_shared(v_desc, [row, hk * D], raw_ready.index(slot),
                                                raw_v.index(slot).slice(r * BOX, BOX, dim=0))
            c += 1


@gluon.jit
def _widen(src, dst, first_key, tail, ZERO_TAIL: gl.constexpr, CH: gl.constexpr):
    """The raw FP8 tile `src` into the fp16 slot `dst`, CH rows at a time; ZERO_TAIL: rows at or past key `tail`
    (this tile's first key being first_key) as zeros, in the tile that reaches past it only (the selects of
    16-bit halves cost ~300 instructions a warp a 128-key tile)."""
    if ZERO_TAIL:
        if first_key + src.shape[0] > tail:
            _widen_rows(src, dst, first_key, tail, True, CH)
        else:
            _widen_rows(src, dst, first_key, tail, False, CH)
    else:
        _widen_rows(src, dst, first_key, tail, False, CH)


@gluon.jit
def _widen_rows(src, dst, first_key, tail, ZERO: gl.constexpr, CH: gl.constexpr):
    D: gl.constexpr = src.shape[1]
    TPW_C: gl.constexpr = D // 16                  # 16 bytes a thread across a row
    layout: gl.constexpr = gl.BlockedLayout([1, 16], [32 // TPW_C, TPW_C], [4, 1], [1, 0])
    for j in gl.static_range(src.shape[0] // CH):
        x = src.slice(j * CH, CH, dim=0).load(layout).to(gl.float16)
        if ZERO:
            keys = first_key + j * CH + gl.arange(0, CH, layout=gl.SliceLayout(1, layout))
            x = gl.where((keys < tail)[:, None], x, 0.0)
        dst.slice(j * CH, CH, dim=0).store(x)


@gluon.jit
def _widener(raw_k, raw_v, raw_ready, raw_empty, k_smem, v_smem, k_ready, k_empty, v_ready, v_empty, SEQLENS, n_items,
             n_hk, n_splits, BLOCK_N: gl.constexpr, RAW_STAGES: gl.constexpr, W_STAGES: gl.constexpr, CH: gl.constexpr):
    """Each raw tile, in the producer's order, widened into the K and V slots once the consumer has freed them (K
    after its Q·Kᵀ, V after its P·V), then marked ready and its raw slot released."""
    c = 0
    for t in range(gl.program_id(0), n_items, gl.num_programs(0)):
        b, hk, sp, sk, lo, n_tiles = _item(t, n_hk, n_splits, SEQLENS, BLOCK_N)
        for i in range(lo, lo + n_tiles):
            slot = c % RAW_STAGES
            ws = c % W_STAGES
            mbarrier.wait(raw_ready.index(slot), (c // RAW_STAGES) & 1)
            mbarrier.wait(k_empty.index(ws), ((c // W_STAGES) & 1) ^ 1)
            _widen(raw_k.index(slot), k_smem.index(ws), i * BLOCK_N, sk, False, CH)
            fence_async_shared()
            gl.thread_barrier()
            mbarrier.arrive(k_ready.index(ws), count=1)
            mbarrier.wait(v_empty.index(ws), ((c // W_STAGES) & 1) ^ 1)
            _widen(raw_v.index(slot), v_smem.index(ws), i * BLOCK_N, sk, True, CH)
            fence_async_shared()
            gl.thread_barrier()
            mbarrier.arrive(v_ready.index(ws), count=1)
            mbarrier.arrive(raw_empty.index(slot), count=1)
            c += 1


@gluon.jit
def _softmax(s, i, m_i, l_i, last_key, scale, masked, BLOCK_N: gl.constexpr, s_layout: gl.constexpr):
    """Fold key tile i's raw scores into (m_i, l_i) in the log2 domain (`scale` = the softmax scale times log2(e),
    q's power of two and k's descale folded in); masked: keys past each row's `last_key` (its last visible key)
    to -inf, which also removes the NaN of a cache's slots past the length."""
    if masked:
        cols = i * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
        s = gl.where(cols[None, :] <= last_key[:, None], s, float("-inf"))
    m_new = gl.maximum(m_i, gl.max(s, 1) * scale)
    m_use = gl.where(m_new == float("-inf"), 0.0, m_new)
    p = gl.exp2(s * scale - m_use[:, None])
    alpha = gl.exp2(m_i - m_use)
    return p, m_new, l_i * alpha + gl.sum(p, 1), alpha


@gluon.jit
def _consumer(shared, G: gl.constexpr, BLOCK_N: gl.constexpr, W_STAGES: gl.constexpr, CAUSAL: gl.constexpr,
              CONSUMERS: gl.constexpr):
    """Consumer G of CONSUMERS, one item at a time: its 64 rows (row r: token r // group, query head
    hk * group + r % group) over the item's key tiles G, G + CONSUMERS, ..., S_i issued with the P·V of its previous
    tile, the softmax of S_i while that P·V runs. With two, consumer 0 reads q and writes each item's Q for both
    (q_bars, q's power of two in q_scale) and, once consumer 1 has handed over its (m, l, O) through shared memory
    (`merge`), merges and stores; each releases Q after its last Q·Kᵀ of the item. Then the output and LSE rows
    that exist (a row with no key: 0 and -inf)."""
    (q_smem, k_smem, v_smem, k_ready, k_empty, v_ready, v_empty, q_bars, merge, Q, O, LSE, SEQLENS, K_DESCALE,
     V_DESCALE, n_items, n_hk, n_splits, group, seqlen_q, stride_qb, stride_qs, stride_qh, stride_osp, stride_ob,
     stride_os, stride_oh, stride_lsp, stride_lb, stride_lh, stride_ls, qk_scale_log2) = shared
    q_ready, q_empty, q_scale = q_bars
    D: gl.constexpr = q_smem.shape[1]
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, D, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    io: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    zero_s = gl.zeros([ROWS, BLOCK_N], gl.float32, s_layout)
    rows = gl.arange(0, ROWS, layout=gl.SliceLayout(1, io))
    cols = gl.arange(0, D, layout=gl.SliceLayout(0, io))
    tok = rows // group
    row_ok = tok < seqlen_q
    tok_s = gl.arange(0, ROWS, layout=row_s) // group
    c = 0
    w = 0
    for t in range(gl.program_id(0), n_items, gl.num_programs(0)):
        b, hk, sp, sk, lo, n_tiles = _item(t, n_hk, n_splits, SEQLENS, BLOCK_N)
        head = hk * group + rows % group
        if G == 0:                # q is read by consumer 0 only; consumer 1 takes its power of two from q_scale
            q = gl.load(Q + b * stride_qb + tok[:, None] * stride_qs + head[:, None] * stride_qh + cols[None, :],
                        mask=row_ok[:, None], other=0.0).to(gl.float32)
            # q into fp16 scaled by 2^(14 - ceil(log2 max|q|)) (exact; the scale undoes it), as the package's FP8
            # path
            bits = gl.max(gl.max(gl.abs(q), 1), 0).to(gl.int32, bitcast=True)
            q_exp = ((bits >> 23) & 0xFF) - 127 + ((bits & 0x7FFFFF) != 0).to(gl.int32)
            q_mul = gl.exp2((14 - gl.maximum(q_exp, -100)).to(gl.float32))
        if CONSUMERS == 1:
            gl.thread_barrier()   # every warp's wgmma of the last item done with q_smem
            q_smem.store((q * q_mul).to(gl.float16))
            fence_async_shared()
            gl.thread_barrier()
        else:
            if G == 0:
                mbarrier.wait(q_empty.index(0), (w & 1) ^ 1)
                q_smem.store((q * q_mul).to(gl.float16))
                q_scale.store(gl.zeros([ROWS], gl.float32, row_s) + q_mul)
                fence_async_shared()
                gl.thread_barrier()
                mbarrier.arrive(q_ready.index(0), count=1)
            mbarrier.wait(q_ready.index(0), w & 1)
            if G == 1:            # read before this consumer's first Q·Kᵀ, so before it frees Q (q_empty)
                q_mul = gl.max(q_scale.load(row_s), 0)
        at = b * n_hk + hk
        scale = qk_scale_log2 / q_mul * gl.load(K_DESCALE + at)
        v_scale = gl.load(V_DESCALE + at)
        if CAUSAL:                # bottom-right: token j of seqlen_q sees keys up to sk - seqlen_q + j
            last_key = sk - seqlen_q + tok_s
            mask_from = gl.maximum(sk - seqlen_q + 1, 0) // BLOCK_N
        else:
            last_key = sk - 1 + tok_s * 0
            mask_from = sk // BLOCK_N
        acc = gl.zeros([ROWS, D], gl.float32, o_layout)
        m_i = gl.full([ROWS], float("-inf"), gl.float32, row_s)
        l_i = gl.zeros([ROWS], gl.float32, row_s)
        n_mine = (n_tiles - G + CONSUMERS - 1) // CONSUMERS       # tiles G, G + CONSUMERS, ... of n_tiles
        if n_mine > 0:
            ci = c + G
            ws = ci % W_STAGES
            mbarrier.wait(k_ready.index(ws), (ci // W_STAGES) & 1)
            s_tok = warpgroup_mma(q_smem, k_smem.index(ws).permute((1, 0)), zero_s, use_acc=False, is_async=True)
            s = warpgroup_mma_wait(0, deps=(s_tok,))
            mbarrier.arrive(k_empty.index(ws), count=1)
            if CONSUMERS > 1:
                if n_mine == 1:
                    mbarrier.arrive(q_empty.index(0), count=1)
            p, m_i, l_i, alpha = _softmax(s, lo + G, m_i, l_i, last_key, scale, lo + G >= mask_from, BLOCK_N,
                                          s_layout)
            for j in range(1, n_mine):
                ci = c + G + CONSUMERS * j        # the ring's count; i the tile's index in the sequence
                i = lo + G + CONSUMERS * j
                ws = ci % W_STAGES
                prev = (ci - CONSUMERS) % W_STAGES
                acc = acc * gl.convert_layout(alpha, row_o)[:, None]
                p_op = gl.convert_layout(p.to(gl.float16), p_layout)
                mbarrier.wait(k_ready.index(ws), (ci // W_STAGES) & 1)
                mbarrier.wait(v_ready.index(prev), ((ci - CONSUMERS) // W_STAGES) & 1)
                s_tok = warpgroup_mma(q_smem, k_smem.index(ws).permute((1, 0)), zero_s, use_acc=False,
                                      is_async=True)
                o_tok = warpgroup_mma(p_op, v_smem.index(prev), acc, is_async=True)
                s = warpgroup_mma_wait(1, deps=(s_tok,))
                mbarrier.arrive(k_empty.index(ws), count=1)
                if CONSUMERS > 1:
                    if j == n_mine - 1:
                        mbarrier.arrive(q_empty.index(0), count=1)
                p, m_i, l_i, alpha = _softmax(s, i, m_i, l_i, last_key, scale, i >= mask_from, BLOCK_N, s_layout)
                acc = warpgroup_mma_wait(0, deps=(o_tok,))
                mbarrier.arrive(v_empty.index(prev), count=1)
            cl = c + G + CONSUMERS * (n_mine - 1)
            last = cl % W_STAGES
            acc = acc * gl.convert_layout(alpha, row_o)[:, None]
            p_op = gl.convert_layout(p.to(gl.float16), p_layout)
            mbarrier.wait(v_ready.index(last), (cl // W_STAGES) & 1)
            o_tok = warpgroup_mma(p_op, v_smem.index(last), acc, is_async=True)
            acc = warpgroup_mma_wait(0, deps=(o_tok,))
            mbarrier.arrive(v_empty.index(last), count=1)
        elif CONSUMERS > 1:       # no tile of this item: Q released at once
            mbarrier.arrive(q_empty.index(0), count=1)
        c += n_tiles
        if CONSUMERS > 1:         # consumer 1's (m, l, O) to consumer 0 through shared memory
            m_acc, m_buf, l_buf, merge_ready, merge_free = merge
            if G == 1:
                mbarrier.wait(merge_free.index(0), (w & 1) ^ 1)
                m_acc.store(acc)
                m_buf.store(m_i)
                l_buf.store(l_i)
                gl.thread_barrier()
                mbarrier.arrive(merge_ready.index(0), count=1)
            else:
                mbarrier.wait(merge_ready.index(0), w & 1)
                acc_1 = m_acc.load(o_layout)
                m_1 = m_buf.load(row_s)
                l_1 = l_buf.load(row_s)
                gl.thread_barrier()
                mbarrier.arrive(merge_free.index(0), count=1)
                m_new = gl.maximum(m_i, m_1)
                m_use = gl.where(m_new == float("-inf"), 0.0, m_new)
                a_0 = gl.exp2(m_i - m_use)
                a_1 = gl.exp2(m_1 - m_use)
                l_i = l_i * a_0 + l_1 * a_1
                acc = (acc * gl.convert_layout(a_0, row_o)[:, None]
                       + acc_1 * gl.convert_layout(a_1, row_o)[:, None])
                m_i = m_new
        w += 1
        if G == 0:
            empty = l_i == 0.0
            lse = gl.where(empty, float("-inf"), (m_i + gl.log2(gl.where(empty, 1.0, l_i))) * LN2)
            inv_l = gl.convert_layout(v_scale / gl.where(empty, 1.0, l_i), row_o)
            out = gl.convert_layout((acc * inv_l[:, None]).to(O.dtype.element_ty), io)
            gl.store(O + sp * stride_osp + b * stride_ob + tok[:, None] * stride_os + head[:, None] * stride_oh
                     + cols[None, :], out, mask=row_ok[:, None])
            lse_io = gl.convert_layout(lse, gl.SliceLayout(1, io))
            gl.store(LSE + sp * stride_lsp + b * stride_lb + head * stride_lh + tok * stride_ls, lse_io, mask=row_ok)


@gluon.jit
def fp8_decode_kernel(k_desc, v_desc, Q, O, LSE, SEQLENS, BLOCK_TABLE, K_DESCALE, V_DESCALE, stride_bt, n_items, n_hk,
                      n_splits, group, seqlen_q, seq_rows, page_size, stride_qb, stride_qs, stride_qh, stride_osp,
                      stride_ob, stride_os, stride_oh, stride_lsp, stride_lb, stride_lh, stride_ls, qk_scale_log2,
                      BLOCK_N: gl.constexpr, RAW_STAGES: gl.constexpr, W_STAGES: gl.constexpr, CH: gl.constexpr,
                      PAGED: gl.constexpr, CAUSAL: gl.constexpr, CONSUMERS: gl.constexpr,
                      CONSUMER_REGS: gl.constexpr, WIDEN_REGS: gl.constexpr, PRODUCER_REGS: gl.constexpr):
    """CONSUMERS = 1: the consumer is the default partition, the widener (WIDEN_REGS) and the producer
    (PRODUCER_REGS) workers; 3 warpgroups. CONSUMERS = 2: the widener is the default partition (with what the
    others leave of 4 x 128 registers), the two consumers (CONSUMER_REGS) and the producer workers."""
    D: gl.constexpr = k_desc.block_type.shape[1]
    raw_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, D], gl.float8e4nv)
    w_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, D], gl.float16)
    q_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([ROWS, D], gl.float16)
    raw_k = gl.allocate_shared_memory(gl.float8e4nv, [RAW_STAGES, BLOCK_N, D], raw_layout)
    raw_v = gl.allocate_shared_memory(gl.float8e4nv, [RAW_STAGES, BLOCK_N, D], raw_layout)
    k_smem = gl.allocate_shared_memory(gl.float16, [W_STAGES, BLOCK_N, D], w_layout)
    v_smem = gl.allocate_shared_memory(gl.float16, [W_STAGES, BLOCK_N, D], w_layout)
    q_smem = gl.allocate_shared_memory(gl.float16, [ROWS, D], q_layout)
    raw_ready = gl.allocate_shared_memory(gl.int64, [RAW_STAGES, 1], mbarrier.MBarrierLayout())
    raw_empty = gl.allocate_shared_memory(gl.int64, [RAW_STAGES, 1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [W_STAGES, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [W_STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [W_STAGES, 1], mbarrier.MBarrierLayout())
    v_empty = gl.allocate_shared_memory(gl.int64, [W_STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(RAW_STAGES):
        mbarrier.init(raw_ready.index(i), count=1)
        mbarrier.init(raw_empty.index(i), count=1)
    for i in gl.static_range(W_STAGES):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(k_empty.index(i), count=1)
        mbarrier.init(v_ready.index(i), count=1)
        mbarrier.init(v_empty.index(i), count=1)
    if CONSUMERS > 1:
        flat: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
        vec: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
        q_ready = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
        q_empty = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
        merge_ready = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
        merge_free = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
        mbarrier.init(q_ready.index(0), count=1)
        mbarrier.init(q_empty.index(0), count=CONSUMERS)
        mbarrier.init(merge_ready.index(0), count=1)
        mbarrier.init(merge_free.index(0), count=1)
        merge = (gl.allocate_shared_memory(gl.float32, [ROWS, D], flat),
                 gl.allocate_shared_memory(gl.float32, [ROWS], vec), gl.allocate_shared_memory(gl.float32, [ROWS], vec),
                 merge_ready, merge_free)
        q_bars = (q_ready, q_empty, gl.allocate_shared_memory(gl.float32, [ROWS], vec))
    else:                         # unused stand-ins: a tuple holds no None
        merge = (k_ready, k_ready, k_ready, k_ready, k_ready)
        q_bars = (k_ready, k_ready, k_ready)
    shared = (q_smem, k_smem, v_smem, k_ready, k_empty, v_ready, v_empty, q_bars, merge, Q, O, LSE, SEQLENS, K_DESCALE,
              V_DESCALE, n_items, n_hk, n_splits, group, seqlen_q, stride_qb, stride_qs, stride_qh, stride_osp,
              stride_ob, stride_os, stride_oh, stride_lsp, stride_lb, stride_lh, stride_ls, qk_scale_log2)
    if CONSUMERS == 1:
        gl.warp_specialize([
            (_consumer, (shared, 0, BLOCK_N, W_STAGES, CAUSAL, CONSUMERS)),
            (_widener, (raw_k, raw_v, raw_ready, raw_empty, k_smem, v_smem, k_ready, k_empty, v_ready, v_empty,
                        SEQLENS, n_items, n_hk, n_splits, BLOCK_N, RAW_STAGES, W_STAGES, CH)),
            (_producer, (k_desc, v_desc, raw_k, raw_v, raw_ready, raw_empty, SEQLENS, BLOCK_TABLE, stride_bt, n_items,
                         n_hk, n_splits, seq_rows, page_size, BLOCK_N, RAW_STAGES, PAGED)),
        ], [4, 1], [WIDEN_REGS, PRODUCER_REGS])
    else:
        gl.warp_specialize([
            (_widener, (raw_k, raw_v, raw_ready, raw_empty, k_smem, v_smem, k_ready, k_empty, v_ready, v_empty,
                        SEQLENS, n_items, n_hk, n_splits, BLOCK_N, RAW_STAGES, W_STAGES, CH)),
            (_consumer, (shared, 0, BLOCK_N, W_STAGES, CAUSAL, CONSUMERS)),
            (_consumer, (shared, 1, BLOCK_N, W_STAGES, CAUSAL, CONSUMERS)),
            (_producer, (k_desc, v_desc, raw_k, raw_v, raw_ready, raw_empty, SEQLENS, BLOCK_TABLE, stride_bt, n_items,
                         n_hk, n_splits, seq_rows, page_size, BLOCK_N, RAW_STAGES, PAGED)),
        ], [4, 4, 1], [CONSUMER_REGS, CONSUMER_REGS, PRODUCER_REGS])


# (BLOCK_N, RAW_STAGES, W_STAGES, CONSUMERS) by head dim: 227 KB of shared memory hold Q (64 x d fp16), RAW_STAGES
# raw K and V tiles (BLOCK_N x d bytes each), W_STAGES widened ones (twice that), and with two consumers the merge
# buffer (64 x d fp32). Two consumers need W_STAGES >= 2: with one slot, the widener's V_c waits for V_{c-1}, which
# the other consumer frees only with its next tile's Q·Kᵀ, whose K the widener writes after V_c
# (`fp8_gluon_decode_protocol.py` simulates the barriers: clean at W_STAGES >= 2, deadlocks or early passes at 1).
CONFIGS = {64: (128, 4, 3, 1), 128: (128, 2, 2, 1), 256: (64, 3, 1, 1)}
# registers a thread: (consumer, widener, producer) by CONSUMERS; the default partition (the consumer with one, the
# widener with two) has what the others leave of 128 x the warpgroups (3 or 4), which `compile` reports
REGS = {1: (None, 160, 40), 2: (208, None, 24)}


def fp8_decode(q, k_cache, v_cache, cache_seqlens, k_descale, v_descale, block_table=None, causal=True,
               softmax_scale=None, config=None, ch=32, splits=1):
    """(out, lse) of one decode step over an FP8 cache: q (b, s_q, h_q, d) bf16 / fp16 with s_q x (h_q / h_k) <= 64,
    caches (num_blocks, page, h_k, d) with block_table, or (b, max_len, h_k, d); descales (b, h_k) fp32. splits > 1:
    each sequence's key tiles in that many runs, each item's (out, lse) into an fp32 workspace, merged by
    `fmha.merge.merge_attention_states_list` (a second launch; the package's combine kernel would take its place)."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    b, s_q, h_q, d = q.shape
    h_k = k_cache.shape[2]
    group = h_q // h_k
    assert s_q * group <= 64 and k_cache.is_contiguous() and v_cache.is_contiguous()
    block_n, raw_stages, w_stages, consumers = config or CONFIGS[d]
    assert consumers == 1 or w_stages >= 2
    paged = block_table is not None
    if paged:
        page = k_cache.shape[1]
        box = min(page, block_n)
        assert page % box == 0 and block_n % box == 0
        seq_rows, table, stride_bt = 0, block_table, block_table.stride(0)
    else:
        page = block_n
        box = block_n
        seq_rows, table, stride_bt = k_cache.shape[1], cache_seqlens, 0
    rows = k_cache.shape[0] * k_cache.shape[1]
    layout = gl.NVMMASharedLayout.get_default_for([box, d], gl.float8e4nv)
    k_desc = TensorDescriptor(k_cache, [rows, h_k * d], [h_k * d, 1], [box, d], layout)
    v_desc = TensorDescriptor(v_cache, [rows, h_k * d], [h_k * d, 1], [box, d], layout)
    if splits > 1:
        out = torch.empty(splits, b, s_q, h_q, d, device=q.device, dtype=torch.float32)
        lse = torch.empty(splits, b, h_q, s_q, device=q.device, dtype=torch.float32)
    else:
        out = torch.empty_like(q)[None]
        lse = torch.empty(1, b, h_q, s_q, device=q.device, dtype=torch.float32)
    scale = (softmax_scale if softmax_scale is not None else d ** -0.5) * LOG2E
    n_items = b * h_k * splits
    grid = (min(n_items, torch.cuda.get_device_properties(q.device).multi_processor_count),)
    fp8_decode_kernel[grid](k_desc, v_desc, q, out, lse, cache_seqlens, table, k_descale.contiguous(),
                            v_descale.contiguous(), stride_bt, n_items, h_k, splits, group, s_q, seq_rows, page,
                            q.stride(0), q.stride(1), q.stride(2), *out.stride()[:4], *lse.stride(), scale,
                            BLOCK_N=block_n, RAW_STAGES=raw_stages, W_STAGES=w_stages, CH=ch, PAGED=paged,
                            CAUSAL=causal, CONSUMERS=consumers, CONSUMER_REGS=REGS[consumers][0],
                            WIDEN_REGS=REGS[consumers][1], PRODUCER_REGS=REGS[consumers][2], num_warps=4)
    if splits == 1:
        return out[0], lse[0]
    from fmha.merge import merge_attention_states_list

    o, l_ = merge_attention_states_list(list(out), [x.transpose(1, 2) for x in lse])
    return o.to(q.dtype), l_.transpose(1, 2)


def emulate(q, k, v, cache_seqlens, k_descale, v_descale, causal=True, softmax_scale=None, config=None, splits=1):
    """The kernel's arithmetic in torch on the CPU, tile by tile (no GPU needed): the packed rows, q's power of two
    and fp16 rounding, fp16 K / V / P into fp32 products, K's rows past the length NaN and V's zeroed (as the cache
    and the widener leave them), the masked tiles, each split's run of tiles, each consumer's tiles and the two
    consumers' merge, then the splits' merge as `fp8_decode` does it. Contiguous caches (paging only moves rows).
    Returns (out, lse) as `fp8_decode`."""
    b, s_q, h_q, d = q.shape
    h_k = k.shape[2]
    group = h_q // h_k
    block_n, _, _, consumers = config or CONFIGS[d]
    scale_log2 = (softmax_scale if softmax_scale is not None else d ** -0.5) * LOG2E
    out = torch.zeros(splits, b, s_q, h_q, d)
    lse = torch.full((splits, b, h_q, s_q), float("-inf"))
    r = torch.arange(64)
    tok, within = r // group, r % group
    ok = tok < s_q
    for bi in range(b):
        sk = int(cache_seqlens[bi])
        n_tiles = -(-sk // block_n)
        per = -(-n_tiles // splits)
        keys = torch.arange(n_tiles * block_n)
        kk = torch.full((n_tiles * block_n, d), float("nan"))
        vv = torch.zeros(n_tiles * block_n, d)
        for hk in range(h_k):
            kk[:sk] = k[bi, :sk, hk].float()
            vv[:sk] = v[bi, :sk, hk].float()
            qr = torch.zeros(64, d)
            qr[ok] = q[bi, tok[ok], hk * group + within[ok]].float()
            bits = qr.abs().max().view(torch.int32).item()
            q_exp = ((bits >> 23) & 0xFF) - 127 + int((bits & 0x7FFFFF) != 0)
            q_mul = 2.0 ** (14 - max(q_exp, -100))
            qh = (qr * q_mul).half().float()
            scale = scale_log2 / q_mul * float(k_descale[bi, hk])
            if causal:
                last_key = sk - s_q + tok
                mask_from = max(sk - s_q + 1, 0) // block_n
            else:
                last_key = torch.full((64,), sk - 1)
                mask_from = sk // block_n
            for sp in range(splits):
                lo = min(sp * per, n_tiles)
                hi = min(lo + per, n_tiles)
                parts = []
                for g in range(consumers):
                    m = torch.full((64,), float("-inf"))
                    ll = torch.zeros(64)
                    acc = torch.zeros(64, d)
                    for i in range(lo + g, hi, consumers):
                        cols = keys[i * block_n:(i + 1) * block_n]
                        sc = qh @ kk[cols].half().float().T
                        if i >= mask_from:
                            sc = torch.where(cols[None, :] <= last_key[:, None], sc, float("-inf"))
                        m_new = torch.maximum(m, sc.max(1).values * scale)
                        m_use = torch.where(m_new == float("-inf"), 0.0, m_new)
                        p = torch.exp2(sc * scale - m_use[:, None])
                        alpha = torch.exp2(m - m_use)
                        ll = ll * alpha + p.sum(1)
                        acc = acc * alpha[:, None] + p.half().float() @ vv[cols].half().float()
                        m = m_new
                    parts.append((m, ll, acc))
                m, ll, acc = parts[0]
                if consumers > 1:
                    m_1, l_1, acc_1 = parts[1]
                    m_new = torch.maximum(m, m_1)
                    m_use = torch.where(m_new == float("-inf"), 0.0, m_new)
                    a_0, a_1 = torch.exp2(m - m_use), torch.exp2(m_1 - m_use)
                    ll = ll * a_0 + l_1 * a_1
                    acc = acc * a_0[:, None] + acc_1 * a_1[:, None]
                    m = m_new
                empty = ll == 0
                row_lse = torch.where(empty, float("-inf"),
                                      (m + torch.log2(torch.where(empty, 1.0, ll))) * math.log(2))
                o = acc * (float(v_descale[bi, hk]) / torch.where(empty, 1.0, ll))[:, None]
                out[sp, bi, tok[ok], hk * group + within[ok]] = o[ok]
                lse[sp, bi, hk * group + within[ok], tok[ok]] = row_lse[ok]
    if splits == 1:
        return out[0], lse[0]
    from fmha.merge import merge_attention_states_list

    o, l_ = merge_attention_states_list(list(out), [x.transpose(1, 2) for x in lse])
    return o, l_.transpose(1, 2)


def check_cpu():
    """`emulate` against `fmha.reference` on CHECK_CASES' shapes (contiguous), one consumer and two, unsplit and
    split."""
    from fmha.reference import attention_ref

    worst = 0.0
    for (b, s_q, h_q, h_k, d, lens, _, causal) in CHECK_CASES:
        q, k, v, seqlens, kd, vd, _, _, _ = _inputs(b, s_q, h_q, h_k, d, lens, None, "cpu")
        for config, splits in ((None, 1), ((64, 4, 3, 2), 1), (None, 3), ((64, 4, 3, 2), 2)):
            out, lse = emulate(q, k, v, seqlens, kd, vd, causal=causal, config=config, splits=splits)
            for i, n in enumerate(lens):
                ref, ref_lse = attention_ref(q[i:i + 1].float(), k[i:i + 1, :n].float(), v[i:i + 1, :n].float(),
                                             causal=causal, k_descale=kd[i:i + 1], v_descale=vd[i:i + 1])
                err = (out[i:i + 1] - ref).abs().max().item()
                lse_err = (lse[i:i + 1] - ref_lse).abs().nan_to_num(0.0).max().item()
                assert err < 3e-2 and lse_err < 1e-2 and torch.equal(lse[i:i + 1].isinf(), ref_lse.isinf()), (
                    b, s_q, h_q, d, lens, causal, config, splits, i, err, lse_err)
                worst = max(worst, err)
    print(json.dumps(dict(check_cpu="passed", cases=len(CHECK_CASES), max_abs_err=worst)))


def _inputs(b, s_q, h_q, h_k, d, lens, page, device="cuda"):
    """`fp8_transposed._inputs` in bf16: q, FP8 caches holding NaN past each length (paged with shuffled pages when
    page, else contiguous), lengths, descales, block table, and the contiguous FP8 keys and values for the oracle."""
    import fp8_transposed

    return fp8_transposed._inputs(b, s_q, h_q, h_k, d, lens, page, device, torch.bfloat16)


# (b, s_q, h_q, h_k, d, lengths, page or None, causal)
CHECK_CASES = [(3, 1, 64, 1, 128, [4096, 1000, 77], 64, False), (2, 8, 64, 8, 128, [300, 129], 16, True),
               (4, 2, 32, 2, 128, [128, 0, 1, 513], None, True), (2, 1, 512, 8, 128, [2048, 4000], 64, False),
               (2, 4, 16, 2, 64, [700, 64], 32, True), (2, 1, 64, 1, 256, [1000, 257], 128, False),
               (2, 8, 64, 8, 128, [5000, 33], 256, True)]


def check():
    """Every CHECK_CASES case against `fmha.reference` (fp32, the FP8 values dequantised), out and LSE."""
    from fmha.reference import attention_ref

    worst = 0.0
    for (b, s_q, h_q, h_k, d, lens, page, causal) in CHECK_CASES:
        q, kc, vc, seqlens, kd, vd, table, k, v = _inputs(b, s_q, h_q, h_k, d, lens, page)
        refs = [attention_ref(q[i:i + 1].float(), k[i:i + 1, :n].float(), v[i:i + 1, :n].float(), causal=causal,
                              k_descale=kd[i:i + 1], v_descale=vd[i:i + 1]) for i, n in enumerate(lens)]
        # one consumer, then two; and split in three where the sequences are long (d = 128)
        runs = [(None, 1)] + ([((64, 4, 3, 2), 1)] if d <= 128 else [])
        runs += [(None, 3)] if d == 128 and max(lens) >= 1000 else []
        for config, splits in runs:
            out, lse = fp8_decode(q, kc, vc, seqlens, kd, vd, table, causal=causal, config=config, splits=splits)
            torch.cuda.synchronize()
            for i, (n, (ref, ref_lse)) in enumerate(zip(lens, refs)):
                err = (out[i:i + 1].float() - ref).abs().max().item()
                lse_err = (lse[i:i + 1] - ref_lse).abs().nan_to_num(0.0).max().item()
                ok = err < 3e-2 and lse_err < 1e-2 and torch.equal(lse[i:i + 1].isinf(), ref_lse.isinf())
                print(json.dumps(dict(case=[b, s_q, h_q, h_k, d, page, causal], config=config, splits=splits, seq=i,
                                      keys=n, err=err, lse_err=lse_err, ok=ok)), flush=True)
                worst = max(worst, err)
                assert ok
    print(json.dumps(dict(check="passed", cases=len(CHECK_CASES), max_abs_err=worst)))


def time_gpu(out_path=None):
    """Configurations (BLOCK_N, RAW_STAGES, W_STAGES, CONSUMERS) against the package, GB/s of FP8 K and V bytes
    (medians of three interleaved rounds in one process), each first checked against the package's output: 8 KV
    heads, d = 128; b = 64 with 4k keys: one token of 512 query heads (probe_fp8_decode.py's cases 16 / 17: page 64
    and contiguous) and 8 causal tokens of a group of 8 (page 64); b = 4 with 128k keys, one token of 512 query
    heads, page 64, split in four (32 items x 4 on 132 SMs)."""
    import fmha
    from fmha.bench import interleaved_times

    rows = []
    h_k, d = 8, 128
    configs = ((128, 2, 2, 1), (64, 4, 3, 1), (64, 4, 3, 2))
    for b, n, s_q, h_q, causal, page, splits, cfgs in (
            (64, 4096, 1, 512, False, 64, 1, configs), (64, 4096, 1, 512, False, None, 1, configs),
            (64, 4096, 8, 64, True, 64, 1, configs), (4, 131072, 1, 512, False, 64, 4, configs[::2])):
        q, kc, vc, seqlens, kd, vd, table, k, v = _inputs(b, s_q, h_q, h_k, d, [n] * b, page)
        del k, v
        pkg = lambda: fmha.attention_with_kvcache(q, kc, vc, seqlens, block_table=table,  # noqa: E731
                                                  causal=causal, k_descale=kd, v_descale=vd)
        ref = pkg().float()
        calls = {"package": pkg}
        for cfg in cfgs:
            f = (lambda cfg=cfg: fp8_decode(q, kc, vc, seqlens, kd, vd, table, causal=causal, config=cfg,
                                            splits=splits))
            err = (f()[0].float() - ref).abs().max().item()
            name = "gluon %d,%d,%d,%d" % cfg + (f" split {splits}" if splits > 1 else "")
            if not err < 3e-2:
                rows.append(dict(b=b, keys=n, s_q=s_q, h_q=h_q, page=page, name=name, error=err))
                print(b, n, s_q, page, name, "max err", err, flush=True)
                continue
            calls[name] = f
        nbytes = 2 * b * n * h_k * d
        times = interleaved_times(calls, 3)
        for name, ts in times.items():
            t = sorted(ts)[len(ts) // 2]
            rows.append(dict(b=b, keys=n, s_q=s_q, h_q=h_q, page=page, name=name, gbps=nbytes / t / 1e9,
                             rounds=[nbytes / x / 1e9 for x in ts]))
            print(b, n, s_q, page, name, f"{nbytes / t / 1e9:.0f} GB/s", flush=True)
        if out_path:              # after every case: a timeout later keeps what ran
            json.dump(dict(gpu=torch.cuda.get_device_name(), commit=os.environ.get("FMHA_COMMIT", "unknown"),
                           h_k=h_k, d=d, rows=rows), open(out_path, "w"), indent=1)


def compile_sm90(block_n=128, raw_stages=2, w_stages=2, d=128, paged=True, consumers=1):
    """Shared memory, registers, spills and setmaxnreg of the sm_90 compile (no GPU needed)."""
    import re
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    from sm90_report import sass_and_usage

    box = 64 if paged else block_n
    layout = gl.NVMMASharedLayout.get_default_for([box, d], gl.float8e4nv)
    desc = f"tensordesc<fp8e4nv[{box},{d}],{layout!r}>"
    names = list(fp8_decode_kernel.arg_names)
    consts = dict(BLOCK_N=block_n, RAW_STAGES=raw_stages, W_STAGES=w_stages, CH=32, PAGED=bool(paged), CAUSAL=True,
                  CONSUMERS=consumers, CONSUMER_REGS=REGS[consumers][0], WIDEN_REGS=REGS[consumers][1],
                  PRODUCER_REGS=REGS[consumers][2])
    ptrs = dict(k_desc=desc, v_desc=desc, Q="*bf16", O="*bf16", LSE="*fp32", SEQLENS="*i32", BLOCK_TABLE="*i32",
                K_DESCALE="*fp32", V_DESCALE="*fp32")
    sig = {n: "constexpr" if n in consts else ptrs.get(n, "fp32" if n == "qk_scale_log2" else "i32") for n in names}
    src = GluonASTSource(fp8_decode_kernel, sig, constexprs={(names.index(k),): v for k, v in consts.items()})
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=4))
    ptx = k.asm["ptx"]
    open("/tmp/fp8_gluon_decode.ptx", "w").write(ptx)
    sass, regs, stack = sass_and_usage(k)
    open("/tmp/fp8_gluon_decode.sass", "w").write(sass)
    print(json.dumps(dict(block_n=block_n, raw_stages=raw_stages, w_stages=w_stages, d=d, paged=paged,
                          consumers=consumers, maxnreg=sorted(set(re.findall(r"setmaxnreg\.(\w+)\.sync\.aligned"
                                                                             r"\.u32\s+(\d+)", ptx))),
                          shared=k.metadata.shared, regs=regs, stack=stack,
                          wgmma=ptx.count("wgmma.mma_async"), tma=ptx.count("cp.async.bulk.tensor"),
                          setmaxnreg=ptx.count("setmaxnreg"), cvt_e4m3=ptx.count("e4m3x2"),
                          local=len(re.findall(r"\b(LDL|STL)\b", sass)))))


def profile(page=64, *config):
    """Three calls on case 16 (b = 64, one token of 512 query heads over 8, 4k keys, page 64 or 0 = contiguous) for
    ncu, the first compiling, in `config` (BLOCK_N RAW_STAGES W_STAGES CONSUMERS; default d = 128's):
    `ncu --kernel-name regex:fp8_decode --launch-skip 2 --launch-count 1 --set full --import-source yes -o R
    python3 benchmarks/experiments/fp8_gluon_decode.py profile [PAGE [BN RAW W CONSUMERS]]`."""
    config = tuple(config) or None
    q, kc, vc, seqlens, kd, vd, table, k, v = _inputs(64, 1, 512, 8, 128, [4096] * 64, page or None)
    for _ in range(3):
        fp8_decode(q, kc, vc, seqlens, kd, vd, table, causal=False, config=config)
    torch.cuda.synchronize()


if __name__ == "__main__":
    what = sys.argv[1] if len(sys.argv) > 1 else "compile"
    if what == "compile":
        compile_sm90(*map(int, sys.argv[2:8]))
    elif what == "check":
        check()
    elif what == "check-cpu":
        check_cpu()
    elif what == "profile":
        profile(*map(int, sys.argv[2:7]))
    else:
        time_gpu(sys.argv[sys.argv.index("--out") + 1] if "--out" in sys.argv else None)
