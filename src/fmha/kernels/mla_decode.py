"""MLA decode (triton.language): DeepSeek's absorbed attention over a paged latent cache, split-KV.

Shapes the kernel sees (flash_mla's, with the latent and RoPE parts as separate tensors or views):
    q_latent (b, s_q, h_q, DV), q_rope (b, s_q, h_q, DT), kv_latent (pages, page_size, h_k, DV),
    k_rope (pages, page_size, h_k, DT). The key is [latent, rope] (DV + DT = 576) and the value is the
    latent part itself, so one K tile feeds both dots: S = q·kᵀ over 576 columns, O += P·k over 512.

One program owns BLOCK_M packed query rows (row r = query position r // G, head r % G, G = h_q / h_k:
every query of a KV head shares each K tile) and one *part* of the key blocks, as cut by
`schedule.plan_mla`: a run of SCHED_BLOCK-key blocks laid end to end over the batch, so it may finish one
sequence and start the next. A sequence the part covers whole is written as final output; a piece of a
sequence is written as an fp32 partial (o, lse) that `combine.combine_kernel` merges.

The value width DV is held as two column halves (two 64 x 256 fp32 accumulators for DV = 512): a TMA box
is at most 256 columns wide, and the halves keep each wgmma's N at 256.
"""
import torch
import triton
import triton.language as tl

from ..schedule import SCHED_BLOCK, SCHED_FIELDS
from .combine import combine
from .launch import Plans, cdiv, dense, next_pow2
from .common import LN2, lse_ptrs, sink_keep
from .sm90 import gluon_enabled


@triton.jit
def _fp8_cols(row, srow, START: tl.constexpr, WIDTH: tl.constexpr, ok, FP8: tl.constexpr, DTYPE: tl.constexpr):
    """Columns START .. START + WIDTH - 1 of the keys whose value rows start at byte pointers `row` and scales at
    `srow` in an FP8 cache (`_kv_fp8.py` has the byte layouts), dequantised to DTYPE: NoPE columns are e4m3 times
    their group's scale, RoPE columns are stored bf16. Values are loaded as (rows, groups, GROUP) and scales as
    (rows, groups), one scale per group and row: compact tiles that the pipeliner can stage."""
    if FP8 == 1:         # v32: 512 e4m3 | 4 fp32 scales (groups of 128) | 64 bf16 rope
        NOPE: tl.constexpr = 512
        GROUP: tl.constexpr = 128
        ROPE_OFF: tl.constexpr = 528
    else:                # model1: 448 e4m3 | 64 bf16 rope; 7 UE8M0 scales (groups of 64) elsewhere in the page
        NOPE: tl.constexpr = 448
        GROUP: tl.constexpr = 64
        ROPE_OFF: tl.constexpr = 448
    if START >= NOPE:
        # All RoPE (v32's last 64 columns).
        cols = START - NOPE + tl.arange(0, WIDTH)
        value = tl.load((row + ROPE_OFF).to(tl.pointer_type(tl.bfloat16))[:, None] + cols[None, :],
                        mask=ok[:, None], other=0.0)
    else:
        tl.static_assert(WIDTH % GROUP == 0)
        GROUPS: tl.constexpr = WIDTH // GROUP
        g = START // GROUP + tl.arange(0, GROUPS)                   # group numbers in this column range
        cols = g[:, None] * GROUP + tl.arange(0, GROUP)[None, :]   # (GROUPS, GROUP)
        g_nope = (g * GROUP < NOPE)[None, :]
        x = tl.load(row.to(tl.pointer_type(tl.float8e4nv))[:, None, None] + cols[None, :, :],
                    mask=ok[:, None, None] & (cols < NOPE)[None, :, :], other=0.0)
        if FP8 == 1:
            scale = tl.load(srow.to(tl.pointer_type(tl.float32))[:, None] + g[None, :],
                            mask=ok[:, None] & g_nope, other=0.0)
        else:
            e = tl.load(srow[:, None] + g[None, :], mask=ok[:, None] & g_nope, other=127)
            scale = tl.exp2(e.to(tl.float32) - 127.0)
        value = x.to(tl.float32) * scale[:, :, None]
        if START + WIDTH > NOPE:
            # model1's second half ends with the RoPE columns, exactly one group wide.
            tl.static_assert(START + WIDTH - NOPE == GROUP)
            rope = tl.load((row + ROPE_OFF).to(tl.pointer_type(tl.bfloat16))[:, None] + tl.arange(0, GROUP)[None, :],
                           mask=ok[:, None], other=0.0)
            value = tl.where(g_nope[:, :, None], value, rope.to(tl.float32)[:, None, :])
        value = tl.reshape(value, [row.shape[0], WIDTH])
    return value.to(DTYPE)


@triton.jit
def _load_k(kv_lat, k_rope, lat_desc, rope_desc, bt_row, n, seqlen, kv_head, page_size, index_bound,
            stride_lp, stride_ls, stride_lh, stride_rp, stride_rs, stride_rh,
            BLOCK_N: tl.constexpr, HALF: tl.constexpr, DT: tl.constexpr, HAS_ROPE: tl.constexpr,
            MASKED: tl.constexpr, TMA: tl.constexpr, SPARSE: tl.constexpr, FP8: tl.constexpr = 0,
            DTYPE: tl.constexpr = tl.bfloat16):
    """Key tile at key `n`: latent halves (BLOCK_N, HALF) x 2, rope (BLOCK_N, DT), and which keys exist. Rows
    past `seqlen` are zero in a MASKED tile (the cache may hold anything there, NaN included, and the latent
    part is also the value: 0 * NaN would poison the output). SPARSE: `bt_row` is the query's row of token
    indices (flat positions page * page_size + slot; negative or >= `index_bound` = none) and `seqlen` its valid
    length. FP8: the cache
    holds packed FP8 rows (uint8), dequantised here to DTYPE."""
    offs_n = n + tl.arange(0, BLOCK_N)
    ok = offs_n < seqlen
    if TMA:
        # The tile lies inside one page (BLOCK_N divides page_size) of a single-KV-head cache viewed as
        # (num_blocks * page_size, d): one 2-D TMA box per half. (A 4-D box reshaped to 2-D made Triton copy the
        # tile into registers when it is wgmma's A operand, the transposed form below.)
        row = tl.load(bt_row + n // page_size) * page_size + n % page_size
        k0 = lat_desc.load([row, 0])
        k1 = lat_desc.load([row, HALF])
        kt = k0
        if HAS_ROPE:
            kt = rope_desc.load([row, 0])
        if MASKED:
            k0 = tl.where(ok[:, None], k0, 0.0)
            k1 = tl.where(ok[:, None], k1, 0.0)
            if HAS_ROPE:
                kt = tl.where(ok[:, None], kt, 0.0)
    else:
        # Gather: key j lives in page block_table[b, j // page_size], slot j % page_size.
        offs_h = tl.arange(0, HALF)
        offs_t = tl.arange(0, DT)
        if SPARSE:
            token = tl.load(bt_row + offs_n, mask=ok, other=-1)
            ok = (token >= 0) & (token < index_bound)
            token = tl.where(ok, token, 0)
            page = (token // page_size).to(tl.int64)
            slot = token % page_size
        elif MASKED:
            page = tl.load(bt_row + offs_n // page_size, mask=ok, other=0).to(tl.int64)
            slot = offs_n % page_size
        else:
            page = tl.load(bt_row + offs_n // page_size).to(tl.int64)
            slot = offs_n % page_size
        # model1 (one KV head): a page holds page_size 576-byte value rows, then 8 scale bytes per token.
        lat = kv_lat + page * stride_lp + slot * (576 if FP8 == 2 else stride_ls) + kv_head * stride_lh
        rope = lat
        if FP8 != 0:
            if FP8 == 1:
                srow = lat + 512                     # v32: the scales follow the row's values
            else:
                srow = kv_lat + page * stride_lp + page_size * 576 + slot * 8
            k0 = _fp8_cols(lat, srow, 0, HALF, ok, FP8, DTYPE)
            k1 = _fp8_cols(lat, srow, HALF, HALF, ok, FP8, DTYPE)
            kt = k0
            if HAS_ROPE:
                kt = _fp8_cols(lat, srow, 2 * HALF, DT, ok, FP8, DTYPE)
        else:
            if HAS_ROPE:
                rope = k_rope + page * stride_rp + slot * stride_rs + kv_head * stride_rh
            if MASKED:
                k0 = tl.load(lat[:, None] + offs_h[None, :], mask=ok[:, None], other=0.0)
                k1 = tl.load(lat[:, None] + (HALF + offs_h)[None, :], mask=ok[:, None], other=0.0)
                kt = k0
                if HAS_ROPE:
                    kt = tl.load(rope[:, None] + offs_t[None, :], mask=ok[:, None], other=0.0)
            else:
                k0 = tl.load(lat[:, None] + offs_h[None, :])
                k1 = tl.load(lat[:, None] + (HALF + offs_h)[None, :])
                kt = k0
                if HAS_ROPE:
                    kt = tl.load(rope[:, None] + offs_t[None, :])
    return k0, k1, kt, ok


@triton.jit
def _mla_run(acc0, acc1, l_i, m_i, q0, q1, qt, kv_lat, k_rope, lat_desc, rope_desc, bt_row, start, end,
             seqlen, last_visible, kv_head, page_size, index_bound, qk_scale_log2,
             stride_lp, stride_ls, stride_lh, stride_rp, stride_rs, stride_rh,
             BLOCK_N: tl.constexpr, HALF: tl.constexpr, DT: tl.constexpr, HAS_ROPE: tl.constexpr,
             MASKED: tl.constexpr, TMA: tl.constexpr, TRANSPOSED: tl.constexpr, SPARSE: tl.constexpr,
             FP8: tl.constexpr):
    """Online softmax over key tiles start, start + BLOCK_N, ... < end. `last_visible` (BLOCK_M,) is each
    row's last visible key (causal); only MASKED runs look at it.

    TRANSPOSED computes Sᵀ = K·Qᵀ and Oᵀ += Vᵀ·Pᵀ (accumulators (HALF, BLOCK_M)): with few query rows, the
    keys fill wgmma's 64-row M side and the rows become a narrow N, instead of padding 16 rows up to 64."""
    RED: tl.constexpr = 0 if TRANSPOSED else 1          # the key axis of the score tile
    for n in tl.range(start, end, BLOCK_N):
        k0, k1, kt, key_ok = _load_k(kv_lat, k_rope, lat_desc, rope_desc, bt_row, n, seqlen, kv_head, page_size,
                                     index_bound,
                                     stride_lp, stride_ls, stride_lh, stride_rp, stride_rs, stride_rh,
                                     BLOCK_N, HALF, DT, HAS_ROPE, MASKED, TMA, SPARSE, FP8, q0.dtype)
        if TRANSPOSED:
            qk = tl.dot(k0, tl.trans(q0))
            qk = tl.dot(k1, tl.trans(q1), qk)
            if HAS_ROPE:
                qk = tl.dot(kt, tl.trans(qt), qk)
        else:
            qk = tl.dot(q0, tl.trans(k0))
            qk = tl.dot(q1, tl.trans(k1), qk)
            if HAS_ROPE:
                qk = tl.dot(qt, tl.trans(kt), qk)
        s = qk * qk_scale_log2
        if MASKED:
            k_pos = n + tl.arange(0, BLOCK_N)
            if SPARSE:
                k_pos = tl.where(key_ok, k_pos, 2147483647)      # an invalid index is after every row's last key
            if TRANSPOSED:
                s = tl.where(k_pos[:, None] <= last_visible[None, :], s, float("-inf"))
            else:
                s = tl.where(k_pos[None, :] <= last_visible[:, None], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, RED))
        m_shift = m_new
        if MASKED:
            # A row with no visible key yet keeps m = -inf; shift by 0 so exp2 gives 0, not NaN.
            m_shift = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_shift)
        if TRANSPOSED:
            p = tl.exp2(s - m_shift[None, :])
            acc0 = tl.dot(tl.trans(k0), p.to(k0.dtype), acc0 * alpha[None, :])
            acc1 = tl.dot(tl.trans(k1), p.to(k0.dtype), acc1 * alpha[None, :])
        else:
            p = tl.exp2(s - m_shift[:, None])
            acc0 = tl.dot(p.to(k0.dtype), k0, acc0 * alpha[:, None])
            acc1 = tl.dot(p.to(k0.dtype), k1, acc1 * alpha[:, None])
        l_i = l_i * alpha + tl.sum(p, RED)
        m_i = m_new
    return acc0, acc1, l_i, m_i


@triton.jit
def mla_decode_kernel(
    Q_LAT, Q_ROPE, KV_LAT, K_ROPE, LAT_DESC, ROPE_DESC, O, LSE, O_PART, LSE_PART, MAX_LOGITS,
    BLOCK_TABLE, SEQLENS, VALID_LENS, SCHED, SPLIT_OFFSETS, SINKS,
    X_LAT, X_ROPE, X_TABLE, X_VALID, main_span, main_topk, x_page_size, x_index_bound, stride_xbt,
    stride_xlp, stride_xls, stride_xlh, stride_xrp, stride_xrs, stride_xrh,
    batch, seqlen_q, group, rows_per_k, num_m_blocks, page_size, index_bound, stride_bt, stride_bth, qk_scale_log2,
    stride_qlb, stride_qls, stride_qlh, stride_qrb, stride_qrs, stride_qrh,
    stride_lp, stride_ls, stride_lh, stride_rp, stride_rs, stride_rh,
    stride_ob, stride_os, stride_oh, stride_lseb, stride_lseh, stride_lses, seq_tokens,
    stride_ps, stride_pr, stride_lps, stride_mb, stride_mh,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HALF: tl.constexpr, DT: tl.constexpr,
    HAS_ROPE: tl.constexpr, CAUSAL: tl.constexpr, TMA: tl.constexpr, TRANSPOSED: tl.constexpr,
    HAS_SINKS: tl.constexpr, SPARSE: tl.constexpr, FP8: tl.constexpr, HAS_MAX: tl.constexpr, EXTRA: tl.constexpr,
    SCHED_BLOCK: tl.constexpr, SCHED_FIELDS: tl.constexpr,
):
    part = tl.program_id(0)
    kv_head = tl.program_id(1) // num_m_blocks
    offs_m = (tl.program_id(1) % num_m_blocks) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = offs_m < rows_per_k
    q_pos = offs_m // group
    q_head = kv_head * group + offs_m % group
    offs_h = tl.arange(0, HALF)
    offs_t = tl.arange(0, DT)

    meta = SCHED + part * SCHED_FIELDS
    b = tl.load(meta)
    blk = tl.load(meta + 1)
    remaining = tl.load(meta + 2)
    split = tl.load(meta + 3)
    while (remaining > 0) & (b < batch):
        seqlen = tl.load(SEQLENS + b)
        n_blocks = tl.cdiv(seqlen, SCHED_BLOCK)
        take = tl.minimum(n_blocks - blk, remaining)
        if take > 0:
            lo = blk * SCHED_BLOCK
            hi = tl.minimum((blk + take) * SCHED_BLOCK, seqlen)
            # Causal (bottom-right): query i sees keys j <= seqlen - seqlen_q + i. Tiles below `full` are
            # visible to every row and run without masks.
            last_visible = tl.where(row_ok, seqlen - 1, -1)
            full = seqlen
            if CAUSAL:
                last_visible = tl.where(row_ok, seqlen - seqlen_q + q_pos, -1)
                full = seqlen - seqlen_q + 1
            mid = tl.maximum(lo, lo + (tl.minimum(hi, full) - lo) // BLOCK_N * BLOCK_N)
            key_len = seqlen
            if SPARSE:
                # Any index may be -1 and the row stops at its valid length: every tile is masked. One valid length
                # per sequence of the call (seq_tokens query tokens each); one past the index row (main_topk wide;
                # a tile may reach past it) counts as the row's end.
                mid = lo
                key_len = tl.minimum(tl.load(VALID_LENS + b // seq_tokens), main_topk)

            q_lat = Q_LAT + b.to(tl.int64) * stride_qlb + q_pos * stride_qls + q_head * stride_qlh
            q0 = tl.load(q_lat[:, None] + offs_h[None, :], mask=row_ok[:, None], other=0.0)
            q1 = tl.load(q_lat[:, None] + (HALF + offs_h)[None, :], mask=row_ok[:, None], other=0.0)
            qt = q0
            if HAS_ROPE:
                q_rope = Q_ROPE + b.to(tl.int64) * stride_qrb + q_pos * stride_qrs + q_head * stride_qrh
                qt = tl.load(q_rope[:, None] + offs_t[None, :], mask=row_ok[:, None], other=0.0)
            bt_row = BLOCK_TABLE + b.to(tl.int64) * stride_bt + kv_head * stride_bth

            if TRANSPOSED:
                acc0 = tl.zeros([HALF, BLOCK_M], dtype=tl.float32)
                acc1 = tl.zeros([HALF, BLOCK_M], dtype=tl.float32)
            else:
                acc0 = tl.zeros([BLOCK_M, HALF], dtype=tl.float32)
                acc1 = tl.zeros([BLOCK_M, HALF], dtype=tl.float32)
            l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
            m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
            if not SPARSE:
                acc0, acc1, l_i, m_i = _mla_run(acc0, acc1, l_i, m_i, q0, q1, qt, KV_LAT, K_ROPE, LAT_DESC,
                                                ROPE_DESC, bt_row, lo, mid, key_len, last_visible, kv_head, page_size,
                                                index_bound, qk_scale_log2, stride_lp, stride_ls, stride_lh,
                                                stride_rp, stride_rs, stride_rh, BLOCK_N, HALF, DT, HAS_ROPE, False,
                                                TMA, TRANSPOSED, SPARSE, FP8)
            # Sparse: every tile is masked (any index may be invalid). With an EXTRA source, keys [0, main_span)
            # of the planned row are the main source's and the rest the extra source's (main_span is a multiple of
            # SCHED_BLOCK, so no tile straddles the two).
            acc0, acc1, l_i, m_i = _mla_run(acc0, acc1, l_i, m_i, q0, q1, qt, KV_LAT, K_ROPE, LAT_DESC, ROPE_DESC,
                                            bt_row, mid, tl.minimum(hi, main_span), key_len, last_visible, kv_head,
                                            page_size, index_bound, qk_scale_log2, stride_lp, stride_ls, stride_lh,
                                            stride_rp, stride_rs, stride_rh, BLOCK_N, HALF, DT, HAS_ROPE, True, TMA,
                                            TRANSPOSED, SPARSE, FP8)
            if EXTRA:
                x_len = tl.minimum(tl.load(X_VALID + b // seq_tokens), seqlen - main_span)   # its row's width
                acc0, acc1, l_i, m_i = _mla_run(acc0, acc1, l_i, m_i, q0, q1, qt, X_LAT, X_ROPE, LAT_DESC, ROPE_DESC,
                                                X_TABLE + b.to(tl.int64) * stride_xbt,
                                                tl.maximum(lo, main_span) - main_span, hi - main_span, x_len,
                                                last_visible, kv_head, x_page_size, x_index_bound, qk_scale_log2,
                                                stride_xlp, stride_xls, stride_xlh, stride_xrp, stride_xrs, stride_xrh,
                                                BLOCK_N, HALF, DT, HAS_ROPE, True, False, TRANSPOSED, SPARSE, FP8)

            if TRANSPOSED:
                acc0 = tl.trans(acc0)
                acc1 = tl.trans(acc1)
            empty = l_i == 0.0
            inv = tl.where(empty, 0.0, 1.0 / tl.where(empty, 1.0, l_i))
            o0 = acc0 * inv[:, None]
            o1 = acc1 * inv[:, None]
            if (blk == 0) & (take == n_blocks):
                # The whole sequence: final output. FlashMLA's convention for a row with no key: LSE +inf.
                lse = tl.where(empty, float("inf"), m_i * LN2 + tl.log(l_i))
                if HAS_SINKS:
                    keep = sink_keep(lse, empty, tl.load(SINKS + q_head, mask=row_ok, other=0.0))
                    o0 = o0 * keep[:, None]
                    o1 = o1 * keep[:, None]
                o_row = O + b.to(tl.int64) * stride_ob + q_pos * stride_os + q_head * stride_oh
                tl.store(o_row[:, None] + offs_h[None, :], o0.to(O.dtype.element_ty), mask=row_ok[:, None])
                tl.store(o_row[:, None] + (HALF + offs_h)[None, :], o1.to(O.dtype.element_ty), mask=row_ok[:, None])
                tl.store(lse_ptrs(LSE, b, q_head, q_pos, stride_lseb, stride_lseh, stride_lses, seq_tokens), lse,
                         mask=row_ok)
                if HAS_MAX:
                    # The largest scaled score of each row (natural units; -inf with no key): sparse prefill's
                    # max_logits. Only whole sequences are planned when it is asked for.
                    tl.store(MAX_LOGITS + b.to(tl.int64) * stride_mb + q_head * stride_mh, m_i * LN2, mask=row_ok)
            else:
                # A piece: fp32 partial at this batch's split slot; an empty piece has LSE -inf (weight 0).
                lse = tl.where(empty, float("-inf"), m_i * LN2 + tl.log(l_i))
                slot = (tl.load(SPLIT_OFFSETS + b) + split).to(tl.int64)
                prow = kv_head * rows_per_k + offs_m
                p_row = O_PART + slot * stride_ps + prow.to(tl.int64) * stride_pr
                tl.store(p_row[:, None] + offs_h[None, :], o0, mask=row_ok[:, None])
                tl.store(p_row[:, None] + (HALF + offs_h)[None, :], o1, mask=row_ok[:, None])
                tl.store(LSE_PART + slot * stride_lps + prow, lse, mask=row_ok)
        remaining -= tl.maximum(take, 0)
        b += 1
        blk = 0
        split = 0


# ----------------------------------------------------------------------------------------------------------
# Launch. Callers pass validated tensors; nothing here checks arguments.

# (BLOCK_M, BLOCK_N, num_warps, num_stages) on sm_90, from benchmarks/tune_mla.py on the H100
# (benchmarks/results/tune_mla_h100.json). 8 warps: the two 64 x 256 fp32 accumulators alone take 128 registers
# per thread at 256 threads.
_GPU_TILES = (64, 64, 8, 2)
_INTERPRET_TILES = (32, 32, 4, 1)     # small tiles keep several query blocks in small CPU tests


# At most 32 packed rows: the transposed form with 4 warps (one warpgroup, no duplicated Q·Kᵀ) and the rows
# as wgmma's N. The 64-row form pads 16 rows to 64 and, with 8 warps, has both warpgroups compute the same
# 64 x BLOCK_N score tile (Triton gives a 64-row dot one warpgroup's rows): compute-bound even at h_q = 16.
_GPU_TRANSPOSED_TILES = {16: (16, 64, 4, 2), 32: (32, 64, 4, 2)}
_INTERPRET_TRANSPOSED_TILES = {16: (16, 32, 4, 1), 32: (32, 32, 4, 1)}


def _tile_config(rows_per_k, interpret):
    """(BLOCK_M, BLOCK_N, num_warps, num_stages, transposed) for `rows_per_k` packed query rows."""
    rows = max(16, next_pow2(rows_per_k))
    table = _INTERPRET_TRANSPOSED_TILES if interpret else _GPU_TRANSPOSED_TILES
    if rows in table:
        return (*table[rows], True)
    return (*(_INTERPRET_TILES if interpret else _GPU_TILES), False)


def _tma_ok(t, heads_k):
    """A (pages, page_size, 1, d) cache whose pages are evenly spaced rows of one 2-D (rows, d) view, with the
    16-byte alignment TMA needs."""
    es = t.element_size()
    return (heads_k == 1 and t.stride(0) == t.shape[1] * t.stride(1) and t.data_ptr() % 16 == 0
            and (t.stride(1) * es) % 16 == 0)


# The Gluon kernel a call of `mla_decode_forward` takes on Hopper, by `mla_decode_sm90.plan_key`: ("sparse",
# `sparse_decode_sm90`'s views), ("sm90", `mla_decode_sm90`'s views, then its launch plan), or None (the portable
# kernel). A later call of a key skips both `supported`s and the planning.
_ROUTES = Plans()


def _route(q_lat, q_rope, kv_lat, k_rope, out, *, sparse, fp8_layout, extra, max_logits, whole, causal):
    """The `_ROUTES` entry of a call no earlier call of its key has routed."""
    from . import mla_decode_sm90, sparse_decode_sm90
    views = sparse_decode_sm90.supported(q_lat, q_rope, kv_lat, out, sparse=sparse, fp8_layout=fp8_layout,
                                         extra=extra, max_logits=max_logits, whole=whole, causal=causal)
    if views is not None:
        return "sparse", views
    views = mla_decode_sm90.supported(q_lat, q_rope, kv_lat, k_rope, out, sparse=sparse, fp8_layout=fp8_layout,
                                      extra=extra)
    return None if views is None else ("sm90", views)


def _split_buffers(shape, device):
    """The split decode's fp32 partial outputs `shape` = (pieces, rows, dv) and their LSEs (pieces, rows): every part
    boundary of the plan adds at most one piece to one batch, so batch + parts pieces; one when every sequence runs
    whole (nothing is combined; the kernels still take the addresses). Made once the route is known: the FP8
    sparse decode run whole (`sparse_decode_sm90`) takes none."""
    return (torch.empty(shape, dtype=torch.float32, device=device),
            torch.empty(shape[:2], dtype=torch.float32, device=device))


def mla_decode_forward(q_lat, q_rope, kv_lat, k_rope, block_table, cache_seqlens, metadata, split_offsets,
                       out, lse, *, softmax_scale, causal, sinks=None, valid_lens=None, fp8_layout=None,
                       max_logits=None, extra=None, whole=False, tiles=None, use_tma=None, backend=None,
                       interpret=False):
    """q_lat (b, s_q, h_q, DV), q_rope (b, s_q, h_q, DT) or None, kv_lat (pages, page_size, h_k, DV),
    k_rope (pages, page_size, h_k, DT) or None, metadata / split_offsets from `schedule.plan_mla`, sinks (h_q,)
    fp32 or None (an attention sink per query head). Token-sparse: `valid_lens (b,)` int32 given, each "batch"
    is one query token, `block_table (b, [h_k,] topk)` holds its token indices (negative or past the cache = none;
    with the h_k axis, one row per KV head) and `cache_seqlens` is topk. `lse` may be `(b // t, h_q, t)` when
    s_q = 1: the b tokens are t query tokens each of b // t sequences (`common.lse_ptrs`), and `valid_lens`
    (and x_valid) then hold one length per sequence, `(b // t,)`; lengths past topk count as topk.
    `max_logits (b, h_q)` fp32 (s_q = 1): also write each row's largest scaled score; the plan must run every
    sequence whole (one part each), so there is nothing to combine and no split buffer is made. `whole`: the
    caller knows that the plan runs every sequence whole (`schedule.runs_whole`): no combine, no split buffer.
    `extra = (x_lat, x_rope, x_table (b, extra_topk), x_valid (b,), main_span)`: a second sparse source (its own
    cache, page size and indices) in the same launch: the plan's rows are main_span (a multiple of SCHED_BLOCK, at
    least the main topk) keys of the main source followed by extra_topk of the extra one.
    `fp8_layout` "v32" / "model1": kv_lat is the packed uint8 cache (k_rope the same tensor), dequantised on load.
    Writes out (b, s_q, h_q, DV) and lse (b, h_q, s_q); returns the compiled decode kernel (for tuning:
    its register and spill counts; None when the Gluon kernel of `mla_decode_sm90` ran, which every call with one
    KV head takes on Hopper where `mla_decode_sm90.supported` accepts it, unless `backend="triton"`, `tiles` or
    `use_tma` is given, or FMHA_GLUON=0).
    `tiles` = (BLOCK_M, BLOCK_N, num_warps, num_stages, transposed) overrides the table."""
    batch, seqlen_q, heads_q, dv = q_lat.shape
    page_size, heads_k = kv_lat.shape[1], kv_lat.shape[2]
    if batch == 0 or seqlen_q == 0:
        return
    cache_seqlens, sinks, valid_lens = dense(cache_seqlens, sinks, valid_lens)
    group = heads_q // heads_k
    rows_per_k = seqlen_q * group
    sparse = valid_lens is not None
    num_parts = metadata.shape[0]
    whole = whole or max_logits is not None
    parts_shape = (1 if whole else batch + num_parts, heads_k * rows_per_k, dv)
    overridden = backend == "triton" or tiles is not None or use_tma is not None
    if block_table.dim() == 3 and heads_k == 1:
        block_table = block_table[:, 0]           # sparse prefill's (tokens, h_kv = 1, topk) index rows
    if not overridden and not interpret and gluon_enabled():
        # One KV head on Hopper (bf16/fp16 or FP8 caches, paged or token-sparse, with an extra source or not;
        # `supported` decides): the Gluon kernel (no duplicated score tile). Decided before the portable kernel's
        # tiles and descriptors, and kept by call key (`_ROUTES`).
        from . import mla_decode_sm90, sparse_decode_sm90
        key = mla_decode_sm90.plan_key(q_lat, q_rope, kv_lat, k_rope, block_table, cache_seqlens, metadata,
                                       split_offsets, out, lse, sinks, valid_lens, max_logits, extra,
                                       softmax_scale=softmax_scale, causal=causal, fp8_layout=fp8_layout, whole=whole)
        route = _ROUTES.get(key, False)
        if route is False:
            route = _route(q_lat, q_rope, kv_lat, k_rope, out, sparse=sparse, fp8_layout=fp8_layout,
                           extra=extra, max_logits=max_logits, whole=whole, causal=causal)
            _ROUTES.keep(key, route)
        if route is not None and route[0] == "sparse":
            # FP8 sparse decode, run whole: a dequantising loader (its module)
            sparse_decode_sm90.sparse_decode_forward_sm90(route[1], q_lat, q_rope, kv_lat, block_table, valid_lens, out,
                                                          lse, softmax_scale=softmax_scale, sinks=sinks,
                                                          fp8_layout=fp8_layout, extra=extra)
            return None
        if route is not None:
            # route[1]: supported's views on a key's first call, its launch plan after
            o_part, lse_part = _split_buffers(parts_shape, q_lat.device)
            plan = mla_decode_sm90.mla_decode_forward_sm90(route[1], q_lat, q_rope, kv_lat, k_rope, block_table,
                                                           cache_seqlens, metadata, split_offsets, out, lse, o_part,
                                                           lse_part, softmax_scale=softmax_scale, causal=causal,
                                                           sinks=sinks, valid_lens=valid_lens, max_logits=max_logits,
                                                           fp8_layout=fp8_layout, extra=extra)
            if route[1] is not plan:
                _ROUTES[key] = ("sm90", plan)
            if not whole:         # a dependent launch (`combine`): idle beside a whole plan's split kernel
                combine(out, lse, o_part, lse_part, rows_per_k=rows_per_k, group=group, split_offsets=split_offsets,
                        sinks=sinks, empty_lse=float("inf"), pdl=True)
            return None
    o_part, lse_part = _split_buffers(parts_shape, q_lat.device)
    block_m, block_n, num_warps, num_stages, transposed = tiles or _tile_config(rows_per_k, interpret)
    has_rope = q_rope is not None
    dt = q_rope.shape[-1] if has_rope else 16
    half = dv // 2
    if sparse or fp8_layout is not None:
        use_tma = False                  # token gathers (one page lookup per key) / FP8 rows dequantised on load
    if fp8_layout == "model1" and tiles is None:
        # V4's short sparse rows (topk 128 + a 512-1024 window per token) ran 5-11% faster unpipelined:
        # benchmarks/results/tune_sparse_h100.json.
        num_stages = 1
    if use_tma is None:
        use_tma = (not interpret and page_size % block_n == 0 and _tma_ok(kv_lat, heads_k)
                   and (not has_rope or _tma_ok(k_rope, heads_k)))
    lat_desc = rope_desc = None
    if use_tma:
        from triton.tools.tensor_descriptor import TensorDescriptor
        rows = kv_lat.shape[0] * page_size
        lat_desc = TensorDescriptor(kv_lat, [rows, dv], [kv_lat.stride(1), 1], [block_n, half])
        if has_rope:
            rope_desc = TensorDescriptor(k_rope, [rows, dt], [k_rope.stride(1), 1], [block_n, dt])
    rope_strides = (k_rope.stride(0), k_rope.stride(1), k_rope.stride(2)) if has_rope else (0, 0, 0)
    q_rope_strides = (q_rope.stride(0), q_rope.stride(1), q_rope.stride(2)) if has_rope else (0, 0, 0)
    num_m_blocks = cdiv(rows_per_k, block_m)
    if extra is not None:
        x_lat, x_rope, x_table, x_valid, main_span = extra
        x_rope_strides = (x_rope.stride(0), x_rope.stride(1), x_rope.stride(2)) if has_rope else (0, 0, 0)
        x_args = (x_lat, x_rope, x_table, x_valid, main_span, block_table.shape[-1], x_lat.shape[1],
                  x_lat.shape[0] * x_lat.shape[1], x_table.stride(0), x_lat.stride(0), x_lat.stride(1), x_lat.stride(2),
                  *x_rope_strides)
    else:
        x_args = (None, None, None, None, 1 << 30, block_table.shape[-1], 1, 0, 0, 0, 0, 0, 0, 0, 0)
    kernel = mla_decode_kernel[(num_parts, heads_k * num_m_blocks)](
        q_lat, q_rope, kv_lat, k_rope, lat_desc, rope_desc, out, lse, o_part, lse_part, max_logits,
        block_table, cache_seqlens, valid_lens, metadata, split_offsets, sinks, *x_args,
        batch, seqlen_q, group, rows_per_k, num_m_blocks, page_size, kv_lat.shape[0] * page_size,
        block_table.stride(0), block_table.stride(1) if block_table.dim() == 3 else 0,
        softmax_scale * 1.4426950408889634,
        q_lat.stride(0), q_lat.stride(1), q_lat.stride(2), *q_rope_strides,
        kv_lat.stride(0), kv_lat.stride(1), kv_lat.stride(2), *rope_strides,
        out.stride(0), out.stride(1), out.stride(2), lse.stride(0), lse.stride(1), lse.stride(2),
        batch // lse.shape[0], o_part.stride(0), o_part.stride(1), lse_part.stride(0),
        *((max_logits.stride(0), max_logits.stride(1)) if max_logits is not None else (0, 0)),
        BLOCK_M=block_m, BLOCK_N=block_n, HALF=half, DT=dt, HAS_ROPE=has_rope, CAUSAL=causal,
        TMA=bool(use_tma), TRANSPOSED=transposed, HAS_SINKS=sinks is not None, SPARSE=sparse,
        FP8={None: 0, "v32": 1, "model1": 2}[fp8_layout], HAS_MAX=max_logits is not None, EXTRA=extra is not None,
        SCHED_BLOCK=SCHED_BLOCK, SCHED_FIELDS=SCHED_FIELDS,
        num_warps=num_warps, num_stages=num_stages,
    )
    if not whole:
        combine(out, lse, o_part, lse_part, rows_per_k=rows_per_k, group=group, split_offsets=split_offsets,
                sinks=sinks, empty_lse=float("inf"))
    return kernel
