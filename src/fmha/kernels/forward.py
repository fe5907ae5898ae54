"""The attention forward kernel (triton.language): dense and varlen, every SPEC.md option.

One program computes BLOCK_M query rows of one (batch, head) against the keys its mask lets it see.
Rows are "packed" rows: with PACK_GQA the query heads that share a KV head are interleaved into the M
tile (row r = query position r // G, head r % G), so K/V is read once for the whole group — this is
what makes small-Sq / many-head (decode-like, DSV4) shapes efficient.

Key tiles fall into three runs: masked tiles on the left edge of the window, unmasked tiles in the
middle (no mask arithmetic, no bounds on loads), masked tiles on the right edge / sequence end.
"""
import functools
import math
import threading

import torch
import triton
import triton.language as tl

from ..schedule import counted_per_sm, num_sms, plan_num_splits
from .combine import combine, merge_parts
from .common import LN2, LOG2E, scores_log2, sink_keep, softmax_update, visible
from .launch import Plans, cdiv, dense, fixed_classes, launch, next_pow2, prev_pow2, programs_per_sm, zeroed_counter
from .sm90 import gluon_enabled


@triton.jit
def _load_tile(ptrs, rows, cols, n_rows, N_COLS: tl.constexpr, BLOCK_COLS: tl.constexpr, BOUNDS: tl.constexpr):
    """Load a (rows, cols) tile, masking only what may be out of bounds (zeros there)."""
    if BOUNDS:
        if N_COLS < BLOCK_COLS:
            x = tl.load(ptrs, mask=(rows < n_rows)[:, None] & (cols < N_COLS)[None, :], other=0.0)
        else:
            x = tl.load(ptrs, mask=(rows < n_rows)[:, None], other=0.0)
    elif N_COLS < BLOCK_COLS:
        x = tl.load(ptrs, mask=(cols < N_COLS)[None, :], other=0.0)
    else:
        x = tl.load(ptrs)
    return x


@triton.jit
def _key_slots(n, offs_n, bt_row, k_len, page_size, PAGED: tl.constexpr, PAGE_TILE: tl.constexpr):
    """Where keys n + offs_n live: (page, slot), so that a key's row is base + page * page_stride + slot * row_stride.
    Paged caches: block_table[b, key // page_size] and key % page_size; a contiguous cache: page 0, slot = key.
    Callers pass n < k_len; table entries at or past k_len are not read (page 0 there; the caller masks those
    rows)."""
    BLOCK_N: tl.constexpr = offs_n.shape[0]
    rows = n + offs_n
    if PAGED and PAGE_TILE == BLOCK_N:
        # BLOCK_N divides page_size: the whole tile lies in one page, looked up once (n < k_len: a valid entry).
        page = tl.load(bt_row + n // page_size).to(tl.int64)
        slot = n % page_size + offs_n
    elif PAGED and PAGE_TILE > 0:
        # The tile is BLOCK_N // PAGE_TILE whole pages (page_size == PAGE_TILE): their numbers are one short
        # vector load, spread over the tile's rows, instead of one table lookup per key.
        PAGES: tl.constexpr = BLOCK_N // PAGE_TILE
        first = n + tl.arange(0, PAGES) * PAGE_TILE
        pages = tl.load(bt_row + first // PAGE_TILE, mask=first < k_len, other=0).to(tl.int64)
        page = tl.reshape(tl.broadcast_to(pages[:, None], (PAGES, PAGE_TILE)), (BLOCK_N,))
        slot = offs_n % PAGE_TILE
    elif PAGED:
        page = tl.load(bt_row + rows // page_size, mask=rows < k_len, other=0).to(tl.int64)
        slot = rows % page_size
    else:
        page = 0
        slot = rows.to(tl.int64)
    return page, slot


@triton.jit
def _load_kv_tile(k_base, v_base, k_desc, v_desc, n, b, kv_head, offs_n, offs_d, offs_dt, offs_dv, stride_ks, stride_vs,
                  k_len, bt_row, page_size, stride_kp, stride_vp, PAGED: tl.constexpr, PAGE_TILE: tl.constexpr,
                  HEAD_DIM_QK: tl.constexpr, HEAD_DIM_V: tl.constexpr, BLOCK_D: tl.constexpr,
                  BLOCK_DT: tl.constexpr, BLOCK_DV: tl.constexpr, HAS_TAIL: tl.constexpr, BOUNDS: tl.constexpr,
                  TMA: tl.constexpr, V_WORDS: tl.constexpr):
    """K tile (BLOCK_N, BLOCK_D) [+ tail (BLOCK_N, BLOCK_DT)] and V tile (BLOCK_N, BLOCK_DV) at key `n`; with
    V_WORDS (an FP8 V, pointer loads) the V tile as (BLOCK_N, BLOCK_DV // 2) 16-bit words, two values each."""
    if TMA == 1:
        # Per-sequence descriptor whose shape stops at k_len: TMA zero-fills past the end.
        k = k_desc.load([n, 0])
        v = v_desc.load([n, 0])
        k_t = k
    elif TMA == 2:
        # Host descriptor over (batch, seqlen_k, heads_k, d): bounds per dimension, so zero fill past seqlen_k.
        k4 = k_desc.load([b, n, kv_head, 0])
        v4 = v_desc.load([b, n, kv_head, 0])
        k = k4.reshape(k4.shape[1], k4.shape[3])
        v = v4.reshape(v4.shape[1], v4.shape[3])
        k_t = k
    else:
        rows = n + offs_n
        page, slot = _key_slots(n, offs_n, bt_row, k_len, page_size, PAGED, PAGE_TILE)
        k_rows = k_base + page * stride_kp + slot * stride_ks
        v_rows = v_base + page * stride_vp + slot * stride_vs
        k_ptrs = k_rows[:, None] + offs_d[None, :]
        # Each form keeps the statement order it was measured in: ptxas schedules and allocates the same loop
        # apart when V's addresses come before or after K's load (`benchmarks/sass_diff.py` compares the SASS).
        if V_WORDS > 0:
            k = _load_tile(k_ptrs, rows, offs_d, k_len, HEAD_DIM_QK, BLOCK_D, BOUNDS)
            offs_dw = tl.arange(0, BLOCK_DV // 2)
            v_ptrs = v_rows.to(tl.pointer_type(tl.int16), bitcast=True)[:, None] + offs_dw[None, :]
            v = _load_tile(v_ptrs, rows, offs_dw, k_len, HEAD_DIM_V // 2, BLOCK_DV // 2, BOUNDS)
        else:
            v_ptrs = v_rows[:, None] + offs_dv[None, :]
            k = _load_tile(k_ptrs, rows, offs_d, k_len, HEAD_DIM_QK, BLOCK_D, BOUNDS)
            v = _load_tile(v_ptrs, rows, offs_dv, k_len, HEAD_DIM_V, BLOCK_DV, BOUNDS)
        k_t = k
        if HAS_TAIL:
            kt_ptrs = k_rows[:, None] + (BLOCK_D + offs_dt)[None, :]
            kt_mask = (rows < k_len)[:, None] & (BLOCK_D + offs_dt < HEAD_DIM_QK)[None, :]
            k_t = tl.load(kt_ptrs, mask=kt_mask, other=0.0)
    return k, k_t, v


@triton.jit
def _fp8_word_halves(w, V_WORDS: tl.constexpr):
    """An FP8 V tile read as 16-bit words w (N, Dv / 2) -> its even and odd columns (N, Dv / 2) in fp16.

    mma.sync's B operand wants the two keys k, k + 1 of one column in a register; an FP8 row holds columns, so
    Triton gathered V from shared memory a byte at a time (`LDS.U8`, ~130 a warp a 64-key tile). As 16-bit words,
    V is transposed by ldmatrix.trans like an fp16 tile: a thread's register then holds words (k, j) and (k + 1, j),
    i.e. bytes V[k, 2j], V[k, 2j + 1], V[k + 1, 2j], V[k + 1, 2j + 1], and two byte permutes make the key pairs of
    columns 2j and 2j + 1, each widened by one conversion (V_WORDS == 2, on the GPU). V_WORDS == 1 is the same
    arithmetic in triton.language, for the interpreter."""
    if V_WORDS == 2:
        even, odd = tl.inline_asm_elementwise(
            """{
            .reg .b32 lo, hi;
            .reg .b16 lo0, lo1, hi0, hi1;
            prmt.b32 lo, $2, 0, 0x20;
            prmt.b32 hi, $2, 0, 0x31;
            mov.b32 {lo0, lo1}, lo;
            mov.b32 {hi0, hi1}, hi;
            cvt.rn.f16x2.e4m3x2 $0, lo0;
            cvt.rn.f16x2.e4m3x2 $1, hi0;
            }""", "=r,=r,r", [w], dtype=(tl.float16, tl.float16), is_pure=True, pack=2)
    else:
        even = w.to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(tl.float16)
        odd = (w >> 8).to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(tl.float16)
    return even, odd


@triton.jit
def _attn_run(acc, l_i, m_i, q, q_t, k_base, v_base, k_desc, v_desc, b, kv_head, start, end,
              q_pos, slope_log2, diag, window_left, window_right, k_len, stride_ks, stride_vs,
              bt_row, page_size, stride_kp, stride_vp, PAGED: tl.constexpr, PAGE_TILE: tl.constexpr,
              qk_scale_log2, softcap,
              HEAD_DIM_QK: tl.constexpr, HEAD_DIM_V: tl.constexpr, BLOCK_N: tl.constexpr,
              BLOCK_D: tl.constexpr, BLOCK_DT: tl.constexpr, BLOCK_DV: tl.constexpr, HAS_TAIL: tl.constexpr,
              MASKED: tl.constexpr, MASK_LEFT: tl.constexpr, MASK_RIGHT: tl.constexpr,
              HAS_SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr, TMA: tl.constexpr, V_WORDS: tl.constexpr,
              NUM_STAGES: tl.constexpr):
    """Online softmax over the key tiles starting at start, start + BLOCK_N, ... < end (in NUM_STAGES stages;
    None: the launch's)."""
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dt = tl.arange(0, BLOCK_DT)
    offs_dv = tl.arange(0, BLOCK_DV)
    if V_WORDS > 0:
        # The output's even and odd columns accumulate apart (`_fp8_word_halves`); joined again at the end.
        acc_even, acc_odd = tl.split(tl.reshape(acc, (acc.shape[0], BLOCK_DV // 2, 2)))
    for n in tl.range(start, end, BLOCK_N, num_stages=NUM_STAGES):
        k, k_t, v = _load_kv_tile(k_base, v_base, k_desc, v_desc, n, b, kv_head, offs_n, offs_d, offs_dt, offs_dv,
                                  stride_ks, stride_vs, k_len, bt_row, page_size, stride_kp, stride_vp,
                                  PAGED, PAGE_TILE, HEAD_DIM_QK, HEAD_DIM_V, BLOCK_D, BLOCK_DT,
                                  BLOCK_DV, HAS_TAIL, MASKED, TMA, V_WORDS)
        # An FP8 cache's tiles in q's (compute) dtype (V's words widen in `_fp8_word_halves`); its descales are
        # applied outside the loop.
        k, k_t = k.to(q.dtype), k_t.to(q.dtype)
        if V_WORDS == 0:
            v = v.to(q.dtype)
        qk = tl.dot(q, tl.trans(k))
        if HAS_TAIL:
            qk = tl.dot(q_t, tl.trans(k_t), qk)
        k_pos = n + offs_n
        s = scores_log2(qk, q_pos, k_pos, diag, slope_log2, qk_scale_log2, softcap, HAS_SOFTCAP, HAS_ALIBI)
        if MASKED:
            ok = visible(q_pos, k_pos, diag, window_left, window_right, k_len, MASK_LEFT, MASK_RIGHT)
            s = tl.where(ok, s, float("-inf"))
        p, alpha, l_i, m_i = softmax_update(l_i, m_i, s, MASKED)
        if V_WORDS > 0:
            v_even, v_odd = _fp8_word_halves(v, V_WORDS)
            p = p.to(tl.float16)
            acc_even = tl.dot(p, v_even, acc_even * alpha[:, None])
            acc_odd = tl.dot(p, v_odd, acc_odd * alpha[:, None])
        else:
            acc = acc * alpha[:, None]
            acc = tl.dot(p.to(v.dtype), v, acc)
    if V_WORDS > 0:
        acc = tl.reshape(tl.join(acc_even, acc_odd), (acc.shape[0], BLOCK_DV))
    return acc, l_i, m_i


@triton.jit
def attn_fwd_kernel(
    Q, K, V, O, LSE, CU_Q, CU_K, SLOPES, SINKS, K_DESC, V_DESC, SEQLENS_K, BLOCK_TABLE, WINDOW_LEFTS,
    Q_DESCALE, K_DESCALE, V_DESCALE, K_STARTS, O_PART, LSE_PART, COUNTER,
    seqlen_q, seqlen_k, stride_bt, page_size, stride_o_split, stride_l_split,
    stride_qb, stride_qs, stride_qh,
    stride_kb, stride_ks, stride_kh,
    stride_vb, stride_vs, stride_vh,
    stride_ob, stride_os, stride_oh,
    stride_lb, stride_lh, stride_ls,
    heads_per_program_row, group, heads_eff,
    qk_scale_log2, softcap, window_left, window_right,
    HEAD_DIM_QK: tl.constexpr, HEAD_DIM_V: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_DT: tl.constexpr, BLOCK_DV: tl.constexpr, HAS_TAIL: tl.constexpr,
    IS_VARLEN: tl.constexpr, MASK_LEFT: tl.constexpr, MASK_RIGHT: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr, HAS_SINKS: tl.constexpr,
    REVERSE_M: tl.constexpr, TMA: tl.constexpr,
    HAS_SEQLENS_K: tl.constexpr, PAGED: tl.constexpr, SPLIT: tl.constexpr, LEFT_PER_BATCH: tl.constexpr,
    PAGE_TILE: tl.constexpr, V_WORDS: tl.constexpr = 0, PAIR: tl.constexpr = False, SHORT_ONLY: tl.constexpr = False,
    WIDE: tl.constexpr = None, MERGE_PARTS: tl.constexpr = 0,
):
    pid_bh = tl.program_id(0)
    pid_m = tl.program_id(1)
    # Causal / windowed work grows with the M block: run the longest blocks first (LPT order).
    m_block = tl.num_programs(1) - 1 - pid_m if REVERSE_M else pid_m
    b = pid_bh // heads_eff
    h_eff = pid_bh % heads_eff
    q_start = 0
    q_len = seqlen_q
    k_start = 0
    k_len = seqlen_k
    if IS_VARLEN:                               # packed queries
        q_start = tl.load(CU_Q + b)
        q_len = tl.load(CU_Q + b + 1) - q_start
    if CU_K is not None:                        # packed keys
        k_start = tl.load(CU_K + b)
        k_len = tl.load(CU_K + b + 1) - k_start
    if HAS_SEQLENS_K:
        # A KV cache: this sequence's length (packed keys: how many of them it uses, FlashAttention's seqused_k).
        k_len = tl.load(SEQLENS_K + b)
        if K_STARTS is not None:
            # FlashAttention's cache_leftpad: the sequence's keys are cache rows [K_STARTS[b], k_len).
            k_start = tl.load(K_STARTS + b)
            k_len = tl.maximum(k_len - k_start, 0)
    if LEFT_PER_BATCH:
        # One sliding-window length per sequence; a negative one is unbounded.
        window_left = tl.load(WINDOW_LEFTS + b)
        window_left = tl.where(window_left < 0, 1 << 30, window_left)
    if SHORT_ONLY:
        # Packed sequences longer than seqlen_q are another launch's (`attention_forward`'s short sequences).
        if q_len > seqlen_q:
            return
    K_OFFSET: tl.constexpr = CU_K is not None or K_STARTS is not None       # keys from k_start on
    # A short launch of several tile forms (WIDE: their (BLOCK_M, BLOCK_N, num_stages, PAGE_TILE), BLOCK_M rising):
    # a sequence of more packed rows than BLOCK_M takes the first form past BLOCK_M that holds them all, or the last
    # form's tiles, its M blocks the launch's (`_short_tiles`).
    if WIDE is not None:
        rows = q_len * heads_per_program_row
        if rows > BLOCK_M:
            for i in tl.static_range(len(WIDE)):
                # form i: more rows than the form before holds, at most its own BLOCK_M (the last: any)
                if ((rows > (BLOCK_M if i == 0 else WIDE[i - 1][0]))
                        & (rows <= (WIDE[i][0] if i < len(WIDE) - 1 else 2 ** 31 - 1))
                        & (m_block * WIDE[i][0] < rows)):
                    _attn_tile(Q, K, V, O, LSE, SLOPES, SINKS, K_DESC, V_DESC, BLOCK_TABLE, Q_DESCALE, K_DESCALE,
                               V_DESCALE, O_PART, LSE_PART, COUNTER, seqlen_q,
                               b, h_eff, m_block, q_start, q_len, k_start, k_len, window_left, stride_bt,
                               page_size, stride_o_split, stride_l_split, stride_qb, stride_qs, stride_qh,
                               stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh, stride_ob,
                               stride_os, stride_oh, stride_lb, stride_lh, stride_ls, heads_per_program_row, group,
                               heads_eff, qk_scale_log2, softcap, window_right,
                               HEAD_DIM_QK, HEAD_DIM_V, WIDE[i][0], WIDE[i][1], BLOCK_D, BLOCK_DT, BLOCK_DV, HAS_TAIL,
                               MASK_LEFT, MASK_RIGHT, HAS_SOFTCAP, HAS_ALIBI, HAS_SINKS, TMA, PAGED, SPLIT,
                               WIDE[i][3], 0, PAIR, K_OFFSET, WIDE[i][2], MERGE_PARTS)
            return
    if m_block * BLOCK_M >= q_len * heads_per_program_row:
        return
    _attn_tile(Q, K, V, O, LSE, SLOPES, SINKS, K_DESC, V_DESC, BLOCK_TABLE, Q_DESCALE, K_DESCALE, V_DESCALE,
               O_PART, LSE_PART, COUNTER, seqlen_q,
               b, h_eff, m_block, q_start, q_len, k_start, k_len, window_left, stride_bt, page_size,
               stride_o_split, stride_l_split, stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh,
               stride_vb, stride_vs, stride_vh, stride_ob, stride_os, stride_oh, stride_lb, stride_lh, stride_ls,
               heads_per_program_row, group, heads_eff, qk_scale_log2, softcap, window_right,
               HEAD_DIM_QK, HEAD_DIM_V, BLOCK_M, BLOCK_N, BLOCK_D, BLOCK_DT, BLOCK_DV, HAS_TAIL,
               MASK_LEFT, MASK_RIGHT, HAS_SOFTCAP, HAS_ALIBI, HAS_SINKS, TMA, PAGED, SPLIT,
               PAGE_TILE, V_WORDS, PAIR, K_OFFSET, None, MERGE_PARTS)


@triton.jit
def _attn_tile(Q, K, V, O, LSE, SLOPES, SINKS, K_DESC, V_DESC, BLOCK_TABLE, Q_DESCALE, K_DESCALE, V_DESCALE,
               O_PART, LSE_PART, COUNTER, seqlen_q,
               b, h_eff, m_block, q_start, q_len, k_start, k_len, window_left, stride_bt, page_size,
               stride_o_split, stride_l_split, stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh,
               stride_vb, stride_vs, stride_vh, stride_ob, stride_os, stride_oh, stride_lb, stride_lh, stride_ls,
               heads_per_program_row, group, heads_eff, qk_scale_log2, softcap, window_right,
               HEAD_DIM_QK: tl.constexpr, HEAD_DIM_V: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
               BLOCK_D: tl.constexpr, BLOCK_DT: tl.constexpr, BLOCK_DV: tl.constexpr, HAS_TAIL: tl.constexpr,
               MASK_LEFT: tl.constexpr, MASK_RIGHT: tl.constexpr, HAS_SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr,
               HAS_SINKS: tl.constexpr, TMA: tl.constexpr, PAGED: tl.constexpr, SPLIT: tl.constexpr,
               PAGE_TILE: tl.constexpr, V_WORDS: tl.constexpr, PAIR: tl.constexpr, K_OFFSET: tl.constexpr,
               NUM_STAGES: tl.constexpr, MERGE_PARTS: tl.constexpr):
    """M block `m_block` (tiles of BLOCK_M packed rows) of sequence b, query heads h_eff's, from its query rows
    to its output and LSE rows; `K_OFFSET`: its keys start at k_start. NUM_STAGES: its key loops' stages (None: the
    launch's)."""
    GP = heads_per_program_row            # query heads packed into the rows (1 unless PACK_GQA)
    row0 = m_block * BLOCK_M

    offs_m = row0 + tl.arange(0, BLOCK_M)
    q_pos = offs_m // GP
    q_head = h_eff * GP + offs_m % GP
    kv_head = (h_eff * GP) // group
    row_ok = q_pos < q_len
    diag = k_len - q_len

    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    # Offsets in 64 bits: a stride fits int32 but its product with an index need not (a (b, h, s, d) layout's head
    # stride of s * d at a million tokens, a caller's `out` view). q's heads within a packed group stay 32-bit (a
    # vector of 64-bit products cost a spill): a group is packed only for a few query rows, so q's head stride is
    # small then.
    q_rows = (Q + b.to(tl.int64) * stride_qb + (h_eff * GP).to(tl.int64) * stride_qh
              + (q_start + q_pos).to(tl.int64) * stride_qs + (offs_m % GP) * stride_qh)
    # The math runs in q's dtype, or in fp16 for FP8 keys: every e4m3 value is an fp16 value, so one hardware
    # conversion per pair widens an FP8 tile (to bf16 it would take a second, per value), and P keeps more of its
    # mantissa than in bf16. A bf16 q goes to fp16 scaled by a power of two that puts the largest |q| of this
    # program's rows at 2^14 (exact, and inside fp16's range whatever q's magnitude); the score scale undoes it.
    FP8_KV: tl.constexpr = K.dtype.element_ty == tl.float8e4nv
    CDT: tl.constexpr = tl.float16 if FP8_KV or Q.dtype.element_ty == tl.float8e4nv else Q.dtype.element_ty
    RESCALE_Q: tl.constexpr = FP8_KV and Q.dtype.element_ty == tl.bfloat16
    if PAIR:
        # Two KV heads a program (`attention_forward`'s head pairs): K and V are rows of both heads' d values, q
        # is d wide. A row of the first head of the pair holds [q, 0], of the second [0, q], so that q . k sees
        # only its own head's half of each key, and the output's own half is stored below.
        HALF_D: tl.constexpr = HEAD_DIM_QK // 2
        half = (q_head * 2 // group) % 2        # which head of the pair a row's query head belongs to
        own = (offs_d // HALF_D)[None, :] == half[:, None]
        q = tl.load(q_rows[:, None] + (offs_d[None, :] - half[:, None] * HALF_D), mask=row_ok[:, None] & own,
                    other=0.0)
    else:
        q = _load_tile(q_rows[:, None] + offs_d[None, :], q_pos, offs_d, q_len, HEAD_DIM_QK, BLOCK_D, True)
    q_t = q
    if HAS_TAIL:
        offs_dt = BLOCK_D + tl.arange(0, BLOCK_DT)
        q_t = tl.load(q_rows[:, None] + offs_dt[None, :], mask=row_ok[:, None] & (offs_dt < HEAD_DIM_QK)[None, :],
                      other=0.0)
    if RESCALE_Q:
        q_max = tl.max(tl.max(tl.abs(q.to(tl.float32)), 1), 0)
        if HAS_TAIL:
            q_max = tl.maximum(q_max, tl.max(tl.max(tl.abs(q_t.to(tl.float32)), 1), 0))
        # 2^(14 - ceil(log2 q_max)) from q_max's fp32 bits. A zero or subnormal q_max (exponent field 0) takes
        # 2^114, which keeps the factor finite and still lifts such a q into fp16's range.
        bits = q_max.to(tl.int32, bitcast=True)
        q_exp = ((bits >> 23) & 0xFF) - 127 + ((bits & 0x7FFFFF) != 0).to(tl.int32)
        q_mul = tl.exp2((14 - tl.maximum(q_exp, -100)).to(tl.float32))
        q = q.to(tl.float32) * q_mul
        q_t = q_t.to(tl.float32) * q_mul
        qk_scale_log2 = qk_scale_log2 / q_mul
    q = q.to(CDT)
    q_t = q_t.to(CDT)
    # FP8 descales, one per (batch, KV head): q's and k's scale every score, v's every output row (all in fp32).
    desc_idx = b * ((heads_eff * GP) // group) + kv_head
    if Q_DESCALE is not None:
        qk_scale_log2 = qk_scale_log2 * tl.load(Q_DESCALE + desc_idx)
    if K_DESCALE is not None:
        qk_scale_log2 = qk_scale_log2 * tl.load(K_DESCALE + desc_idx)
    slope_log2 = tl.zeros([BLOCK_M], dtype=tl.float32)
    if HAS_ALIBI:
        slope_log2 = tl.load(SLOPES + q_head) * LOG2E

    bt_row = BLOCK_TABLE
    if PAGED:
        # Paged cache: stride_kb / stride_vb are page strides; the block table supplies the page.
        bt_row = BLOCK_TABLE + b.to(tl.int64) * stride_bt
        k_base = K + kv_head.to(tl.int64) * stride_kh
        v_base = V + kv_head.to(tl.int64) * stride_vh
    else:
        k_base = K + b.to(tl.int64) * stride_kb + kv_head.to(tl.int64) * stride_kh
        v_base = V + b.to(tl.int64) * stride_vb + kv_head.to(tl.int64) * stride_vh
    if K_OFFSET:
        k_base += k_start.to(tl.int64) * stride_ks
        v_base += k_start.to(tl.int64) * stride_vs
    k_desc = k_base
    v_desc = v_base
    if TMA == 2:
        k_desc = K_DESC
        v_desc = V_DESC
    if TMA == 1:
        k_desc = tl.make_tensor_descriptor(k_base, shape=[tl.maximum(k_len, 1), HEAD_DIM_QK],
                                           strides=[stride_ks, 1], block_shape=[BLOCK_N, BLOCK_D])
        v_desc = tl.make_tensor_descriptor(v_base, shape=[tl.maximum(k_len, 1), HEAD_DIM_V],
                                           strides=[stride_vs, 1], block_shape=[BLOCK_N, BLOCK_DV])

    # Key range this block can see, and the sub-range every one of its rows sees in full.
    i_min = row0 // GP
    i_max = tl.minimum((row0 + BLOCK_M - 1) // GP, q_len - 1)
    lo = 0
    full_lo = 0
    hi = k_len
    full_hi = k_len
    if MASK_LEFT:
        lo = tl.maximum(i_min + diag - window_left, 0)
        full_lo = tl.maximum(i_max + diag - window_left, 0)
    if MASK_RIGHT:
        hi = tl.maximum(tl.minimum(i_max + diag + window_right + 1, k_len), 0)
        full_hi = tl.maximum(tl.minimum(i_min + diag + window_right + 1, k_len), 0)
    if SPLIT:
        # Split-KV: this program sees only its chunk of the keys; chunks are whole tiles, so no tile
        # straddles two splits. A split with no visible key writes o = 0, lse = -inf (merged away).
        n_splits = tl.num_programs(2)
        chunk = tl.cdiv(tl.cdiv(k_len, n_splits), BLOCK_N) * BLOCK_N
        split_lo = tl.program_id(2) * chunk
        split_hi = tl.minimum(split_lo + chunk, k_len)
        lo = tl.maximum(lo, split_lo)
        full_lo = tl.maximum(full_lo, split_lo)
        hi = tl.maximum(tl.minimum(hi, split_hi), 0)
        full_hi = tl.maximum(tl.minimum(full_hi, split_hi), 0)
    lo = (lo // BLOCK_N) * BLOCK_N
    mid_lo = lo           # without a left window no row's first keys are masked: lo = full_lo, tile-aligned
    if MASK_LEFT:
        mid_lo = tl.minimum(tl.maximum(lo, tl.cdiv(full_lo, BLOCK_N) * BLOCK_N), tl.maximum(hi, lo))
    mid_hi = tl.maximum(mid_lo, (full_hi // BLOCK_N) * BLOCK_N)

    acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    acc, l_i, m_i = _attn_run(acc, l_i, m_i, q, q_t, k_base, v_base, k_desc, v_desc, b, kv_head, lo, mid_lo,
                              q_pos, slope_log2, diag, window_left, window_right, k_len, stride_ks, stride_vs,
                              bt_row, page_size, stride_kb, stride_vb, PAGED, PAGE_TILE, qk_scale_log2, softcap, HEAD_DIM_QK,
                              HEAD_DIM_V, BLOCK_N, BLOCK_D, BLOCK_DT,
                              BLOCK_DV, HAS_TAIL, True, MASK_LEFT, MASK_RIGHT, HAS_SOFTCAP, HAS_ALIBI, TMA, V_WORDS,
                              NUM_STAGES)
    acc, l_i, m_i = _attn_run(acc, l_i, m_i, q, q_t, k_base, v_base, k_desc, v_desc, b, kv_head, mid_lo, mid_hi,
                              q_pos, slope_log2, diag, window_left, window_right, k_len, stride_ks, stride_vs,
                              bt_row, page_size, stride_kb, stride_vb, PAGED, PAGE_TILE, qk_scale_log2, softcap, HEAD_DIM_QK,
                              HEAD_DIM_V, BLOCK_N, BLOCK_D, BLOCK_DT,
                              BLOCK_DV, HAS_TAIL, False, MASK_LEFT, MASK_RIGHT, HAS_SOFTCAP, HAS_ALIBI, TMA, V_WORDS,
                              NUM_STAGES)
    acc, l_i, m_i = _attn_run(acc, l_i, m_i, q, q_t, k_base, v_base, k_desc, v_desc, b, kv_head, mid_hi, hi,
                              q_pos, slope_log2, diag, window_left, window_right, k_len, stride_ks, stride_vs,
                              bt_row, page_size, stride_kb, stride_vb, PAGED, PAGE_TILE, qk_scale_log2, softcap, HEAD_DIM_QK,
                              HEAD_DIM_V, BLOCK_N, BLOCK_D, BLOCK_DT,
                              BLOCK_DV, HAS_TAIL, True, MASK_LEFT, MASK_RIGHT, HAS_SOFTCAP, HAS_ALIBI, TMA, V_WORDS,
                              NUM_STAGES)

    # Epilogue: normalise; rows that saw no key have l = 0, m = -inf → output 0, LSE -inf.
    m_shift = tl.where(m_i == float("-inf"), 0.0, m_i)
    denom = l_i
    if HAS_SINKS and not SPLIT:
        # The sink joins the denominator only; LSE below still excludes it.
        sink_log2 = tl.load(SINKS + q_head) * LOG2E
        denom = denom + tl.exp2(sink_log2 - m_shift)
    denom = tl.where(denom == 0.0, 1.0, denom)
    if V_DESCALE is not None:
        denom = denom / tl.load(V_DESCALE + desc_idx)
    out = acc / denom[:, None]
    lse = m_i * LN2 + tl.log(l_i)

    if PAIR:
        HALF_DV: tl.constexpr = HEAD_DIM_V // 2
        o_cols = offs_dv[None, :] - half[:, None] * HALF_DV
        o_mask = row_ok[:, None] & ((offs_dv // HALF_DV)[None, :] == half[:, None])
    else:
        o_cols = offs_dv[None, :]
        o_mask = row_ok[:, None] & (offs_dv < HEAD_DIM_V)[None, :]
    last = True
    if SPLIT:
        # This split's part, in fp32 slabs (split, batch, seqlen_q, heads_q[, dv]) (packed queries too: a
        # sequence's rows from its own start, not from CU_Q's). With MERGE_PARTS, the last of a block's splits to
        # finish merges them (`combine.merge_parts`, MERGE_PARTS parts a round) into the output: the others'
        # stores are ordered before its reads by the barrier and the counter's acquire-release add, and it leaves
        # the counter zeroed for the next launch on its stream (`launch.zeroed_counter`). Without, `combine` does.
        PART_DV: tl.constexpr = HEAD_DIM_V // 2 if PAIR else HEAD_DIM_V
        part_rows = (b.to(tl.int64) * seqlen_q + q_pos) * (heads_eff * GP) + q_head
        o_part = O_PART + part_rows[:, None] * PART_DV + o_cols
        tl.store(o_part + tl.program_id(2).to(tl.int64) * stride_o_split, out, mask=o_mask)
        tl.store(LSE_PART + part_rows + tl.program_id(2).to(tl.int64) * stride_l_split, lse, mask=row_ok)
        last = False
        if MERGE_PARTS:
            tl.debug_barrier()
            slot = COUNTER + tl.program_id(0) * tl.num_programs(1) + tl.program_id(1)
            last = tl.atomic_add(slot, 1, sem="acq_rel", scope="gpu") == tl.num_programs(2) - 1
            if last:
                tl.atomic_xchg(slot, 0, sem="relaxed", scope="gpu")
                out, lse, empty = merge_parts(o_part, LSE_PART + part_rows, o_mask, row_ok, 0, tl.num_programs(2),
                                              stride_o_split, stride_l_split, MERGE_PARTS, True)
                if HAS_SINKS:
                    out = out * sink_keep(lse, empty, tl.load(SINKS + q_head))[:, None]
    if last:
        o_rows = (O + b.to(tl.int64) * stride_ob + (q_start + q_pos).to(tl.int64) * stride_os
                  + q_head.to(tl.int64) * stride_oh)
        tl.store(o_rows[:, None] + o_cols, out.to(O.dtype.element_ty), mask=o_mask)
        lse_ptrs = (LSE + b.to(tl.int64) * stride_lb + q_head.to(tl.int64) * stride_lh
                    + (q_start + q_pos).to(tl.int64) * stride_ls)
        tl.store(lse_ptrs, lse, mask=row_ok)


# ----------------------------------------------------------------------------------------------------------
# Launch: tile table, grid, descriptors. Callers pass validated tensors; nothing here checks arguments.

# The i32 arguments of `attn_fwd_kernel` that a decode call does not keep at multiples of 16 (head counts and
# groups, window bounds, the split slabs' and the LSE's strides); its pointers and other i32s are. The sm_90 compile
# checks (tests/test_compile_sm90.py, benchmarks/sass_diff.py) tell the JIT so, as a real call's arguments would:
# without it the loads look unaligned and are not pipelined at all.
DECODE_ODD_ARGS = frozenset({"heads_per_program_row", "group", "heads_eff", "window_left", "window_right",
                             "stride_o_split", "stride_l_split", "stride_lh", "stride_ls"})


def _split_head_dim(d):
    """head_dim → (BLOCK_D, BLOCK_DT): a power-of-two main part and a power-of-two tail (576 = 512 + 64)."""
    main = max(16, next_pow2(d))      # tl.dot needs K >= 16
    if main == d or d < 64:
        return main, 0
    main //= 2
    return main, max(16, next_pow2(d - main))


# (BLOCK_M, BLOCK_N, num_warps, num_stages) keyed by the padded head dim, on sm_90. Picked from
# benchmarks/tune_prefill.py on the H100 (benchmarks/results/tune_prefill_h100.json): at d=128,
# 128x128 with 8 warps and 3 stages (TMA K/V) was best in every case; 4 warps or 2 stages lost 10-50%.
_GPU_TILES = {
    16: (128, 128, 4, 3),
    32: (128, 128, 4, 3),
    64: (128, 128, 4, 3),
    128: (128, 128, 8, 3),
    256: (128, 64, 8, 2),
    512: (64, 32, 8, 1),
    1024: (64, 16, 8, 1),
}
# The interpreter is slow per op, not per element: small tiles keep multi-tile loops in small tests.
_INTERPRET_TILES = (32, 32, 4, 1)


# Decode-like calls (at most 64 packed query rows): wgmma's smallest M (64) instead of 128 wasted rows,
# 4 warps and 64-key tiles: benchmarks/results/tune_decode_h100.json, where (64, 64, 4, 2) beat
# (64, 128, 4, 3) by 8-29% and the prefill tiles (128, 128, 8, 3) by 10-59% at d=128.
# On the H200: speculative decodes of 8 / 16 rows a sequence, GQA 4 (32 / 64 packed rows), b = 64 at 4k keys and
# b = 4 at 131k, GB/s, one process a head dim and row count (history/probe_decode_64rows_*_h200_{31d8cc3,5a2d566}.json).
# - d = 64: (64, 64, 4, 2) 2813-2829 -> (64, 64, 4, 3) 4078-4112; (64, 64, 4, 5) 3832-3983, (64, 128, 4, 3)
#   3977-4050. At b = 4 / 1 with 131k keys: 2978 / 2728 -> 3976 / 3655; 5 stages 4121 / 3642.
# - d = 128: 3878-4101 -> (64, 64, 4, 3) 4255-4303; (64, 32, 4, 3) 3981-4188, 4 stages 3832-3862.
# - d = 256: 3144-3195 -> (64, 32, 4, 4) 3787-3980; (64, 32, 4, 3) 3685-3908, (64, 32, 4, 2) 3619-3770. At b = 4 / 1
#   with 131k keys: 3405 / 3226 -> 3965 / 3899.
# - d = 32 (later; 8 rows, ratios to cuDNN, which is slow at d = 32): (64, 64, 4, 2) 5.41 -> (64, 64, 4, 3) 6.58 at
#   b = 64 with 4k keys, 1.43 -> 1.67 at MHA b = 32 with 8k; split (b = 4 / 1 at 131k keys) 3.54 / 13.2 -> 5.59 /
#   20.3, and 4 stages 5.96 / 22.5 there (`_GPU_SPLIT_TILES`), 5.98 / 1.60 unsplit
#   (history/probe_decode_d32_contig_s8_h200_63cb7d4.json).
# - d <= 16 (the same cases): (64, 64, 4, 2) 6.26 / 1.70 -> (64, 64, 4, 4) 8.78 / 2.37 unsplit, 3.95 / 14.7 -> 8.01 /
#   27.9 split; 3 stages 8.14 / 2.30 and 6.46 / 23.3 (history/probe_decode_d16_contig_s8_h200_9282c91.json).
# Calls of at most this many packed rows take the decode tables (prefill's `_GPU_TILES` past it).
DECODE_ROWS = 64
_GPU_DECODE_TILES = {16: (64, 64, 4, 4), 32: (64, 64, 4, 3), 64: (64, 64, 4, 3), 128: (64, 64, 4, 3),
                     256: (64, 32, 4, 4)}
# Paged caches: 5 stages make the pipeliner fetch each tile's page numbers (cp.async) a stage before the tile
# and keep K/V two tiles ahead (three buffers; at d=256 they would not fit twice per SM). In
# benchmarks/results/probe_decode_h100.json this took page 16 from 0.945x to 0.970x cuDNN-on-a-contiguous-cache
# and page 64 / b=4 by 0.3-1.1%; on contiguous caches it lost 3.5%, so they keep the table above.
# Head dim 256 paged: (64, 32, 4, 3) in place of (64, 64, 4, 2), H200, page 16, 32 / 8 heads, 4k keys, packed
# queries over the cache, one process (history/probe_varlen_paged_d256_tiles_h200_e28c0a6.json), TFLOP/s: 32 x 16
# rows 188.0 -> 242.7, 64 x 8 rows 96.1 -> 126.7, 32 decodes + 32 x 20 / x 48 (the short launch's wide form) 88.5 /
# 153.6 -> 115.4 / 198.9; (64, 32, 4, 2) 234.9 / 122.0 / 116.2 / 198.9, (64, 16, 4, 3) 179.9 / 92.6 / 92.3 / 157.3,
# (64, 64, 8, 2) 160.0 / 82.3 / 72.3 / 126.0. Speculative decodes through attention_with_kvcache (the sweep above the
# contiguous table) kept it: GB/s at page 16 / 64 / b = 4 131k page 64, 8 rows a sequence, 3931 / 3866 / 3601 against
# (64, 32, 4, 2) 3792 / 3942 / 3744 and (64, 32, 4, 4) 3926 / 3852 / 3610. In that sweep d = 128 kept (64, 64, 4, 5)
# (4185-4306 at 8 rows; 3 stages 3669-3835, (64, 32, 4, 5) 3351-4005), and so did d = 64: (64, 64, 4, 3) gained at 4k
# keys (page 16, 8 / 16 rows, 3344-3384 -> 3556-3668; page 64, 8 rows, 3495 -> 3644) but lost at b = 4 with 131k keys
# on pages of 64, split, 3700 -> 2752 (history/probe_decode_64rows_d64_p64_s8_h200_5a2d566.json). The loss is the
# split's: 8 rows, page 64, ratios to cuDNN in one process, 3 / 5 stages, b = 64 at 4k keys unsplit 3.86 / 3.68, the
# same split in 2 (forced) 3.13 / 3.77, in 16 2.30 / 2.47, b = 4 at 131k (planned split) 2.95 / 3.88
# (history/probe_decode_d64_p64_s8_splits_h200_63cb7d4.json). So 3 stages, and more when split (`_GPU_SPLIT_TILES`).
_GPU_PAGED_DECODE_TILES = {16: (64, 64, 4, 5), 32: (64, 64, 4, 5), 64: (64, 64, 4, 3), 128: (64, 64, 4, 5),
                           256: (64, 32, 4, 3)}
# Split launches (a sequence's keys over several programs) of these tiles take other tiles of the same BLOCK_M and
# warps (the split was planned on those): {(paged, padded head dim, tiles): split tiles}. The 64-row ones take more
# stages, measured above (why a split launch wants the deeper pipeline is not known); the paged 16-row d = 128 one
# shorter key tiles, measured beside NARROW_ROWS.
# Paged d = 256 too: 8 rows, page 64, 131k keys, planned splits, GB/s best of 2 rounds in one process, 3 / 5 / 6
# stages, b = 4 3657 / 3816 / 3807, b = 1 3532 / 3740 / 3751 (history/probe_split_stages_d256_s8_h200_55cf5c8.json;
# a second process +5.1% / +6.7%, history/probe_confirm_d256_split_s8_h200_8cfc8c7.json), though its 5 stages take
# 132 KB of shared memory (compiled for sm_90, split): one program an SM where 3 stages' 98 KB fit two, which
# `_fitted` plans as one (b = 4 / 1, 131k keys, page 64: 4 / 16 splits, ratios to cuDNN 2.823 / 9.564, against 2.812 /
# 9.400 at the 8 / 33 of two an SM; history/probe_split_fits_d256_s8_h200_5f31355.json). In the same sweep
# (history/probe_split_stages_d*_s8_h200_55cf5c8.json) the contiguous d = 256 entry was level with 5 and 6 stages,
# the d = 128 entries level with or ahead of 4-6, and the contiguous d = 64 entry 1.5% behind 4 or 5 (two rounds; not
# taken). Paged d = 64 then went 5 -> 7 stages: 8 rows, GB/s in every round of two processes, b = 4 / b = 1 at 131k
# keys page 64, b = 16 at 32k page 16, 5 / 7 stages 3719-3739 / 3759-3814, 3527-3539 / 3599-3606, 3795-3815 /
# 3880-3888 (history/probe_confirm_d64_split7_s8_h200_0d3e5ab.json; the first process, 9 stages level with 7,
# history/probe_split_deep_d64_s8_h200_7bb95f1.json). Compiled for sm_90, split: 57 / 73 KB of shared memory, three
# programs an SM either way.
_GPU_SPLIT_TILES = {(True, 64, (64, 64, 4, 3)): (64, 64, 4, 7), (False, 32, (64, 64, 4, 3)): (64, 64, 4, 4),
                    (True, 256, (64, 32, 4, 3)): (64, 32, 4, 5), (True, 128, (16, 128, 4, 3)): (16, 64, 4, 6)}
# Calls with at most NARROW_ROWS packed rows (one query token, GQA groups up to 16): 16-row tiles (mma.sync; wgmma
# cannot go below 64 rows, 60 of them padding for a group of 4) and 128-key tiles. Paged: in two processes
# (benchmarks/results/history/probe_decode_m16*_h100_3e7c534.json, ratio to cuDNN on a contiguous cache) they
# beat the 64-row tiles above by 0.6% at page 16 (0.975 / 0.969 in both) and 0.9-1.0% at page 64 (0.986 / 0.976,
# 0.984 / 0.975), and were level or ahead on the long-context and MHA cases. Contiguous, on the H200
# (`history/probe_decode_contig_h200_b24d05f.json`, 2 rounds, CUDA graphs): 0.978 / 1.001 / 0.950 / 1.007 of cuDNN
# (b = 64 at 4k, b = 4 and 1 at 131k, MHA b = 32 at 8k) against the 64-row tiles' 0.943 / 0.943 / 0.936 / 0.957;
# 16-row tiles of 64 keys and 4 stages 0.985 / 0.975 / 0.972 / 0.997.
# Head dim 64 (before, the 64-row forms: 0.65 / 0.79 of cuDNN contiguous / page 64), H200, one process, GB/s
# (history/probe_bf16_d64_h200_2a22067.json; cuDNN on the contiguous cache 4435-4502): contiguous, b = 64 at 4k /
# b = 4 at 131k keys, (16, 64, 4, 4) 4292 / 4493 (the 64-row form 2888 / 3048; (16, 128, 2, 4) 4185 / 4324,
# (16, 64, 2, 6) 4133 / 4233, (16, 128, 4, 3) 3966 / 4447); paged, page 16 / page 64 / b = 4 at 131k page 64,
# (16, 64, 2, 6) 4279 / 4330 / 4369 (the 64-row form 3523 / 3415 / 3901; (16, 128, 2, 4) 4262 / 4339 / 4409 at 255
# registers, (16, 128, 4, 3) 4241 / 4298 / 3899, (16, 64, 4, 4) 3964 / 3911 / 2643).
# Head dim 256 (before, the 64-row forms: 0.77 / 0.70 of the cache's read contiguous / page 64), H200, one process,
# GB/s (history/probe_bf16_d256_h200_986a797.json; the cache's read 4485-4615, cuDNN on the contiguous cache
# 3403-3464): contiguous, b = 64 at 4k / b = 4 at 131k keys, (16, 32, 4, 4) 4523 / 4519 (the 64-row form 3855 /
# 3463; (16, 64, 4, 4) 4428 / 4549 at 255 registers, (16, 64, 4, 2) 3941 / 4599, (16, 32, 4, 6) 4301 / 4275);
# paged, page 16 / page 64 / b = 4 at 131k page 64, (16, 64, 4, 4) 4535 / 4535 / 4565 (the 64-row form 2551 / 3245
# / 3199; (16, 64, 4, 2) 4528 / 4520 / 4564, (16, 32, 4, 6) 4504 / 3529 / 4515, (16, 32, 4, 4) 4150 / 3489 / 4155).
# Head dim 64 paged, later: (16, 64, 2, 6) holds 168 registers, so six of its 2-warp programs share an SM when the
# grid has them (1024 programs: 32 KV heads x b = 32, or b = 128 x 8), and there it read 3886-3961 GB/s against
# cuDNN's 4420-4582; (16, 128, 2, 3), 255 registers (no spills, options on or off) and so four an SM, read 4206-4495
# on those grids and level or ahead on b = 64 x 8 (4351 against 4332), H200, one process
# (history/probe_bf16_d64_many_h200_aa075bf.json; the cases and the other tiles tried are in NOTES.md).
# The contiguous d = 128 tile (16, 128, 4, 3) holds 136 KB of shared memory, one program an SM, which a split plans
# for (`_fitted`). One KV head of 8 query heads (tensor parallelism's), H200, ratios to cuDNN at b = 64 4k / 16 8k /
# 128 2k: planned as two an SM 0.848 / 0.810 / 0.786, (16, 64, 4, 3), which fits two, 0.945 / 0.956 / 0.885
# (history/probe_decode_onekv_contig_tiles_h200_5594b33.json); this tile at one an SM (2 / 8 / 1 splits, forced)
# 0.975 / 0.950 / 0.979 (probe_decode_onekv_contig_splits_h200_5594b33.json), fitted by `fmha bench decode` 0.968 /
# 0.947 / 0.979 (decode_tp_heads_h200_5f31355.json).
# The paged d = 128 tile splits as (16, 64, 4, 6) (`_GPU_SPLIT_TILES`; compiled for sm_90, split, 70 KB and 149
# registers: three an SM, where two are counted). Ratios to cuDNN, H200, two processes, the split tile / the table's
# at the same planned split (history/probe_paged_split_tiles{,_confirm}_h200_*.json): one KV head of 8 query heads,
# b = 64 4k page 16 0.914 / 0.897 and 0.921 / 0.896, page 64 0.918 / 0.909 and 0.912 / 0.908, b = 16 8k page 64 0.920
# / 0.908 and 0.913 / 0.900, b = 32 4k page 16 0.904 / 0.866, b = 8 32k page 64 0.932 / 0.925; 32 / 8 heads at 131k
# keys, page 64, b = 1 0.984 / 0.964 and 0.979 / 0.966, but b = 4 0.982 / 0.988 and 0.974 / 0.986 (page 16 0.974 /
# 0.980). (64, 64, 4, 7) took b = 64 page 16 to 0.930 and lost b = 4 at 131k (0.963); (16, 64, 4, 8) and
# (64, 64, 4, 5) lost.
NARROW_ROWS = 16
# Calls of NARROW_ROWS to MID_ROWS packed rows (speculative decoding's 2-4 tokens a GQA group of 8, 8 a group of 4)
# where the 64-row tables above lost. d = 64 (before, (64, 64, 4, 3) both; chosen on 16-row cases and never swept
# at 32 rows), H200, b = 64, 256 query heads over 8 (32 rows of one token), 4k keys, one process, two rounds, GB/s
# (history/probe_bf16_32rows_d64_h200_bc904dc.json; the cache's read 4475 paged, 4504 contiguous): paged (page 64)
# (32, 64, 2, 6) 4035 (the 64-row tile 2659; (64, 128, 4, 3) 3555, (32, 64, 4, 4) 3355, (64, 64, 4, 5) 3329,
# (32, 128, 4, 3) 3321), contiguous (64, 128, 4, 3) 4055 (3537; (64, 64, 4, 5) 3974, (32, 128, 4, 3) 3870,
# (32, 64, 4, 4) 3666, (32, 64, 2, 6) 3463). A second process with the table in place, new / old tile
# (history/probe_mid_d64_confirm_h200_afbef6a.json): paged 4209 / 2667, contiguous 4197 / 3646; b = 4 at 131k keys
# (split) paged 4222 / 3790, contiguous 4345 / 4106. 8 query tokens a GQA group of 4 (32 rows; b = 64, 32 / 8
# heads, 4k keys; ratios to cuDNN, causal in brackets): page 16 4.43 / 4.02 (4.39 / 2.85), page 64 4.48 / 4.00
# (4.45 / 4.01), contiguous level (4.46 / 4.48, causal 4.39 / 4.45).
MID_ROWS = 32
# The 16-bit caches' tables above, as the FP8 ones below, by (paged, at most this many packed rows), the smaller
# bound first: {head dim: tiles}.
_GPU_16BIT_DECODE_TABLES = {
    (False, NARROW_ROWS): {64: (16, 64, 4, 4), 128: (16, 128, 4, 3), 256: (16, 32, 4, 4)},
    (True, NARROW_ROWS): {64: (16, 128, 2, 3), 128: (16, 128, 4, 3), 256: (16, 64, 4, 4)},
    (False, MID_ROWS): {64: (64, 128, 4, 3)},
    (True, MID_ROWS): {64: (32, 64, 2, 6)},
}
# An FP8 (e4m3) KV cache, at most NARROW_ROWS packed rows, contiguous / paged: its tiles are half the bytes, and
# widening them costs instructions, so the tables above, tuned for bf16, do not carry over. Re-swept on the fp16
# math (one conversion per pair of values) in one H100 run (benchmarks/results/probe_fp8_decode_h100.json, GB/s of
# the FP8 bytes, 2 rounds): on the paged caches (page 16, page 64, b=4 and b=1 at 131k keys) 64 keys and 6 stages
# took 2569 / 2723 / 2777 / 2539 (128 keys, 5 stages, the earlier pick) to 2688 / 2756 / 2855 / 2613, and on the
# contiguous b=64 cache 128 keys and 3 stages took 2701 (4 stages) to 2772; a second run with these tables
# (history/probe_fp8_decode_confirm_h100_d86c752.json) held it: 2773 / 2694 / 2755 / 2851 / 2617 against 2703 /
# 2567 / 2720 / 2777 / 2537. Only d = 128 was measured. (The tiles before, picked while the math was bf16:
# benchmarks/results/history/probe_fp8_decode_tiles*_h100_*.json.)
# On the H200, whose reads are 1.4x faster, the paged form was instruction-bound at 0.62 of its read. Programs of
# 2 warps (fewer warps sharing each tile's row reductions and P's relayout: fewer instructions a key), with
# `plan_num_splits` giving such narrow programs four slots an SM, took it, new / old tiles in one process each,
# from 2799 / 2784 to 3640 / 3566 GB/s at pages 16 / 64 (history/probe_fp8_decode_warps_planner_h200.json) and
# from 2906 / 2684 to 3488 / 3124 at b = 4 / 1 with 131k keys (history/probe_fp8_decode_long_2warps_h200.json).
# Not re-measured on an H100, where the 4-warp form read at 0.90-0.97 of the cache's read. ncu on the H200 (b = 64,
# page 64; NOTES.md, sixty-fourth session) has the 2-warp form still bound by its instructions: DRAM at 72% of
# peak, ~1000 warp instructions a 64-key tile, a quarter of the stall samples on register copies (IMAD.MOV) and a
# quarter on shared-memory loads (V's byte gathers, q's reloads); the bf16 form waits on memory (DRAM 91.7%).
# Capping registers for five programs an SM was level (history/probe_maxnreg_fp8_h200.json). Reading V as 16-bit
# words (`FP8_V_WORDS` below) took out the byte gathers: see there.
# The contiguous form took 2-warp programs later, with 4 stages: (16, 128, 4, 3) -> (16, 64, 2, 4) read 3173 / 3242 /
# 2938 -> 3314 / 3443 / 3026 GB/s of FP8 bytes at b = 64 with 4k keys and b = 4 / 1 with 131k, in one process
# (history/probe_fp8_contig_tiles_h200.json), where the paged table's (16, 64, 2, 6) lost (2606 / 2861 / 2309).
# An FP8 cache with NARROW_ROWS to MID_ROWS packed rows (speculative decoding's 2-4 tokens a GQA group of
# 8, 16 heads a KV head): 32-row mma.sync tiles in place of the 64-row wgmma form, which read 2038 GB/s of FP8
# bytes (0.45 of the cache's read) at b = 64, 256 query heads over 8, page 64, 4k keys; paged, (32, 64, 2, 6) read
# 2480 there, (32, 128, 4, 3) 2323, (32, 64, 4, 6) 1982 (history/probe_fp8_32rows_h200.json, one process). The
# same shape on a contiguous cache took 128-key tiles of 4 warps, as its bf16 16-row table does: 64-row form 1816,
# (32, 128, 4, 3) 2449, (32, 64, 2, 4) 1965, (32, 64, 2, 6) 1878 (history/probe_fp8_32rows_contig_h200.json), and
# with the table in place 2445 against 1808 (..._confirm_h200.json). Only that shape was measured; bf16 calls of
# these rows keep the 64-row forms (32-row tiles lost there: history/probe_bf16_32rows_h200.json).
# Head dims 64 and 256 at 32 rows (before, the 64-row forms), H200, the same shape (b = 64, 256 query heads over 8,
# 4k keys), three rounds, GB/s of FP8 bytes (history/probe_fp8_32rows_d64_h200_f5865b9.json and its d256 twin):
# d = 64 paged (page 64) (32, 64, 2, 6) 2765 (the 64-row form 1832, the cache's read 3874; (32, 128, 2, 4) 2802,
# (32, 64, 2, 8) 2759, (32, 64, 2, 4) 2178, (32, 128, 4, 3) 1558), contiguous (32, 64, 2, 4) 2849 (1471; (32, 64, 2,
# 6) 2644, (32, 128, 2, 4) 2635, (32, 64, 4, 4) 1679); d = 256 paged (32, 128, 4, 2) 3364 (1622, read 4613; (32, 32,
# 2, 4) 2995, (32, 64, 4, 3) 2910, (32, 64, 4, 4) 2906, (32, 32, 4, 6) 2458), contiguous (32, 128, 4, 2) 3480 (1945,
# read 4695; (32, 64, 4, 3) 3292, (32, 64, 2, 3) 2984). A second process with these tables
# (history/probe_fp8_32rows_confirm_d64_h200_b7b5c5b.json, d256 twin; 2 rounds), the table's tile / the 64-row form:
# d = 64 paged 2723 / 1830, contiguous 2795 / 1464, paged b = 4 at 131k keys (split) 2722 / 1660, where (32, 128, 2,
# 4) read 2917 (2762 at b = 64); d = 256 paged 3278 / 1620, contiguous 3414 / 1954, b = 4 at 131k 3238 / 1880
# ((32, 64, 4, 3) 2878 / 3209 / 2856). d = 256's (88 KB, 255 registers) fits two an SM. d = 64 paged then took
# (32, 128, 2, 4) for d = 128's tile (32, 64, 2, 6), as a third process agreed (b = 64 2719 / 2697, b = 4 at 131k
# 2872 / 2680; history/probe_fp8_32rows_d64_p_h200_bc904dc.json): 20 KB and 255 registers, four an SM as
# `plan_num_splits` counts 2-warp programs.
# 33-64 packed rows (8 tokens a GQA group of 8) keep the 64-row wgmma form, which widens each FP8 tile in registers
# and stores it back for the wgmma, so it reads ~0.45 of the cache (in tokens a second 0.96 of a bf16 cache). d = 128,
# b = 64, 512 query heads over 8, 4k keys, GB/s of FP8 bytes (history/probe_fp8_64rows{,_paged}_h200_bc904dc.json,
# two processes): paged (page 64), (64, 128, 4, 3) 2153 / 2149 against the bf16 table's (64, 64, 4, 5) 2053 / 2058
# ((64, 128, 4, 4) 2148, two 32-row blocks a KV head (32, 64, 2, 6) 1556 and (32, 128, 4, 3) 1351, (64, 128, 8, 3)
# 1219, 2-warp mma.sync (64, 64, 2, 6) 540, its V read byte by byte); contiguous, the bf16 table's (64, 64, 4, 3)
# 2089 stays ((64, 128, 4, 3) 1755, (32, 128, 4, 3) 1528). With the entry in place, a third process
# (history/probe_fp8_64rows_confirm_h200_afbef6a.json): 2155 / 2055, and b = 4 at 131k keys (split) 2167 / 2058.
# Head dims 64 and 256 (16 rows; before, they took the 64-row wgmma form), H200, b = 64, 4k keys, one process per
# head dim, GB/s of FP8 bytes (history/probe_fp8_d{64,256}_h200_2770dbe.json): d = 64 contiguous (16, 64, 2, 4) 2944
# (the cache's read 3633; (16, 64, 2, 6) 2676, (16, 128, 4, 3) 2734, (16, 64, 4, 4) 2864), paged (page 64)
# (16, 64, 2, 6) 3306 (read 3569; the 64-row form 1489, (16, 128, 4, 3) 3123, (16, 64, 2, 4) 2486); d = 256
# contiguous (16, 64, 4, 4) 4111 (read 4527; (16, 64, 2, 4) 4092, (16, 128, 4, 3) 4066, (16, 64, 2, 3) 3355), paged
# (16, 64, 2, 3) 4284 (read 4449; the 64-row form 1919, (16, 64, 4, 4) 3814, (16, 64, 2, 4) 4278).
# The FP8 tables above, by (paged, at most this many packed rows), the smaller bound first: {head dim: tiles}.
_GPU_FP8_DECODE_TABLES = {
    (False, NARROW_ROWS): {64: (16, 64, 2, 4), 128: (16, 64, 2, 4), 256: (16, 64, 4, 4)},
    (True, NARROW_ROWS): {64: (16, 64, 2, 6), 128: (16, 64, 2, 6), 256: (16, 64, 2, 3)},
    (False, MID_ROWS): {64: (32, 64, 2, 4), 128: (32, 128, 4, 3), 256: (32, 128, 4, 2)},
    (True, MID_ROWS): {64: (32, 128, 2, 4), 128: (32, 64, 2, 6), 256: (32, 128, 4, 2)},
    (True, DECODE_ROWS): {128: (64, 128, 4, 3)},
}
# How the mma.sync forms read an FP8 V (`_fp8_word_halves`): 2 as 16-bit words split by byte permutes, 1 the same
# split in triton.language (what the interpreter runs), 0 byte by byte as before. The loop of the paged 2-warp form
# (16, 64, 2, 6), SASS for sm_90 compiled here, a warp a 64-key tile: 0 -> ~1000 instructions and 250 registers,
# 1 -> 900 and 138, 2 -> 707 and 138 (128 `LDS.U8` -> 8 `LDSM.16.MT88.4` and 64 `PRMT`). H200, one process, the
# tables' tiles, GB/s of FP8 bytes, modes 0 / 1 / 2: b = 64, 4k keys, page 64 3394 / 3770 / 4080 (the cache's read
# 4451), page 16 3526 / 3850 / 4036, contiguous 3346 / 3804 / 4018, b = 4 / 1 with 131k keys 3447 / 3762 / 4177 and
# 3147 / 3468 / 3558; the 32-row form (256 query heads) at page 64 2534 / 2833 / 3130, contiguous 2382 / 2839 / 3088
# (history/probe_fp8_v_words_h200_23d1441.json). With mode 2 the tables' tiles still led (16, 128, 2, 3),
# (16, 128, 4, 3) and (16, 64, 4, 6) in the same run.
FP8_V_WORDS = 2
# The decode tables in the order `_tile_config` tries them, the first holding the head dim wins: (FP8 caches only,
# paged or not, at most this many packed rows, table). An FP8 call with no FP8 entry takes the bf16 ones.
_DECODE_LOOKUP = (
    *((True, paged, bound, table) for (paged, bound), table in _GPU_FP8_DECODE_TABLES.items()),
    *((False, paged, bound, table) for (paged, bound), table in _GPU_16BIT_DECODE_TABLES.items()),
    (False, False, DECODE_ROWS, _GPU_DECODE_TILES),
    (False, True, DECODE_ROWS, _GPU_PAGED_DECODE_TILES),
)
# Head pairs (`HEAD_PAIRS`) take their own entry here first, by paged or not: {2 x head dim: tiles}; else the
# tables above at twice the head dim. Contiguous, H200, one process, b = 64 x 8 KV heads x 4 q-heads at 4k keys, GB/s
# in two runs (history/probe_pair_tiles_h200_c585d73.json, probe_pair_tiles_contig_h200_c585d73.json):
# (16, 64, 4, 2) 4402 / 4401 against the d = 256 entry (16, 32, 4, 4) 4334 / 4323, (16, 32, 4, 3) 4380 / 4378,
# (16, 64, 4, 3) 4371 / 4374, (16, 32, 4, 6) 4221, (16, 32, 4, 8) over the shared memory. Paged, the d = 256 entry
# (16, 64, 4, 4) stays: page 16 / page 64 4354 / 4383 against (16, 64, 4, 3) 4354 / 4385, (16, 64, 4, 2) 4337 /
# 4367, (16, 32, 4, 6) 4336 / 4357, (16, 32, 4, 3) 4000 / 3853. (The same run's 256 q-head case, which does not
# pair, read 4000-4046 over six identical calls: the spread of one call's timing there.)
_GPU_PAIR_DECODE_TILES = {False: {256: (16, 64, 4, 2)}, True: {}}
# Every decode tile table, for the benchmark scripts that substitute tiles in all of them.
_GPU_DECODE_TABLES = (*(table for *_, table in _DECODE_LOOKUP), *_GPU_PAIR_DECODE_TILES.values())


def tile_key(dqk, dv):
    """The tile tables' key for head dims dqk and dv: the wider padded to a power of two, at least 16."""
    return max(16, next_pow2(dqk), next_pow2(dv))


def _tile_config(dqk, dv, interpret, rows=None, paged=False, kv_fp8=False, pair=False):
    """Tiles for a call whose programs hold `rows` packed query rows (None: prefill-sized) on a paged KV cache
    or not, FP8 or not; `pair`: a head-pair decode (dqk and dv the pair's widths)."""
    if interpret:
        return _INTERPRET_TILES
    key = tile_key(dqk, dv)
    if pair and key in _GPU_PAIR_DECODE_TILES[bool(paged)]:
        return _GPU_PAIR_DECODE_TILES[bool(paged)][key]
    if rows is not None:
        for fp8_only, table_paged, bound, table in _DECODE_LOOKUP:
            if ((kv_fp8 or not fp8_only) and table_paged == bool(paged) and rows <= bound
                    and key in table):
                return table[key]
    return _GPU_TILES[key]


def v_words_mode(kv_fp8, block_m, interpret=False):
    """`attn_fwd_kernel`'s V_WORDS for tiles of `block_m` rows (`_fp8_word_halves`): an FP8 V in the mma.sync
    forms (fewer than 64 rows) as 16-bit words, the interpreter's form in any tile; else 0 (V as it is)."""
    if not kv_fp8 or (block_m >= 64 and not interpret):
        return 0
    return 1 if interpret else FP8_V_WORDS


# Register caps (Triton's `maxnreg`) by (FP8 caches only, padded head dim, BLOCK_M, BLOCK_N, num_warps), FP8-only
# entries marked as `_DECODE_LOOKUP` marks the tile tables'. The 4-warp 64-row form of 64-key tiles at d = 64 is four
# programs an SM within 128 registers a thread (its 41-57 KB of shared memory fit four), and ptxas took many of its
# compiles past 128, three an SM: compiled for sm_90 (benchmarks/experiments/
# split_compile.py MAXNREG=128, a sweep of paged / contiguous, bf16 / FP8, seqlen_q 1 / 16, causal or not, split or
# not), an FP8 cache 138-159 registers in every case but one-token paged unsplit (128), bf16 one-token 136-145 as the
# constant seqlen_q (the twin below: 127), bf16 16 tokens split contiguous 135-147; capped, 121-128 with no spills on
# the FP8 forms and 8-24 bytes of stack on some bf16 ones. H200, one process, GB/s (FP8 bytes for FP8; b = 64, 8 KV
# heads, 4k keys; history/rows64_cap_h200_0978768.json, means of two rounds): one token of 512 query heads on a
# contiguous FP8 cache 1478 -> 2116 (159 -> 126 registers), 16 causal query tokens a GQA group of 4 on 16-key pages
# 2670 -> 3532 (150 -> 126), the rest level: bf16 one token paged / contiguous / split (b = 4 at 131k keys) 3520 /
# 4051 / 3544 -> 3514 / 4000 / 3561, 16 tokens unmasked at page 16, causal at page 64 / contiguous / split within
# 0.6%; FP8 one token paged 1819 -> 1798 (128 -> 126). The 64-row 128-key form (contiguous d = 64, 17-32 rows) is two
# programs an SM by its 106 KB, and spills 40-80 bytes at 128: not capped. A second process, capped / uncapped
# alternating (history/rows64_cap_confirm_h200_c442fbc.json, means of two rounds): FP8 16 query tokens a GQA group of
# 4 paged (page 64) 1192 -> 1824, contiguous 1789 -> 2107; FP8 one token contiguous 1477 -> 2103, paged 1820 -> 1794
# (the one loss past 1%, taken with the rule: that form was already 128 registers; on the twin below since, 1845);
# 16 causal tokens at page 16 2669 -> 3486; the other ten cases (bf16 one token and 16 tokens, paged, contiguous,
# split at b = 4 with 131k or 32k keys) within 0.8%.
# FP8 caches only (their entries looked up first): the contiguous table's 32-row form at d = 64, (32, 64, 2, 4),
# compiled for sm_90 to 168 registers and 8 bytes of stack, six 2-warp programs an SM. The cap that wins is not the
# one that would add a program: at 144 (seven an SM) the split launches were level, at 160 (still six) every case
# read 2-5% more, in three processes (history/rows32_cap{,_confirm,_third}_d64_h200_*.json; figures in NOTES.md,
# ninety-fifth session). Caps measured and not taken there and since: the FP8 paged 32-row forms at d = 64 / 128
# and the FP8 narrow forms at d = 128.
_GPU_MAXNREG = {(False, 64, 64, 64, 4): 128, (True, 64, 32, 64, 2): 160}


def _register_cap(dqk, dv, tiles, wide, interpret, kv_fp8=False):
    """Triton's `maxnreg` for a portable launch of `tiles` (`_GPU_MAXNREG`, its FP8-only entries first for an FP8
    cache), or None: none in the interpreter, nor for a launch with further forms (`wide`, whose tiles share the
    kernel and were not measured capped)."""
    if interpret or wide:
        return None
    block_m, block_n, num_warps, _ = tiles
    key = (tile_key(dqk, dv), block_m, block_n, num_warps)
    for fp8_only in ((True, False) if kv_fp8 else (False,)):
        cap = _GPU_MAXNREG.get((fp8_only, *key))
        if cap:
            return cap
    return None


# Triton compiles an i32 argument of 1 as the constant 1, so one-token calls (seqlen_q = 1) run a form of their own.
# In the 64-row (wgmma) forms the constant costs registers: compiled for sm_90 (benchmarks/experiments/
# split_compile.py with seqlen_q=1 as a constexpr), paged d = 64 (64, 64, 4, 3) 127 -> 142, four programs an SM ->
# three; paged d = 16 (64, 64, 4, 5) 90 -> 98, five -> four. H200, one process, GB/s, the package's kernel against
# one with seqlen_q unspecialised (history/probe_nospec_d{16,64,128,256}_h200_e8f795b.json): d = 64, b = 64, one token
# of 512 query heads over 8 (64 packed rows), 4k keys, page 64 2642 -> 3543, contiguous 3457 -> 4065 (the same
# tile read 3550 / 4050 with those 64 rows as 16 tokens of 4 heads, history/probe_gp_shape_h200_b0476d1.json);
# d = 16 (64-row forms at one token too) page 64 1715 -> 1750, page 16 1862 -> 1854. The 16-row forms keep the
# constant: unspecialised, d = 64 one-token decodes lost 0.2-0.5% (page 16 4170 -> 4148, contiguous 4185 -> 4170,
# b = 4 at 131k 4339 -> 4328) and d = 128 / 256 were level (issue 3's rows within 0.1%, b = 1 at 131k +0.5%); one
# token over an FP8 cache in them (8 or 4 rows a KV head, 16-key / 64-key pages, contiguous, split) was level too,
# -0.6..+1.3% at d = 64 / 128 (history/twin_narrow_fp8_d{64,128}_h200_9614f36.json, whose "commit" field was mistyped).
# A second process with the twin in place (history/probe_rows64_d64_confirm_h200_122dc5a.json, the same one-token
# case): bf16 paged 3725 GB/s (0.81 of the cache's read; 0.59 before), contiguous 4224 (0.91; 0.77). One token of 512
# query heads over 8 (64 rows) at d = 128 / 256 (history/rows64_const_d{128,256}_h200_d90267a.json): the twin level
# with the constant at d = 128, 2-5% ahead at d = 256. FP8 caches take the twin too since the register cap above:
# uncapped, the twin had taken the paged d = 64 FP8 form from 128 to 140 registers (1838 -> 1190 GB/s of FP8 bytes);
# under the cap it is 125, and at d = 16-256 the twin was level or ahead of the constant in two processes (losses
# within 0.35%; history/twin_fp8_d*_h200_683d184.json, twin_fp8_confirm_d*_h200_fca6043.json, NOTES.md).
_UNSPECIALISED_Q = {}


def _forward_kernel(block_m, seqlen_q):
    """The kernel a launch of `block_m`-row tiles and `seqlen_q` (its first scalar) takes: `attn_fwd_kernel`, or
    for 64-row tiles and a seqlen_q of 1 (16-bit or FP8 cache) the same function jitted with seqlen_q never
    specialised (which would also drop its divisibility by 16 for other values: those keep `attn_fwd_kernel`). Made
    once per kernel object, so that probes which swap `attn_fwd_kernel` for a patched copy (and empty `_PLANS`,
    which hold the pick) get that copy's twin."""
    kernel = attn_fwd_kernel
    if block_m < 64 or seqlen_q != 1:
        return kernel
    twin = _UNSPECIALISED_Q.get(kernel)
    if twin is None:
        twin = _UNSPECIALISED_Q[kernel] = triton.jit(kernel.fn, do_not_specialize=["seqlen_q"])
    return twin


def _tma_ok(t, d, block_d):
    """Device-side TMA descriptors need 16-byte aligned base and row stride, and a box of <= 256 columns."""
    es = t.element_size()
    return (d == block_d and d <= 256 and t.data_ptr() % 16 == 0
            and all((s * es) % 16 == 0 for s in t.stride()[:-1]))


# A varlen call over a KV cache on the Gluon kernel leaves its sequences of at most SHORT_TILE_ROWS // group query
# rows (at least 1, at most DECODE_ROWS; DECODE_ROWS // 2 where the Gluon launch pairs two query heads' tails of at
# most 64 rows in one item, `forward_sm90.pairs_tails`) to a second launch of the portable kernel
# (`attention_forward`): there a sequence's rows of every query head of a KV head share decode tiles (M blocks of at
# most DECODE_ROWS packed rows) and each tile reads the keys once, where the Gluon kernel would give each query head
# its own 128-row item, filled to rows / 128. The launch has two tile forms (`_short_tiles`): the decodes' (at most
# NARROW_ROWS packed rows) and DECODE_ROWS' table's for the longer sequences (speculative decodes); where the two
# differ in warps, the decodes' form alone, for NARROW_ROWS // group rows. Its splits are planned on one M block a
# sequence (the decodes').
# H200, page 16, d = 128, 32 sequences of R rows beside a 512-row chunk, 4k keys, TFLOP/s against
# `attention_with_kvcache` called per group (history/probe_varlen_paged_{groups,cap}G_h200_a91f978_mblocks.json):
# 32 / 8 heads R = 32 0.51 -> 0.91 with SHORT_TILE_ROWS 128 or 256, R = 64 +1.6% at 256; 64 / 8 heads R = 16
# 0.32 -> 0.92 (128), R = 32 0.52 -> 0.91 (256), R = 64 -2.4% at 512 (so not); 32 / 16 heads R = 64 +7.9% at 128;
# MHA R = 128 -36% at 128 (so the cap at DECODE_ROWS, as before for MHA). Decodes alone and with 512 / 2048-row
# chunks within 0.2% of 64. With the Gluon tails paired (b36aebf, history/probe_varlen_paged_pairtails_g{2,4,8}_h200_
# b36aebf.json), ours / the calls: 32 / 8 heads R = 64 0.59 -> 0.99 and R = 48 1.11 -> 1.45 on the Gluon kernel
# (R = 32 stays: Gluon 6% behind the portable there); 32 / 16 heads R = 64 0.68 -> 0.99, R = 48 0.89 -> 1.29; 64 / 8
# heads already at 32 rows (R = 32 within 2% either way); 4 x 512 alone within 1%.
# Earlier: against SHORT_TILE_ROWS = 16 (the narrow form alone), 32 sequences of 8 / 16 rows beside a 512-row chunk
# 2.86x / 2.83x (history/probe_varlen_paged_h200_3639ce1.json); the merge (`combine`) skips its programs that hold
# none of their sequence's rows (history/probe_varlen_paged_combine_h200_83c89ae+combine.json: 32 decodes + 2 x 512,
# 4 x 512 and 8 decodes + 2048 at 16k keys 0.981 / 1.003 / 0.993 of the narrow form alone). The rest is the decodes'
# share of the wide form's 113 KB of shared memory (the narrow form's: 72 KB): a 32-key wide tile (64, 32, 4, 5), in
# 72 KB, took back 0.4-1.0% there and cost the speculative decodes 0.4-1.5% (three processes:
# ..._wide_h200_83c89ae.json, ..._wide2_..., ..._combine_...), so the 64-key tile stays.
# A third form of 128 rows (128, 32, 4, 4) for sequences of more than DECODE_ROWS packed rows took 1.035-1.055 on
# 17-32-row sequences (9-32 in a group of 8) beside a 512-row chunk on 16-key pages, but lost 2-4% on pages of 32-128
# keys and, compiled in, cost decodes beside a chunk 0.7-0.8% on 16-key pages (H200, NOTES.md, eighty-second
# session): not kept; the kernel's WIDE still takes several forms (`probe_varlen_paged --wide` times them).
SHORT_TILE_ROWS = 4 * DECODE_ROWS

# The two launches run side by side: the Gluon one on a second stream of the device (`_side_stream`), which first
# waits for the caller's stream, the short one on the caller's, which then waits for the second (a fork and a join,
# so a CUDA graph captures both). A mixed batch's few chunk items leave most SMs to the decodes meanwhile. H200,
# page 16, 32 / 8 heads, d = 128, CUDA graphs, side by side / one after the other (SIDE_STREAM off), in one process
# (history/probe_varlen_paged_side_graph_h200_698eca0.json, ..._side_graph2_h200_5d2e804.json): 4k keys, 128
# decodes + a 64-row chunk 1.044, 32 decodes + 128 rows 1.058, 64 decodes + 2 x 512 1.033, 32 x 16 rows + 512
# 1.036, 32 x 32 rows + 512 1.032; 256 decodes + 4 x 256 at 2k keys 1.050; 8 decodes + 2048 rows at 16k 1.014;
# 4 decodes + 8192 rows at 8k 1.006; chunks alone 0.993-1.011 (..._side_chunks_h200_01f11ab.json). Against a call
# per group, 128 decodes + 64 rows 0.909 -> 0.953, 32 decodes + 128 rows 0.944 -> 0.996. On the host, the fork and
# the join (two event records and waits, the events and the caller's `Stream` kept, the streams set through
# torch._C), the public call's host time, medians of 9 alternating rounds (probe_varlen_paged --eager
# --host-rounds 9), ours - one stream: +8.4 / +8.6 us on 152 / 169 (32 decodes + 128 rows, 128 decodes + 64 rows;
# history/probe_varlen_paged_side_host_rounds_h200_7cb56e8.json; +34 us before 53a62b0). CUDA graphs leave the
# host out.
SIDE_STREAM = True
_SIDE_STREAMS = {}

# Packed queries over a KV cache that the Gluon kernel does not take, whose longest sequence holds more packed rows
# than the decode tiles (DECODE_ROWS) but no more than the short launch's forms take (`_short_cap`: 17-64 rows a
# sequence in a group of 4, 9-32 in one of 8), and whose sequences are of mixed lengths (their mean rows, the
# tokens over the sequences, at most SHORT_ALONE_MEAN of the longest's: decodes among them), run as the short launch
# alone: the decodes in the narrow tiles, the longer ones in the wide form's M blocks, in place of one prefill tile
# a sequence (a decode's rows in a 128-row tile). H200, page 16, 32 / 8 heads, d = 128, 4k keys, CUDA graphs, short
# launch alone / one prefill tile a sequence, in one process (history/probe_varlen_paged_short_alone_h200_*.json):
# 64 decodes + 2 x 48 rows 1.703 (0.568 -> 0.967 of a call per group), 128 decodes + 40 rows 1.758 (0.593 -> 1.036),
# 32 decodes + 32 x 20 rows 1.174; sequences of one length lose (32 x 32 0.895, 32 x 24 0.894; 8 x 48 1.021, 4 x 63
# at 16k 0.993), which SHORT_ALONE_MEAN leaves on the prefill tiles. Nor where the sequences hold more than
# SHORT_ALONE_PACKED packed rows on average (group x the mean rows): there most of them are long, and each of their
# 64-row M blocks reads the keys that one 128-row tile would read for two. Same setting, short launch alone / prefill
# tiles, by mean packed rows (history/probe_varlen_paged_short_alone_{mean,g8}_h200_29bd4fa.json, ..._{g4b,g8b}_h200_
# 15cc96d.json): 64 / 8 heads 16 x 32 + 16 x 16 (192) 0.911, 32 / 8 heads 16 x 64 + 16 x 32 (192) 1.007 (left out); 64 /
# 8 heads 32 decodes + 32 x 32 (132) 1.055, 32 / 8 heads 16 x 48 + 16 x 20 (136) 1.013, 16 x 48 + 16 x 10 (116) 1.397,
# 16 x 32 + 16 x 16 (96) 1.126, 32 decodes + 32 x 48 (98) 1.309 (kept). Page 64 and d = 64 as at page 16 (64 decodes + 2
# x 48 1.509 / 1.894, 32 decodes + 32 x 20 1.058 / 1.123); d = 256 with its 64-row paged tiles of b5aab9c (above), 32
# decodes + 32 x 20 / x 48 1.061 / 1.179 (history/probe_varlen_paged_d256_confirm_h200_b5aab9c.json).
SHORT_ALONE = True
SHORT_ALONE_MEAN = 0.75
SHORT_ALONE_PACKED = 160


class _SideStream:
    """A device's second stream and the two events of a fork (`fork`: it waits for the caller's stream's work so
    far and becomes the current stream) and a join (`join`: the caller's stream current again, waiting for its
    work), kept: an event made each call would cost host time (torch's `wait_stream` makes one), and so would
    `torch.cuda.stream`'s context and `torch.cuda.current_stream` (4.5 us on the device's host: a `Stream` made
    each call; the callers' streams are kept here by their ids instead, `callers`); the caller's device is current
    (`_side_stream`). One fork at a time: the stream is the calling thread's."""
    __slots__ = ("stream", "forked", "joined", "ids", "callers", "caller", "caller_ids")

    def __init__(self, device):
        self.stream = torch.cuda.Stream(device)
        self.forked, self.joined = torch.cuda.Event(), torch.cuda.Event()
        self.ids = self.stream.stream_id, self.stream.device_index, self.stream.device_type
        self.callers, self.caller, self.caller_ids = {}, None, None

    def fork(self):
        ids = torch._C._cuda_getCurrentStream(self.ids[1])      # (stream_id, device_index, device_type)
        caller = self.callers.get(ids)
        if caller is None:
            if len(self.callers) >= 64:
                self.callers.clear()
            caller = self.callers[ids] = torch.cuda.Stream(stream_id=ids[0], device_index=ids[1],
                                                           device_type=ids[2])
        self.caller, self.caller_ids = caller, ids
        self.forked.record(caller)
        self.stream.wait_event(self.forked)
        _set_stream(self.ids)

    def back(self):
        """The caller's stream current again (the join does it too, for a launch that raised)."""
        _set_stream(self.caller_ids)

    def join(self):
        self.back()
        self.joined.record(self.stream)
        self.caller.wait_event(self.joined)


def _set_stream(ids):
    """`torch.cuda.set_stream` of the stream of `ids` (stream_id, device_index, device_type), without its two
    Python frames."""
    torch._C._cuda_setStream(stream_id=ids[0], device_index=ids[1], device_type=ids[2])


def _side_stream(device):
    """The `_SideStream` of a CUDA `device` for the calling thread (made once: the events' record and wait of one
    call must not interleave with another thread's); None for another device or where `device` is not the current
    one (the public calls make it so: `_ops.custom_op`)."""
    if device.type != "cuda" or device.index != torch.cuda.current_device():
        return None
    key = device, threading.get_ident()
    side = _SIDE_STREAMS.get(key)
    if side is None:
        side = _SIDE_STREAMS[key] = _SideStream(device)
    return side


def _short_tiles(dqk, dv, group, paged, interpret, rows=None, paired=False):
    """The short launch's (rows, tiles, wide): the query rows of its longest sequences (`rows` if given, else from
    SHORT_TILE_ROWS, at most DECODE_ROWS, or half that where the Gluon launch pairs two heads' tails: `paired`,
    `forward_sm90.pairs_tails`), its tiles, and a tuple of further forms' tiles (BLOCK_M, BLOCK_N, num_warps,
    num_stages), BLOCK_M rising (the kernel's WIDE; None: no further form), for sequences of more packed rows than
    the first holds: here one, of at most DECODE_ROWS packed rows; a sequence of more takes several of its tiles
    (the launch's M blocks)."""
    one = rows is not None
    rows = rows or _short_cap(group, paired)
    # Past NARROW_ROWS packed rows the 64-row tables' form (the MID_ROWS tables were measured on calls of one
    # query length, not beside a chunk).
    packed = rows * group
    tiles = _tile_config(dqk, dv, interpret, rows=packed if packed <= NARROW_ROWS else DECODE_ROWS, paged=paged)
    narrow_rows = min(NARROW_ROWS // group, rows)
    if narrow_rows == 0 or narrow_rows == rows:
        return rows, tiles, None
    narrow = _tile_config(dqk, dv, interpret, rows=narrow_rows * group, paged=paged)
    if narrow == tiles:
        return rows, tiles, None
    if narrow[2] != tiles[2]:
        return (rows, tiles, None) if one else (narrow_rows, narrow, None)
    return rows, narrow, (tiles,)


def _short_cap(group, paired=False):
    """The most query rows a sequence the short launch's forms take (`_short_tiles`), in a GQA group of `group`."""
    return max(1, min(SHORT_TILE_ROWS // group, DECODE_ROWS // 2 if paired else DECODE_ROWS))


def _pack_gqa(group, seqlen_q, block_m):
    """Pack a group's query heads into the M tile when one head's queries would not fill it."""
    return group > 1 and seqlen_q * 2 <= block_m


def _strides(t, varlen):
    """(batch, token, head) strides; varlen sequences are addressed by token offset, so batch stride is 0."""
    return (0 if varlen else t.stride(0)), t.stride(1), t.stride(2)


_allocator_device = [None]


def _ensure_allocator(device):
    """Device-side descriptors need a scratch allocator; point Triton at torch's allocator for this device."""
    if _allocator_device[0] == device:
        return
    import torch

    def alloc(size, alignment, stream):
        return torch.empty(size, dtype=torch.int8, device=device)

    triton.set_allocator(alloc)
    _allocator_device[0] = device


def _page_tile(page_size, block_n):
    """Keys of a BLOCK_N tile that share one page, when pages tile it evenly: block_n (a tile inside one page),
    page_size (whole power-of-two pages inside one tile), or 0 (look each key's page up)."""
    if page_size % block_n == 0:
        return block_n
    if block_n % page_size == 0 and page_size & (page_size - 1) == 0:
        return page_size
    return 0


# A KV-cache call takes the Gluon kernel from this many query rows a sequence (chunked prefill), when its 128-row work
# items fill at least GLUON_CACHE_MIN_FILL of the waves they run in: the portable kernel packs a GQA group's rows of
# a short chunk into one tile and splits the keys to fill the GPU. `results/probe_kvcache_h100.json` (CUDA graphs;
# b = 4, 32 / 8 heads, d = 128): a chunk of 64 rows (128 items, half of each one's rows empty) ran at 1.05x and 1.22x
# the portable kernel over 4k keys (contiguous, 16-key pages), 0.82x and 0.97x over 16k; from 128 rows 1.29-1.76x.
# `results/probe_kvcache_b1_h100.json`: at b = 1 (32 items) the split path ran 2-3x the unsplit Gluon kernel.
GLUON_CACHE_MIN_ROWS = 64
GLUON_CACHE_MIN_FILL = 0.6


def _gluon_takes(cache_seqlens, num_splits, batch, heads_q, seqlen_q, device, page_size=None):
    """Whether a call the Gluon kernel can run goes there: every call without a KV cache that asks for no split;
    a KV-cache call from GLUON_CACHE_MIN_ROWS query rows, unsplit, or left to choose (0) with its work items
    (128 rows of one head) filling GLUON_CACHE_MIN_FILL of their waves over the SMs. A paged cache only with pages
    of a multiple of 16 keys (SPEC.md's; smaller ones would take TMA boxes of under 16 rows, never run on a GPU):
    the portable kernel runs the others."""
    if cache_seqlens is None:
        return num_splits <= 1
    if seqlen_q < GLUON_CACHE_MIN_ROWS or num_splits > 1 or (page_size is not None and page_size % 16):
        return False
    items = batch * heads_q * cdiv(seqlen_q, 128)
    sms = num_sms(device)
    return num_splits == 1 or items >= GLUON_CACHE_MIN_FILL * sms * cdiv(items, sms)


# Decode over a KV cache whose heads are pairs of adjacent heads runs each pair as one head of twice the width, two
# KV heads a program (the kernel's PAIR): a paged cache's 512-byte rows of two heads read closer to the copy than
# d = 128's 256-byte ones. The cost: Q . K^T and P . V over both heads' values, half of each discarded. Measured on
# the H200 in one process (`history/probe_pairs_d128_h200_8aca5a9.json`, `probe_pairs_d64_h200_8aca5a9.json`;
# GB/s, pairs / one head a program): d = 128, b = 64 x 8 KV heads, 4k keys: contiguous +1.5%, page 16 +1.4%,
# page 64 +0.9% (+1.1% in a second run, `probe_nocombine_d128_h200_0e66316.json`); where the one-head grid splits
# its keys (b = 4 and 1 at 131k) -0.2..-0.6%; MHA (one row a head) -0.7%; d = 64 -1.4..+1.3%, no clear side. So
# `_pairs_pay` takes them at d = 128 in GQA groups when one head a program would fill the GPU unsplit.
# HEAD_PAIRS: None by that rule, True wherever the kernel can (`_pairs_heads`: the tests), False never.
HEAD_PAIRS = None


def _overridden(pack_gqa, use_tma, tiles, backend, short_rows):
    """Whether a call overrides the automatic choices (`attention_forward`'s tests-and-tuning arguments): it then
    runs this file's kernel, in the forms it asks for."""
    return (pack_gqa is not None or use_tma is not None or tiles is not None or backend is not None
            or bool(short_rows))


def _fp8_decode_takes(left, right, window_lefts, softcap, alibi_slopes, sinks, descales, k_starts, overridden):
    """Whether an FP8-cache decode of 33-64 packed rows (the caller's checks) may go to the Gluon kernel of
    `fp8_decode_sm90` (which then checks the tensors, `supported`): no window but the causal one (right = 0),
    no softcap, ALiBi, sinks, key starts or q descale, and no override of the portable kernel's choices
    (`_overridden`)."""
    return (left < 0 and right in (-1, 0) and window_lefts is None and not softcap and alibi_slopes is None
            and sinks is None and descales[0] is None and k_starts is None and not overridden)


def _pairs_heads(q, k, v, cache_seqlens, varlen, seqlen_q, group, descales):
    """Whether a call runs its KV heads in pairs (`HEAD_PAIRS`): a 16-bit KV cache, d = 64 or 128, an even number
    of KV heads stored side by side, and both heads' query rows within the 16-row decode tiles."""
    d = q.shape[-1]
    return (cache_seqlens is not None and not varlen and k.dtype == q.dtype and v.dtype == q.dtype
            and q.element_size() == 2 and all(x is None for x in descales) and d in (64, 128)
            and k.shape[-1] == d and v.shape[-1] == d and k.shape[-2] % 2 == 0
            and 2 * group * seqlen_q <= NARROW_ROWS
            and all(t.stride(-1) == 1 and t.stride(-2) == d for t in (k, v)))


def _pairs_pay(q, k, tiles, group, max_seqlen_k, num_splits):
    """`HEAD_PAIRS`' rule for a call `_pairs_heads` allows: d = 128, a GQA group, splits left to the planner, and the
    planner running one head a program (on `tiles`, the call's own) unsplit."""
    if q.shape[-1] != 128 or group < 2 or num_splits != 0:
        return False
    block_n, num_warps = tiles[1:3]
    programs = q.shape[0] * k.shape[-2]
    return plan_num_splits(programs, max_seqlen_k, block_n, num_sms(q.device), num_warps) == 1


def attention_forward(q, k, v, out, lse, *, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                      softmax_scale, window, softcap, alibi_slopes, sinks, window_lefts=None, descales=(None,) * 3,
                      cache_seqlens=None, block_table=None, k_starts=None,
                      num_splits=1, pack_gqa=None, use_tma=None, tiles=None, backend=None, interpret=False,
                      short_rows=0, wide=None):
    """Launch the forward kernel. Dense: q (b, sq, hq, d). Varlen: q (total_q, hq, d) + cu_seqlens.

    Writes `out` (same layout as q, head_dim_v) and `lse` ((b, hq, sq) dense, (hq, total_q) varlen).
    `window_lefts (b,)` int32: one left window bound per sequence (negative = unbounded) instead of window[0].
    FP8 (float8_e4m3fn q, k, v, or k and v beside fp16/bf16 q): `descales` (q, k, v), each None or a
    `(b, heads_k)` fp32 tensor, multiply the values of their tensors.
    KV cache: `cache_seqlens (b,)` int32 gives each sequence's key count; with `block_table (b, max_pages)`
    k/v are paged `(num_pages, page_size, heads_k, d)`. `k_starts (b,)` int32 (FlashAttention's cache_leftpad):
    sequence b's keys are cache rows `k_starts[b] .. cache_seqlens[b] - 1`, of a contiguous cache or of one page a
    sequence (the page then holds all of them). `num_splits > 1` splits every sequence's keys into
    that many tile-aligned chunks run by separate programs, then merges them exactly; 0 lets
    `schedule.plan_num_splits` choose from this launch's grid, its key tile and the SM count.
    `pack_gqa`, `use_tma` and `tiles` (BLOCK_M, BLOCK_N, num_warps, num_stages) override the automatic
    choices (tests and tuning); so does `backend`: "triton" forces this file's kernel, None lets a call on Hopper
    with no split take the Gluon kernel of `forward_sm90` (a KV-cache call: `_gluon_takes`; FP8 only all three
    inputs FP8, no cache) (also turned off by the environment, FMHA_GLUON=0), and a decode of 33-64 packed rows
    over an FP8 cache beside a 16-bit q the Gluon kernel of `fp8_decode_sm90` (`_fp8_decode_takes`, `supported`).
    Packed queries over a KV cache (vLLM's batches of prefill chunks and decodes) that the Gluon kernel takes run
    as two launches: it leaves out the sequences of at most `_short_tiles`' query rows, and this file's kernel runs
    those beside it (the Gluon launch on a second stream, joined: SIDE_STREAM), their GQA heads packed in decode
    tiles. Varlen calls over a cache that this file's kernel runs split their keys as `num_splits` says, 1 as
    planned (`schedule.plan_num_splits`), their parts merged into the packed rows (`MERGE_ROUNDS`). `short_rows` > 0
    asks for the second launch alone (the sequences of at most that many rows; the others' output rows untouched),
    in `tiles` and `wide`'s further forms where given, else in `_short_tiles`'.
    """
    varlen = cu_seqlens_q is not None
    if varlen:
        batch = cu_seqlens_q.shape[0] - 1
        seqlen_q, seqlen_k = max_seqlen_q, max_seqlen_k
    else:
        batch = q.shape[0]
        seqlen_q, seqlen_k = q.shape[1], k.shape[1]
    heads_q, dqk = q.shape[-2], q.shape[-1]
    heads_k, dv = k.shape[-2], v.shape[-1]
    group = heads_q // heads_k
    if batch == 0 or heads_q == 0 or seqlen_q == 0:
        return
    left, right = window               # window_lefts (batch,) int32, when given, replaces `left` per sequence
    alibi_slopes, sinks, window_lefts, cache_seqlens, k_starts = dense(alibi_slopes, sinks, window_lefts,
                                                                       cache_seqlens, k_starts)
    scale = softmax_scale if softmax_scale is not None else dqk ** -0.5
    # FP8 q, k and v take the Gluon kernel in calls without a KV cache (V transposed there, a copy:
    # `forward_sm90.transposed_v`); an FP8 K/V beside a 16-bit q, and FP8 caches, the portable one (but the
    # decodes that `fp8_decode_sm90` takes, next).
    overridden = _overridden(pack_gqa, use_tma, tiles, backend, short_rows)
    plain = k.dtype == q.dtype and (q.element_size() > 1 or cache_seqlens is None) and not overridden
    if (k.element_size() == 1 and q.element_size() == 2 and cache_seqlens is not None and not varlen
            and MID_ROWS < seqlen_q * group <= DECODE_ROWS and not interpret and gluon_enabled()
            and _fp8_decode_takes(left, right, window_lefts, softcap, alibi_slopes, sinks, descales, k_starts,
                                  overridden)):
        from . import fp8_decode_sm90
        views = fp8_decode_sm90.supported(q, k, v, out, block_table, seqlen_q * group)
        if views:
            k_descale, v_descale = (None if x is None else x.contiguous() for x in descales[1:])
            fp8_decode_sm90.fp8_decode_forward_sm90(q, k, v, out, lse, cache_seqlens, block_table, k_descale,
                                                    v_descale, causal=right == 0, softmax_scale=scale,
                                                    max_seqlen_k=max_seqlen_k, num_splits=num_splits, views=views)
            return
    side = None
    try:                                          # the join, where the Gluon launch forked (a raising one too)
        if plain and not interpret and gluon_enabled() and _gluon_takes(
                cache_seqlens, num_splits, batch, heads_q, seqlen_q, q.device,
                None if block_table is None else k.shape[1]):
            from . import forward_sm90
            short = (0, None, None)
            gluon_window = (left if window_lefts is None else window_lefts, right)
            if varlen and cache_seqlens is not None:
                paired = forward_sm90.pairs_tails(dqk, dv, group, gluon_window, max_seqlen_q, softcap,
                                                  block_table is not None)
                short = _short_tiles(dqk, dv, group, block_table is not None, interpret, paired=paired)
            side = _side_stream(q.device) if short[0] and SIDE_STREAM else None
            if side:
                side.fork()                       # the side stream current, then the caller's again
            took = forward_sm90.attention_forward_sm90(
                q, k, v, out, lse, causal=right >= 0, softmax_scale=scale,
                varlen=(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k) if varlen else None,
                window=gluon_window, sinks=sinks, softcap=softcap,
                cache=None if cache_seqlens is None else (cache_seqlens, block_table, k_starts),
                alibi_slopes=alibi_slopes, descales=descales, short_rows=short[0])
            if side:
                side.back()
            if took and not short[0]:
                return
            if took:                              # the sequences it left, beside it, in their tiles
                short_rows, tiles, wide = short
        if (plain and SHORT_ALONE and varlen and cache_seqlens is not None and not short_rows
                and DECODE_ROWS < group * max_seqlen_q and max_seqlen_q <= _short_cap(group)
                and q.shape[0] <= SHORT_ALONE_MEAN * batch * max_seqlen_q
                and group * q.shape[0] <= SHORT_ALONE_PACKED * batch):
            short_rows = max_seqlen_q   # every sequence in the short launch's forms (SHORT_ALONE)
        if short_rows:
            seqlen_q = short_rows
            pack_gqa = True
            if tiles is None:
                _, tiles, wide = _short_tiles(dqk, dv, group, block_table is not None, interpret, short_rows)
        if varlen and cache_seqlens is not None and num_splits == 1:
            num_splits = 0        # packed queries over a cache (decodes among them): keys split as planned
        # Head pairs (`HEAD_PAIRS`) are planned, not decided each call: the key holds what the rule reads.
        may_pair = HEAD_PAIRS is not False and pack_gqa is None and tiles is None and cache_seqlens is not None
        if pack_gqa is None:
            pack_gqa = _pack_gqa(group, seqlen_q, _tile_config(dqk, dv, interpret)[0])
        gp = group if pack_gqa else 1
        tiles = tuple(tiles or _tile_config(dqk, dv, interpret, rows=seqlen_q * gp, paged=block_table is not None,
                                            kv_fp8=k.element_size() == 1))
        key = (q.shape, q.stride(), k.shape, k.stride(), v.shape, v.stride(), out.shape, out.stride(), lse.shape,
               lse.stride(), q.dtype, k.dtype, v.dtype, out.dtype, q.device, k.data_ptr() % 16, v.data_ptr() % 16,
               varlen and cu_seqlens_q.shape, seqlen_q, max_seqlen_k, scale, float(softcap), left, right,
               window_lefts is None, alibi_slopes is None, sinks is None, tuple(d is None for d in descales),
               cache_seqlens is None, block_table is None or (block_table.shape, block_table.stride()), num_splits,
               gp, tiles, wide, use_tma, interpret, may_pair and HEAD_PAIRS, short_rows)
        # With a batch axis (varlen: of one), made here, past the Gluon launch (a view costs 1-2 us of host time).
        q4, k4, v4, o4 = (t.unsqueeze(0) for t in (q, k, v, out)) if varlen else (q, k, v, out)
        lse_strides = (0, lse.stride(0), lse.stride(1)) if varlen else lse.stride()

        def launch_args(plan):
            """The kernel's arguments for `plan` on this call's tensors, and the split parts it writes (or None)."""
            k_desc = v_desc = o_parts = lse_parts = None
            if plan.tma == 1:
                _ensure_allocator(q.device)
            elif plan.tma == 2:
                from triton.tools.tensor_descriptor import TensorDescriptor
                k_desc = TensorDescriptor(k, list(k.shape), list(k.stride()), list(plan.boxes[0]))
                v_desc = TensorDescriptor(v, list(v.shape), list(v.stride()), list(plan.boxes[1]))
            counter = None
            if plan.splits > 1:
                o_parts = torch.empty(plan.parts[0], dtype=torch.float32, device=q.device)
                lse_parts = torch.empty(plan.parts[1], dtype=torch.float32, device=q.device)
                if "MERGE_PARTS" in plan.meta:
                    counter = zeroed_counter(q.device, plan.grid[0] * plan.grid[1])
            args = (q4, k4, v4, o4, lse, cu_seqlens_q, cu_seqlens_k, alibi_slopes, sinks, k_desc, v_desc,
                    cache_seqlens, block_table, window_lefts,
                    *(None if d is None else d.contiguous() for d in descales), k_starts, o_parts, lse_parts, counter,
                    *plan.scalars)
            return args, o_parts, lse_parts
        plan = _PLANS.get(key)
        if plan is None:
            pair = (may_pair
                    and (HEAD_PAIRS or _pairs_pay(q, k, tiles, group, max_seqlen_k, num_splits))
                    and _pairs_heads(q, k, v, cache_seqlens, varlen, seqlen_q, group, descales))
            kp, vp = k, v
            if pair:
                # Two KV heads a program: K and V seen as heads_k / 2 heads of both heads' values (views: the launch
                # passes k and v themselves, the same addresses), q and out as they are (the kernel's PAIR), the
                # group's rows of both heads packed in one tile.
                kp = k.view(*k.shape[:-2], heads_k // 2, 2 * dqk)
                vp = v.view(*v.shape[:-2], heads_k // 2, 2 * dv)
                gp = 2 * group
                tiles = _tile_config(2 * dqk, 2 * dv, interpret, rows=seqlen_q * gp, paged=block_table is not None,
                                     pair=True)
            make = functools.partial(
                _portable_plan, q4, kp, vp, o4, lse, lse_strides, pair=pair, varlen=varlen, batch=batch,
                seqlen_q=seqlen_q, seqlen_k=seqlen_k, max_seqlen_k=max_seqlen_k, gp=gp, tiles=tiles, use_tma=use_tma,
                scale=scale, softcap=softcap, left=left, right=right, window_lefts=window_lefts,
                alibi_slopes=alibi_slopes, sinks=sinks, cache_seqlens=cache_seqlens, block_table=block_table,
                num_splits=num_splits, interpret=interpret, short=short_rows > 0, wide=wide)
            plan = make()
            if num_splits == 0 and plan.splits > 1 and not interpret:
                plan = _fitted(plan, make, launch_args(plan)[0])
            _PLANS.keep(key, plan)
        args, o_parts, lse_parts = launch_args(plan)
        launch(plan.kernel, plan.grid, args, plan.meta, plan.fixed)
        if plan.splits > 1 and "MERGE_PARTS" not in plan.meta:
            rows = seqlen_q * heads_q
            combine(out, lse, o_parts.view(plan.splits, batch, rows, dv), lse_parts.view(plan.splits, batch, rows),
                    rows_per_k=rows, group=heads_q, num_splits=plan.splits, sinks=sinks,
                    cu_seqlens_q=cu_seqlens_q if varlen else None)
    finally:
        if side:
            side.join()


# Launch plans of the portable kernel (`_PortablePlan`), by the call key `attention_forward` makes: its tensors'
# shapes, strides, dtypes, device and K/V alignment, its options and its tiles (so a patched tile table makes new
# keys; not the head pairs' tiles, which a plan takes from `_GPU_PAIR_DECODE_TILES` or the 2d entries when it
# pairs: the probes that patch those run on plans of their own). A later call of a key skips the planning and the
# argument classes of the plan's scalars: ~20 us of a decode call's ~90 of host time on the device's hosts
# (NOTES.md, fifty-ninth session).
_PLANS = Plans()


class _PortablePlan:
    """A portable launch without its tensors: the kernel (`_forward_kernel`'s pick), the grid, the meta-parameters
    and their `launch` classes, the scalar arguments after the tensors, the key splits, TMA (0, 1: per-sequence
    descriptors made in the kernel, 2: K and V descriptors made on the host in `boxes`) and the split buffers'
    shapes (`parts`)."""
    __slots__ = ("kernel", "grid", "meta", "scalars", "fixed", "splits", "tma", "boxes", "parts")

    def __init__(self, kernel, grid, meta, scalars, splits, tma, boxes, parts):
        self.kernel, self.grid, self.meta, self.scalars, self.splits = kernel, grid, meta, scalars, splits
        self.tma, self.boxes, self.parts = tma, boxes, parts
        self.fixed = fixed_classes(scalars, meta)


def _fitted(plan, make, args):
    """A planned split `plan`, or, where its compile fits fewer programs on an SM than `plan_num_splits` counted,
    `make(per_sm=...)`: the plan made again on the programs that fit. Deep K/V pipelines outgrow the count, and the
    split counted for them ran a second wave of short programs: the contiguous d = 128 decode tiles (beside
    NARROW_ROWS) and the paged d = 256 ones split in 5 stages (beside `_GPU_SPLIT_TILES`), one program an SM each,
    with what the refit gained there."""
    fits = programs_per_sm(plan.kernel, plan.grid, args, plan.meta)
    return make(per_sm=fits) if fits < counted_per_sm(plan.meta["num_warps"]) else plan


# A split launch merges its parts in the kernel (MERGE_PARTS: the last split of each block to finish) when
# MERGE_ROUNDS rounds of `combine.merge_parts` hold them all, each round's parts MERGE_IN_FLIGHT fp32 values a warp
# (128 registers a thread); more parts go to the `combine` launch, which spreads them over more programs. The
# merge is a tail of dependent round trips to L2 (the parts' stores, the counter, the loads) after the last split,
# where `combine` adds a launch and its own: H200, ratio to cuDNN, in-kernel / `combine`, one KV head of 8 query
# heads (4-8 parts; `history/split_merge_confirm_h200_9a02342.json`, `split_merge_h200_9b6039d.json`): b = 64 at 4k
# page 16 0.939 / 0.917, page 64 0.916 / 0.912, contiguous 0.975 / 0.966, b = 32 page 16 0.912 / 0.894. Rows of
# more parts (b = 16 at 8k, long-context GQA at b = 1 / 4) keep `combine`: level. The kernel's merge in one round of
# the tiled form (a 3-D tile of 64-bit addresses) took the d = 128 split tile to 255 registers and spilled
# (0.74 of cuDNN); `merge_parts`' UNROLL form holds 159.
MERGE_IN_FLIGHT = 4096
MERGE_ROUNDS = 1


def _portable_plan(q4, k, v, o4, lse, lse_strides, *, pair, varlen, batch, seqlen_q, seqlen_k, max_seqlen_k, gp,
                   tiles, use_tma, scale, softcap, left, right, window_lefts, alibi_slopes, sinks, cache_seqlens,
                   block_table, num_splits, interpret, short=False, wide=None, per_sm=None):
    """`_PortablePlan` of an `attention_forward` call that the portable kernel runs (q4 and o4 with a batch axis;
    with `pair`, k and v are the head-pair views; `short`: only the packed sequences of at most seqlen_q rows, with
    `wide` the further forms' tiles for those of more rows than `tiles` holds, the last form's M blocks in its
    rows: `_short_tiles`; `per_sm`: the programs an SM holds, for `plan_num_splits`, where it is known: `_fitted`)."""
    heads_q, dqk = q4.shape[-2], k.shape[-1]          # with `pair`, the pair's width
    group = heads_q // k.shape[-2]
    dv = v.shape[-1]
    paged = block_table is not None
    kv_fp8 = v.element_size() == 1
    block_m, num_warps = tiles[0], tiles[2]
    heads_eff = heads_q // gp
    block_d, block_dt = _split_head_dim(dqk)
    block_dv = next_pow2(dv)
    if use_tma is None:
        # TMA descriptors cannot describe an empty tensor (seqlen_k = 0), a page gather, or a length that
        # stops inside the tensor (cache_seqlens): pointer loads then.
        use_tma = (not interpret and cache_seqlens is None and block_dt == 0 and k.numel() > 0
                   and _tma_ok(k, dqk, block_d) and _tma_ok(v, dv, block_dv))
    # Varlen: per-sequence descriptors built in the kernel. Dense: descriptors built once on the host (building
    # them per program cost ~10-20% at s <= 4k).
    tma = (1 if varlen else 2) if use_tma else 0
    m_blocks = cdiv(seqlen_q * gp, (wide[-1] if wide else tiles)[0])
    if num_splits == 0:
        # Planned on the cache's capacity, not its lengths (no host sync); a short launch on one M block a
        # sequence, its decodes' (the M blocks past a sequence's rows return at once).
        num_splits = plan_num_splits(batch * heads_eff * (1 if short else m_blocks), max_seqlen_k, tiles[1],
                                     num_sms(q4.device), num_warps, per_sm)
    if num_splits > 1 and not interpret:
        tiles = _GPU_SPLIT_TILES.get((paged, tile_key(dqk, dv), tiles), tiles)
    block_n, num_stages = tiles[1], tiles[3]
    split_strides, parts, merge_round = (0, 0), None, 0
    if num_splits > 1:
        # Partial results in fp32, one slab per split (the kernel's part_rows), merged after: in the kernel by the
        # last split of each block where MERGE_ROUNDS rounds of `merge_parts` take them all, else by `combine`.
        parts = ((num_splits, batch, seqlen_q, heads_q, o4.shape[-1]), (num_splits, batch, seqlen_q, heads_q))
        split_strides = tuple(math.prod(shape[1:]) for shape in parts)      # the slabs are contiguous
        rows = max([block_m, *(w[0] for w in wide or ())])
        per_round = min(next_pow2(num_splits), prev_pow2(max(1, MERGE_IN_FLIGHT * num_warps // (rows * block_dv))))
        if cdiv(num_splits, per_round) <= MERGE_ROUNDS:
            merge_round = per_round
    packed_k = varlen and not paged
    k4, v4 = (t.unsqueeze(0) if packed_k else t for t in (k, v))
    scalars = (seqlen_q, seqlen_k, block_table.stride(0) if paged else 0, k.shape[1] if paged else 1, *split_strides,
               *_strides(q4, varlen), *_strides(k4, packed_k), *_strides(v4, packed_k), *_strides(o4, varlen),
               *(lse.stride() if not varlen else lse_strides),
               gp, group, heads_eff, scale * 1.4426950408889634, float(softcap), left, right)
    # An FP8 V loaded by pointers at an even address and strides may be read as 16-bit words.
    v_words = 0
    if (not tma and block_dv >= 32 and v.data_ptr() % 2 == 0
            and all(st % 2 == 0 for st in v.stride()[:-1])):
        v_words = v_words_mode(kv_fp8, block_m, interpret)
    meta = dict(
        HEAD_DIM_QK=dqk, HEAD_DIM_V=dv, BLOCK_M=block_m, BLOCK_N=block_n,
        BLOCK_D=block_d, BLOCK_DT=max(block_dt, 16), BLOCK_DV=block_dv, HAS_TAIL=block_dt > 0,
        IS_VARLEN=varlen, MASK_LEFT=left >= 0 or window_lefts is not None, MASK_RIGHT=right >= 0,
        HAS_SOFTCAP=softcap > 0, HAS_ALIBI=alibi_slopes is not None, HAS_SINKS=sinks is not None,
        REVERSE_M=right >= 0, TMA=tma,
        HAS_SEQLENS_K=cache_seqlens is not None, PAGED=paged, SPLIT=num_splits > 1,
        LEFT_PER_BATCH=window_lefts is not None, PAGE_TILE=_page_tile(k.shape[1], block_n) if paged else 0,
        V_WORDS=v_words, num_warps=num_warps, num_stages=num_stages,
    )
    if pair:
        meta["PAIR"] = True
    if short:
        meta["SHORT_ONLY"] = True
    if merge_round:
        meta["MERGE_PARTS"] = merge_round
    if wide:
        meta["WIDE"] = tuple((m, n, stages, _page_tile(k.shape[1], n) if paged else 0) for m, n, _, stages in wide)
    cap = _register_cap(dqk, dv, tiles, wide, interpret, kv_fp8)
    if cap:
        meta["maxnreg"] = cap
    grid = (batch * heads_eff, m_blocks, num_splits)
    boxes = ([1, block_n, 1, block_d], [1, block_n, 1, block_dv])
    kernel = _forward_kernel(block_m, seqlen_q)
    return _PortablePlan(kernel, grid, meta, scalars, num_splits, tma, boxes, parts)
