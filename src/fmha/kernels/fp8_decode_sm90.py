"""Hopper (sm_90) decode over an FP8 (e4m3) KV cache with 33-64 packed query rows a KV head, written in Gluon.

Speculative decoding's few tokens of a GQA group (8 tokens of 8 heads), or one token of 33-64 heads a KV head, pack
into one 64-row wgmma tile. The portable kernel's 64-row form runs each key tile as one serial chain (its FP8 loads,
the widening to fp16 through registers and back to shared memory, Q·Kᵀ, the softmax, P·V) at two programs an SM, and
read 0.46 of the cache's bandwidth, no faster than a bf16 cache (NOTES.md, ninety-seventh and ninety-eighth sessions).
This kernel splits the chain over the partitions of one persistent program an SM:
* a producer warp: TMA loads of each key tile's FP8 K and V into a ring of RAW_STAGES raw slots (a paged cache: one
  box a page piece, from the block table), tiles ahead of the others;
* a widener warpgroup: each raw tile to fp16 in a ring of W_STAGES K and V slots in wgmma's layout (every e4m3
  value is an fp16 value: one conversion a pair), V's rows past the sequence's length zeroed (they may hold NaN);
* the consumer warpgroup (the default partition): the 64 rows of one KV head's query heads (row r: token
  r // group, head r % group), Q·Kᵀ and P·V on wgmma, each tile's Q·Kᵀ issued with the previous tile's P·V, the
  softmax of the one while the other runs.
Work items are (batch, KV head, split), round-robin over the programs. `splits` > 1 cuts each sequence's key tiles
into that many runs, whose (out, lse) go to fp32 parts that `combine` merges. The math is the portable kernel's FP8
path: q scaled by a power of two into fp16's range (exact; the scale undoes it), the (batch, KV head) descales on
the scores and the output, fp32 accumulation.

`forward.attention_forward` sends it the calls `supported` accepts; the portable kernel runs the rest. Measured on
the H200 through the API, this kernel against the portable one in one process, 8 KV heads, GB/s of FP8 bytes
(`benchmarks/results/history/fp8_gluon_decode_landed_h200_a94c6b4.json`, `experiments/fp8_gluon_decode.py time`):
d = 128, every case ahead, 1.20-1.50x (b = 64 at 4k keys, one token of 512 query heads: page 64 2501 / 2089,
contiguous 2529 / 2008, page 16 2434 / 1979; 8 and 5 causal tokens of a group of 8, page 64, 1.23x / 1.25x;
b = 16 1.50x, b = 4 at 16k 1.31x, b = 4 and 1 at 128k split as planned 1.21x / 1.25x, b = 8 at 32k contiguous
1.31x); d = 256 1.17-1.45x (contiguous 1.17x); d = 64 paged 1.06-1.08x. d = 64 contiguous was behind in every form
tried (0.93x at e295c0f) and stays with the portable kernel. A second consumer warpgroup on alternate tiles was
slower than one (2027 against 2367, page 64; `history/fp8_gluon_decode_h200_342f4f2.json`, the experiment's kernel
at 342f4f2), and so were two widener warpgroups (`history/fp8_gluon_sweep_wideners_h200_6b0c633.json`).
The caches are read through 3-D TMA views over their own strides, so engines' layouts (FlashInfer's NHD pages with
K and V side by side, its heads-major HND pages) run here too, at the plain caches' speed (0.998-1.016x) and
1.05-1.52x the portable kernel that took them before (`history/fp8_gluon_layouts_h200_ee180bc.json`,
`experiments/fp8_gluon_decode.py layouts`).
"""
from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)

from ..schedule import num_sms, plan_num_splits
from .combine import combine
from .forward_sm90 import LN2, LOG2E, ROWS, bars, tma_view      # ROWS: packed query rows a work item, one wgmma tile
from .launch import launch
from .sm90 import descriptor, offsets_64, on_hopper

# (BLOCK_N, RAW_STAGES, W_STAGES, CH) by head dim: 227 KB of shared memory hold Q (64 x d fp16), RAW_STAGES raw K
# and V tiles (BLOCK_N x d bytes each) and W_STAGES widened ones (twice that): 180 / 221 / 194 KB. CH: the rows the
# widener converts at a time. Triton's membar puts a CTA barrier between its chunk stores into one slot (it does not
# tell disjoint slices of one buffer apart), so fewer chunks wait less; the whole tile at once, one long dependency
# chain, was slower. Measured on the H200 (history/fp8_gluon_sweep{,_ch,_paired}_h200_*.json, NOTES.md; GB/s of FP8
# bytes, b = 64, 4k keys): d = 128 CH 32 / 64 / 128 2267 / 2332 / 2231 (one token of 512 heads, page 64) and 2217 /
# 2299 / 2224 (8 causal tokens of 8); d = 64 1902 / 1914 / 1814; d = 256 (64, 3, 1) against (32, 6, 2) 1953 / 2023
# paged and 1897 / 2035 contiguous (the portable kernel 1929 there). The raw K and V tiles loaded whole together and
# stored one slot at a time (at b7b97bd) were 2-6% slower at d = 64 / 128 and 1.5% faster at d = 256.
CONFIGS = {64: (128, 4, 3, 64), 128: (128, 2, 2, 64), 256: (32, 6, 2, 32)}
WIDEN_REGS, PRODUCER_REGS = 160, 40     # the consumer has what these leave of 3 x 128 registers a thread


@gluon.jit
def _item(t, n_hk, n_splits, SEQLENS, BLOCK_N: gl.constexpr):
    """Work item t: (batch, KV head, split, key count, first key tile, key tiles). Split sp of n_splits takes the
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
              n_splits, stride_kh, stride_vh, page_size, BLOCK_N: gl.constexpr, RAW_STAGES: gl.constexpr,
              PAGED: gl.constexpr):
    """Every key tile of this program's items, K and V, into the raw ring, BLOCK_N // BOX TMA boxes each, from the
    caches' 3-D views (TMA batch = page or sequence, row, columns; KV head hk from column hk * stride_kh / _vh); a
    paged cache's boxes from the pages the block table names. Past a sequence's last page the last page again: its
    rows are past the length (masked, and zeroed in V), and no block-table entry past the sequence's is read."""
    BOX: gl.constexpr = k_desc.block_type.shape[1]
    D: gl.constexpr = k_desc.block_type.shape[2]
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
                tb = b
                row = key
                if PAGED:
                    page = gl.minimum(key // page_size, last_page)
                    tb = gl.load(BLOCK_TABLE + b * stride_bt + page)
                    row = key - page * page_size
                k_dst = raw_k.index(slot).reshape([1, BLOCK_N, D])
                v_dst = raw_v.index(slot).reshape([1, BLOCK_N, D])
                if BOXES > 1:
                    k_dst = k_dst.slice(r * BOX, BOX, dim=1)
                    v_dst = v_dst.slice(r * BOX, BOX, dim=1)
                tma.async_copy_global_to_shared(k_desc, [tb, row, hk * stride_kh], raw_ready.index(slot), k_dst)
                tma.async_copy_global_to_shared(v_desc, [tb, row, hk * stride_vh], raw_ready.index(slot), v_dst)
            c += 1


@gluon.jit
def _widen(src, dst, first_key, tail, ZERO_TAIL: gl.constexpr, CH: gl.constexpr):
    """The raw FP8 tile `src` into the fp16 slot `dst`, CH rows at a time. ZERO_TAIL: rows at or past key `tail`
    (this tile's first key being first_key) as zeros, in the one tile that reaches past it (the selects of 16-bit
    halves cost ~300 instructions a warp a 128-key tile)."""
    if ZERO_TAIL:
        if first_key + src.shape[0] > tail:
            _widen_rows(src, dst, first_key, tail, True, CH)
        else:
            _widen_rows(src, dst, first_key, tail, False, CH)
    else:
        _widen_rows(src, dst, first_key, tail, False, CH)


@gluon.constexpr_function
def widen_layout(d):
    """The widener's registers: 8 bytes of a key's row a thread, so that each quarter warp's 16-byte stores fill
    the 32 banks once in the fp16 slot's 128-byte swizzle (16 a thread stored two-way conflicts at d = 128 and 256:
    `gl.bank_conflicts`, test_compile_sm90) and each half warp's loads 128 bytes of raw rows. On the H200, against the
    portable kernel in one process, one token of 512 heads, page 64 (history/fp8_gluon_decode_landed_h200_{b7b97bd,
    a94c6b4}.json): d = 128 1.137x -> 1.197x, d = 256 1.445x; d = 64 (conflict-free either way) 1.082x -> 1.065x."""
    across = min(d // 8, 32)
    return gl.BlockedLayout([1, 8], [32 // across, across], [4, 1], [1, 0])


@gluon.jit
def _widen_rows(src, dst, first_key, tail, ZERO: gl.constexpr, CH: gl.constexpr):
    layout: gl.constexpr = widen_layout(src.shape[1])
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
    """Fold key tile i's raw scores into (m_i, l_i) in the log2 domain (`scale`: the softmax scale times log2(e),
    with q's power of two and k's descale folded in). masked: keys past each row's `last_key` (its last visible key)
    to -inf, which also removes the NaN of a cache's slots past the length.
    `forward_sm90._softmax_tile` with its options off computes the same, bit for bit, but this kernel ran 1.1-1.8%
    slower with it on the H200 at d = 128 without causality (one token of 512 heads, 4k keys, page 64 and
    contiguous; `experiments/mend_ab.py`, `history/mend_ab*_h200_7d0dc4f.json`; without it level,
    `history/mend_ab_fp8_h200x2_24bcdcb.json`): its row bounds are per tile."""
    if masked:
        cols = i * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
        s = gl.where(cols[None, :] <= last_key[:, None], s, float("-inf"))
    m_new = gl.maximum(m_i, gl.max(s, 1) * scale)
    m_use = gl.where(m_new == float("-inf"), 0.0, m_new)
    p = gl.exp2(s * scale - m_use[:, None])
    alpha = gl.exp2(m_i - m_use)
    return p, m_new, l_i * alpha + gl.sum(p, 1), alpha


@gluon.jit
def _descale(DESCALE, at):
    """A (batch, KV head) descale, 1 where the call gave none."""
    if DESCALE is None:
        x = 1.0
    else:
        x = gl.load(DESCALE + at)
    return x


@gluon.jit
def _consumer(q_smem, k_smem, v_smem, k_ready, k_empty, v_ready, v_empty, Q, O, LSE, SEQLENS, K_DESCALE, V_DESCALE,
              n_items, n_hk, n_splits, group, seqlen_q, stride_qb, stride_qs, stride_qh, stride_osp, stride_ob,
              stride_os, stride_oh, stride_lsp, stride_lb, stride_lh, stride_ls, qk_scale_log2,
              BLOCK_N: gl.constexpr, W_STAGES: gl.constexpr, CAUSAL: gl.constexpr, OFFSETS_64: gl.constexpr):
    """One item at a time: its 64 rows (row r: token r // group, query head hk * group + r % group) over the item's
    key tiles, S_i issued with the P·V of tile i - 1 and the softmax of S_i run while that P·V does; then the output
    and LSE of the rows that exist (a row with no key: 0 and -inf). OFFSETS_64: q, the output or the LSE reach
    past 2^31 elements (a caller's view, or a forced split's parts), so the batch's and the split's offsets are
    64-bit (else 32: the budget of this partition's registers)."""
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
    for t in range(gl.program_id(0), n_items, gl.num_programs(0)):
        b, hk, sp, sk, lo, n_tiles = _item(t, n_hk, n_splits, SEQLENS, BLOCK_N)
        if OFFSETS_64:
            b = b.to(gl.int64)
            sp = sp.to(gl.int64)
        head = hk * group + rows % group
        q = gl.load(Q + b * stride_qb + tok[:, None] * stride_qs + head[:, None] * stride_qh + cols[None, :],
                    mask=row_ok[:, None], other=0.0).to(gl.float32)
        # q into fp16 scaled by 2^(14 - ceil(log2 max|q|)), exact (the scale undoes it): a bf16 q past fp16's range
        # or below its normals keeps its precision.
        bits = gl.max(gl.max(gl.abs(q), 1), 0).to(gl.int32, bitcast=True)
        q_exp = ((bits >> 23) & 0xFF) - 127 + ((bits & 0x7FFFFF) != 0).to(gl.int32)
        q_mul = gl.exp2((14 - gl.maximum(q_exp, -100)).to(gl.float32))
        gl.thread_barrier()       # every warp's wgmma of the last item done with q_smem
        q_smem.store((q * q_mul).to(gl.float16))
        fence_async_shared()
        gl.thread_barrier()
        at = b * n_hk + hk
        scale = qk_scale_log2 / q_mul * _descale(K_DESCALE, at)
        v_scale = _descale(V_DESCALE, at)
        if CAUSAL:                # bottom-right: token j of seqlen_q sees keys up to sk - seqlen_q + j
            last_key = sk - seqlen_q + tok_s
            mask_from = gl.maximum(sk - seqlen_q + 1, 0) // BLOCK_N
        else:
            last_key = sk - 1 + tok_s * 0
            mask_from = sk // BLOCK_N
        acc = gl.zeros([ROWS, D], gl.float32, o_layout)
        m_i = gl.full([ROWS], float("-inf"), gl.float32, row_s)
        l_i = gl.zeros([ROWS], gl.float32, row_s)
        if n_tiles > 0:
            ws = c % W_STAGES
            mbarrier.wait(k_ready.index(ws), (c // W_STAGES) & 1)
            s_tok = warpgroup_mma(q_smem, k_smem.index(ws).permute((1, 0)), zero_s, use_acc=False, is_async=True)
            s = warpgroup_mma_wait(0, deps=(s_tok,))
            mbarrier.arrive(k_empty.index(ws), count=1)
            p, m_i, l_i, alpha = _softmax(s, lo, m_i, l_i, last_key, scale, lo >= mask_from, BLOCK_N, s_layout)
            for j in range(1, n_tiles):
                ci = c + j        # the rings' count; lo + j the tile's index in the sequence
                ws = ci % W_STAGES
                prev = (ci - 1) % W_STAGES
                acc = acc * gl.convert_layout(alpha, row_o)[:, None]
                p_op = gl.convert_layout(p.to(gl.float16), p_layout)
                mbarrier.wait(k_ready.index(ws), (ci // W_STAGES) & 1)
                mbarrier.wait(v_ready.index(prev), ((ci - 1) // W_STAGES) & 1)
                s_tok = warpgroup_mma(q_smem, k_smem.index(ws).permute((1, 0)), zero_s, use_acc=False,
                                      is_async=True)
                o_tok = warpgroup_mma(p_op, v_smem.index(prev), acc, is_async=True)
                s = warpgroup_mma_wait(1, deps=(s_tok,))
                mbarrier.arrive(k_empty.index(ws), count=1)
                p, m_i, l_i, alpha = _softmax(s, lo + j, m_i, l_i, last_key, scale, lo + j >= mask_from, BLOCK_N,
                                              s_layout)
                acc = warpgroup_mma_wait(0, deps=(o_tok,))
                mbarrier.arrive(v_empty.index(prev), count=1)
            cl = c + n_tiles - 1
            last = cl % W_STAGES
            acc = acc * gl.convert_layout(alpha, row_o)[:, None]
            p_op = gl.convert_layout(p.to(gl.float16), p_layout)
            mbarrier.wait(v_ready.index(last), (cl // W_STAGES) & 1)
            o_tok = warpgroup_mma(p_op, v_smem.index(last), acc, is_async=True)
            acc = warpgroup_mma_wait(0, deps=(o_tok,))
            mbarrier.arrive(v_empty.index(last), count=1)
        c += n_tiles
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
                      n_splits, group, seqlen_q, stride_kh, stride_vh, page_size, stride_qb, stride_qs, stride_qh,
                      stride_osp, stride_ob, stride_os, stride_oh, stride_lsp, stride_lb, stride_lh, stride_ls,
                      qk_scale_log2, BLOCK_N: gl.constexpr, RAW_STAGES: gl.constexpr, W_STAGES: gl.constexpr,
                      CH: gl.constexpr, PAGED: gl.constexpr, CAUSAL: gl.constexpr, WIDEN_REGS: gl.constexpr,
                      PRODUCER_REGS: gl.constexpr, OFFSETS_64: gl.constexpr = False):
    """The consumer is the default partition (4 warps), the widener (4 warps, WIDEN_REGS) and the producer (1 warp,
    PRODUCER_REGS) its workers."""
    D: gl.constexpr = k_desc.block_type.shape[2]
    raw_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, D], gl.float8e4nv)
    w_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, D], gl.float16)
    q_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([ROWS, D], gl.float16)
    raw_k = gl.allocate_shared_memory(gl.float8e4nv, [RAW_STAGES, BLOCK_N, D], raw_layout)
    raw_v = gl.allocate_shared_memory(gl.float8e4nv, [RAW_STAGES, BLOCK_N, D], raw_layout)
    k_smem = gl.allocate_shared_memory(gl.float16, [W_STAGES, BLOCK_N, D], w_layout)
    v_smem = gl.allocate_shared_memory(gl.float16, [W_STAGES, BLOCK_N, D], w_layout)
    q_smem = gl.allocate_shared_memory(gl.float16, [ROWS, D], q_layout)
    raw_ready = bars(RAW_STAGES, 1)
    raw_empty = bars(RAW_STAGES, 1)
    k_ready = bars(W_STAGES, 1)
    k_empty = bars(W_STAGES, 1)
    v_ready = bars(W_STAGES, 1)
    v_empty = bars(W_STAGES, 1)
    gl.warp_specialize([
        (_consumer, (q_smem, k_smem, v_smem, k_ready, k_empty, v_ready, v_empty, Q, O, LSE, SEQLENS, K_DESCALE,
                     V_DESCALE, n_items, n_hk, n_splits, group, seqlen_q, stride_qb, stride_qs, stride_qh, stride_osp,
                     stride_ob, stride_os, stride_oh, stride_lsp, stride_lb, stride_lh, stride_ls, qk_scale_log2,
                     BLOCK_N, W_STAGES, CAUSAL, OFFSETS_64)),
        (_widener, (raw_k, raw_v, raw_ready, raw_empty, k_smem, v_smem, k_ready, k_empty, v_ready, v_empty, SEQLENS,
                    n_items, n_hk, n_splits, BLOCK_N, RAW_STAGES, W_STAGES, CH)),
        (_producer, (k_desc, v_desc, raw_k, raw_v, raw_ready, raw_empty, SEQLENS, BLOCK_TABLE, stride_bt, n_items,
                     n_hk, n_splits, stride_kh, stride_vh, page_size, BLOCK_N, RAW_STAGES, PAGED)),
    ], [4, 1], [WIDEN_REGS, PRODUCER_REGS])


def supported(q, k, v, out, block_table, rows):
    """The caches' TMA views (`forward_sm90.tma_view`, for `fp8_decode_forward_sm90`) when this kernel runs a
    KV-cache call, else None. It runs one of `rows` packed query rows a KV head (seqlen_q x group) with no
    varlen, window, softcap, ALiBi, sinks, key starts or q descale (the caller's checks): a 16-bit q beside an e4m3
    cache of one head dim in CONFIGS on sm_90 (a contiguous cache at d = 128 / 256), 33-64 rows, caches whose
    strides TMA takes (16-byte aligned, unit last stride; pages or heads may be interleaved, as engines' kv pages
    and heads-major pages are), q and out with unit last strides, and a paged cache's pages
    whole TMA boxes of a key tile (16-key multiples that divide or are divided by its BLOCK_N: not 48)."""
    d = q.shape[-1]
    if (not 32 < rows <= ROWS or d not in CONFIGS or q.element_size() != 2 or k.dtype != torch.float8_e4m3fn
            or v.dtype != k.dtype or k.shape != v.shape or k.shape[-1] != d):
        return None
    views = tma_view(k), tma_view(v)
    if None in views or q.stride(-1) != 1 or out.stride(-1) != 1:
        return None
    if block_table is None and d == 64:
        return None               # behind the portable kernel's contiguous form there (module docstring)
    if block_table is not None:
        page, block_n = k.shape[1], CONFIGS[d][0]
        box = min(page, block_n)
        if not (page % 16 == 0 and page % box == 0 and block_n % box == 0 and block_table.stride(-1) == 1):
            return None
    return views if on_hopper(q) else None


def fp8_decode_forward_sm90(q, k, v, out, lse, cache_seqlens, block_table, k_descale, v_descale, *, causal,
                            softmax_scale, max_seqlen_k, num_splits, views=None):
    """Decode q (b, s_q, h_q, d) over FP8 caches k, v ((num_pages, page_size, h_k, d) with block_table (b, pages)
    int32, or (b, capacity, h_k, d)) of `cache_seqlens` (b,) int32 keys each into out (b, s_q, h_q, d) and lse
    (b, h_q, s_q); `supported` has accepted the call. k_descale / v_descale (b, h_k) fp32 or None. `num_splits`: 0
    planned (one wave of items over the SMs, `plan_num_splits`), else as given; the splits' parts merged by
    `combine`. `views`: k's and v's TMA views as `supported` returned them (else found here)."""
    b, s_q, h_q, d = q.shape
    h_k = k.shape[2]
    block_n, raw_stages, w_stages, ch = CONFIGS[d]
    sms = num_sms(q.device)
    if num_splits == 0:
        num_splits = plan_num_splits(b * h_k, max_seqlen_k, block_n, sms, per_sm=1)
    paged = block_table is not None
    if paged:
        page = k.shape[1]
        box, table, stride_bt = min(page, block_n), block_table, block_table.stride(0)
    else:
        page = box = block_n
        table, stride_bt = None, 0
    k_view, v_view = views or (tma_view(k), tma_view(v))
    k_desc, v_desc = descriptor(k, k_view, [1, box, d]), descriptor(v, v_view, [1, box, d])
    if num_splits > 1:
        o_parts = torch.empty(num_splits, b, s_q, h_q, d, dtype=torch.float32, device=q.device)
        lse_parts = torch.empty(num_splits, b, s_q, h_q, dtype=torch.float32, device=q.device)
        o_dst, o_strides = o_parts, o_parts.stride()[:4]
        lse_dst, lse_strides = lse_parts, [lse_parts.stride(i) for i in (0, 1, 3, 2)]
    else:
        o_dst, o_strides = out, (0, *out.stride()[:3])
        lse_dst, lse_strides = lse, (0, *lse.stride())
    n_items = b * h_k * num_splits
    args = (k_desc, v_desc, q, o_dst, lse_dst, cache_seqlens, table, k_descale, v_descale, stride_bt, n_items, h_k,
            num_splits, h_q // h_k, s_q, k.stride(2), v.stride(2), page, *q.stride()[:3], *o_strides, *lse_strides,
            softmax_scale * LOG2E)
    meta = dict(BLOCK_N=block_n, RAW_STAGES=raw_stages, W_STAGES=w_stages, CH=ch, PAGED=paged, CAUSAL=causal,
                WIDEN_REGS=WIDEN_REGS, PRODUCER_REGS=PRODUCER_REGS, num_warps=4,
                OFFSETS_64=offsets_64(q, o_dst, lse_dst))
    launch(fp8_decode_kernel, (min(n_items, sms),), args, meta)
    if num_splits > 1:
        rows = s_q * h_q
        combine(out, lse, o_parts.view(num_splits, b, rows, d), lse_parts.view(num_splits, b, rows),
                rows_per_k=rows, group=h_q, num_splits=num_splits)
