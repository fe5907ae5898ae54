"""Experiment: Gluon paged decode kernels with an explicit cp.async ring (issue 3's page 16 / 64 rows).

The package's paged head-pair form (Triton, (16, 64, 4, 4)) keeps one K and one V buffer: Triton's pipeliner gives
it `async_wait {num = 0}` after each tile's loads, so a program has one tile in flight and the SM's other programs
fill the gaps. The question here: does a deeper ring, held by hand, read the scattered pages closer to the copy
bandwidth? Three forms; `benchmarks/probe_multi_item.py --gluon` times them against the package, cuDNN and the
pure read:
- `gluon_decode_kernel`: one warpgroup, wgmma with M = 64 (the 2 G real rows padded), Q in shared memory, K / V
  tiles written by cp.async (16 bytes a copy) into 128-byte-swizzled buffers and read by wgmma after a proxy fence;
  STAGES - 1 tiles in flight while it computes on the oldest. COMPUTE=False issues the same copies with no math:
  the ring's own read rate.
- `gluon_decode_v2_kernel`: the same ring with mma.sync (M = 16), warps splitting keys then columns; one or two
  KV heads a program (HEADS).
- `gluon_decode_ws_kernel`: warp-specialised: a loading warpgroup keeps the ring full, two consumer warpgroups
  take alternate tiles and merge their softmax states at the end.
What they measured (H200, NOTES.md seventy-second session): the copies alone read at the pure read's rate, every
computing form at or under the package: 0.98-0.998 of cuDNN at best (mma.sync, 32-key tiles, two buffers, two
programs an SM), the wgmma form 0.90-0.93, deeper rings lose the programs an SM they cost, one head a program loses.

Scope: what the bench rows need and no more: seqlen_q = 1, a paged bf16 / fp16 cache (any page size that is a
multiple of 16), GQA group G with 2 G <= 16, d = 128, two KV heads a program (the package's pair layout: a pair's
rows are 256 values wide, q rows of the first head [q, 0], of the second [0, q]) unless said, no split, no options.
"""
import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy, mma_v2
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, warpgroup_mma,
                                                              warpgroup_mma_wait)

ROWS = gl.constexpr(64)
LN2 = gl.constexpr(0.6931471805599453)


@gluon.jit
def _pages(bt_row, n, k_len, PAGE: gl.constexpr, BLOCK_N: gl.constexpr, key_l: gl.constexpr):
    """Block-table entries of the keys n .. n + BLOCK_N - 1 (0 past k_len), one a key row."""
    key = n + gl.arange(0, BLOCK_N, layout=key_l)
    return gl.load(bt_row + key // PAGE, mask=key < k_len, other=0)


@gluon.jit
def _issue(K, V, k_buf, v_buf, pages, n, k_len, col0, stride_page, stride_slot, PAGE: gl.constexpr,
           BLOCK_N: gl.constexpr, W: gl.constexpr, ld: gl.constexpr):
    """cp.async the K and V rows (W values from column col0) of keys n .. n + BLOCK_N - 1 into k_buf / v_buf;
    keys at or past k_len zero-filled (not read)."""
    key = n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, ld))
    cols = gl.arange(0, W, layout=gl.SliceLayout(0, ld))
    rows = pages.to(gl.int64) * stride_page + (key % PAGE) * stride_slot + col0
    offs = rows[:, None] + cols[None, :]
    ok = (key < k_len)[:, None] & (cols < W)[None, :]
    async_copy.async_copy_global_to_shared(k_buf, K + offs, mask=ok)
    async_copy.async_copy_global_to_shared(v_buf, V + offs, mask=ok)


@gluon.jit
def _start_ring(src, k_bufs, v_bufs, PAGE: gl.constexpr, ld: gl.constexpr):
    """Issue tiles 0 .. STAGES - 2 into their slots, one commit group each, `src` = (K, V, block-table row, k_len,
    first column, page stride, key stride); returns tile STAGES - 1's page numbers."""
    STAGES: gl.constexpr = k_bufs.shape[0]
    BLOCK_N: gl.constexpr = k_bufs.shape[1]
    K, V, bt_row, k_len, col0, stride_page, stride_slot = src
    for i in gl.static_range(STAGES - 1):
        pg = _pages(bt_row, i * BLOCK_N, k_len, PAGE, BLOCK_N, gl.SliceLayout(1, ld))
        _issue(K, V, k_bufs.index(i), v_bufs.index(i), pg, i * BLOCK_N, k_len, col0, stride_page, stride_slot,
               PAGE, BLOCK_N, k_bufs.shape[2], ld)
        async_copy.commit_group()
    return _pages(bt_row, (STAGES - 1) * BLOCK_N, k_len, PAGE, BLOCK_N, gl.SliceLayout(1, ld))


@gluon.jit
def _next_tile(src, k_bufs, v_bufs, pg, t, n_tiles, PAGE: gl.constexpr, ld: gl.constexpr, FENCE: gl.constexpr):
    """Top of tile t: wait for this thread's copies of tile t (FENCE: then fence them for the async proxy, which
    wgmma reads through), a barrier (every thread's copies landed, every thread done with tile t - 1's slot), then
    issue tile t + STAGES - 1 (its page numbers `pg`) into that slot, one commit group (empty past the last tile);
    returns the next tile's page numbers."""
    STAGES: gl.constexpr = k_bufs.shape[0]
    BLOCK_N: gl.constexpr = k_bufs.shape[1]
    K, V, bt_row, k_len, col0, stride_page, stride_slot = src
    async_copy.wait_group(STAGES - 2)
    if FENCE:
        fence_async_shared()
    gl.thread_barrier()
    nt = t + STAGES - 1
    if nt < n_tiles:
        _issue(K, V, k_bufs.index(nt % STAGES), v_bufs.index(nt % STAGES), pg, nt * BLOCK_N, k_len, col0, stride_page,
               stride_slot, PAGE, BLOCK_N, k_bufs.shape[2], ld)
        pg = _pages(bt_row, (nt + 1) * BLOCK_N, k_len, PAGE, BLOCK_N, gl.SliceLayout(1, ld))
    async_copy.commit_group()
    return pg


@gluon.jit
def _load_q(Q, b, head0, stride_qb, stride_qh, M: gl.constexpr, W: gl.constexpr, D: gl.constexpr,
            GROUP: gl.constexpr, REAL: gl.constexpr, layout: gl.constexpr):
    """(M, W) q rows in `layout`: row r < REAL is query head head0 + r, in its own KV head's D columns of the
    W-wide row (a pair's first head [q, 0], its second [0, q]); 0 elsewhere."""
    r = gl.arange(0, M, layout=gl.SliceLayout(1, layout))
    c = gl.arange(0, W, layout=gl.SliceLayout(0, layout))
    half = r // GROUP
    own = (r < REAL)[:, None] & ((c // D)[None, :] == half[:, None])
    ptrs = Q + b.to(gl.int64) * stride_qb + (head0 + r)[:, None] * stride_qh + (c[None, :] - half[:, None] * D)
    return gl.load(ptrs, mask=own, other=0.0)


@gluon.jit
def _online_softmax(s, m_i, l_i, n, k_len, qk_scale_log2, BLOCK_N: gl.constexpr, s_layout: gl.constexpr):
    """Scores s of the tile at key n (keys past k_len masked) into the running (m, l): (p, alpha, m, l)."""
    s = s * qk_scale_log2
    if n + BLOCK_N > k_len:
        kp = n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
        s = gl.where((kp < k_len)[None, :], s, float("-inf"))
    m_new = gl.maximum(m_i, gl.max(s, 1))
    m_sh = gl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = gl.exp2(m_i - m_sh)
    p = gl.exp2(s - m_sh[:, None])
    return p, alpha, m_new, l_i * alpha + gl.sum(p, 1)


@gluon.jit
def _mma2_tile(q, k_buf, v_buf, m_i, l_i, acc, n, k_len, qk_scale_log2, BLOCK_N: gl.constexpr,
               mma: gl.constexpr):
    """One key tile of the mma.sync forms: K and V read from their ring slots by ldmatrix."""
    a_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
    b_l: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=2)
    s = mma_v2(q, k_buf.permute((1, 0)).load(b_l), gl.zeros([q.shape[0], BLOCK_N], gl.float32, mma))
    p, alpha, m_i, l_i = _online_softmax(s, m_i, l_i, n, k_len, qk_scale_log2, BLOCK_N, mma)
    acc = mma_v2(gl.convert_layout(p.to(q.dtype), a_l), v_buf.load(b_l), acc * alpha[:, None])
    return m_i, l_i, acc


@gluon.jit
def _store(O, LSE, acc, m_i, l_i, b, head0, stride_ob, stride_oh, stride_lb, stride_lh, D: gl.constexpr,
           GROUP: gl.constexpr, REAL: gl.constexpr, layout: gl.constexpr):
    """The rows r < REAL of acc / l (query head head0 + r, its own D columns) and their LSE; m and l in acc's row
    layout. Rows that saw no key: output 0, LSE -inf."""
    M: gl.constexpr = acc.shape[0]
    W: gl.constexpr = acc.shape[1]
    out = acc / gl.where(l_i == 0.0, 1.0, l_i)[:, None]
    ro = gl.arange(0, M, layout=gl.SliceLayout(1, layout))
    co = gl.arange(0, W, layout=gl.SliceLayout(0, layout))
    half = ro // GROUP
    head = head0 + ro
    ptrs = O + b.to(gl.int64) * stride_ob + head[:, None] * stride_oh + (co[None, :] - half[:, None] * D)
    gl.store(ptrs, out.to(O.dtype.element_ty), mask=(ro < REAL)[:, None] & ((co // D)[None, :] == half[:, None]))
    lse = gl.where(l_i == 0.0, float("-inf"), (m_i + gl.log2(gl.where(l_i == 0.0, 1.0, l_i))) * LN2)
    gl.store(LSE + b * stride_lb + head * stride_lh, lse, mask=ro < REAL)


@gluon.jit
def _program(SEQLENS, TABLE, stride_bt, NPAIR: gl.constexpr):
    """This program's (batch, KV-head group, key count, block-table row): programs go batch-major, NPAIR a batch."""
    pid = gl.program_id(0)
    b = pid // NPAIR
    return b, pid % NPAIR, gl.load(SEQLENS + b), TABLE + b.to(gl.int64) * stride_bt


@gluon.jit
def gluon_decode_kernel(Q, K, V, O, LSE, TABLE, SEQLENS, stride_qb, stride_qh, stride_ob, stride_oh, stride_lb,
                        stride_lh, stride_bt, stride_page, stride_slot, qk_scale_log2,
                        GROUP: gl.constexpr, NPAIR: gl.constexpr, D: gl.constexpr, PAGE: gl.constexpr,
                        BLOCK_N: gl.constexpr, STAGES: gl.constexpr, COMPUTE: gl.constexpr):
    dtype: gl.constexpr = Q.dtype.element_ty
    W: gl.constexpr = 2 * D
    b, pair, k_len, bt_row = _program(SEQLENS, TABLE, stride_bt, NPAIR)
    col0 = pair * W

    ld: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [4, 1], [1, 0])
    kv_l: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, W], dtype)
    q_l: gl.constexpr = gl.NVMMASharedLayout.get_default_for([ROWS, W], dtype)
    k_bufs = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, W], kv_l)
    v_bufs = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, W], kv_l)
    q_smem = gl.allocate_shared_memory(dtype, [ROWS, W], q_l)

    n_tiles = gl.cdiv(k_len, BLOCK_N)
    src = (K, V, bt_row, k_len, col0, stride_page, stride_slot)
    pg = _start_ring(src, k_bufs, v_bufs, PAGE, ld)

    q_ld: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    q_smem.store(_load_q(Q, b, pair * 2 * GROUP, stride_qb, stride_qh, ROWS, W, D, GROUP, 2 * GROUP, q_ld))

    s_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                 instr_shape=[16, BLOCK_N, 16])
    o_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, W, 16])
    p_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_l, k_width=2)
    row_s: gl.constexpr = gl.SliceLayout(1, s_l)
    row_o: gl.constexpr = gl.SliceLayout(1, o_l)
    m_i = gl.full([ROWS], float("-inf"), gl.float32, row_s)
    l_i = gl.zeros([ROWS], gl.float32, row_s)
    acc = gl.zeros([ROWS, W], gl.float32, o_l)
    for t in range(n_tiles):
        slot = t % STAGES
        pg = _next_tile(src, k_bufs, v_bufs, pg, t, n_tiles, PAGE, ld, True)
        if COMPUTE:
            s = warpgroup_mma(q_smem, k_bufs.index(slot).permute((1, 0)), gl.zeros([ROWS, BLOCK_N], gl.float32, s_l),
                              use_acc=False, is_async=True)
            p, alpha, m_i, l_i = _online_softmax(warpgroup_mma_wait(0, deps=(s,)), m_i, l_i, t * BLOCK_N, k_len,
                                                 qk_scale_log2, BLOCK_N, s_l)
            acc = acc * gl.convert_layout(alpha, row_o)[:, None]
            o_tok = warpgroup_mma(gl.convert_layout(p.to(dtype), p_l), v_bufs.index(slot), acc, is_async=True)
            acc = warpgroup_mma_wait(0, deps=(o_tok,))
    async_copy.wait_group(0)

    _store(O, LSE, acc, gl.convert_layout(m_i, row_o), gl.convert_layout(l_i, row_o), b, pair * 2 * GROUP,
           stride_ob, stride_oh, stride_lb, stride_lh, D, GROUP, 2 * GROUP, o_l)

@gluon.jit
def gluon_decode_v2_kernel(Q, K, V, O, LSE, TABLE, SEQLENS, stride_qb, stride_qh, stride_ob, stride_oh, stride_lb,
                           stride_lh, stride_bt, stride_page, stride_slot, qk_scale_log2,
                           GROUP: gl.constexpr, NPAIR: gl.constexpr, D: gl.constexpr, PAGE: gl.constexpr,
                           BLOCK_N: gl.constexpr, STAGES: gl.constexpr, WARPS: gl.constexpr,
                           HEADS: gl.constexpr):
    """The same ring with mma.sync (M = 16: the HEADS GROUP real rows padded to 16, not 64), warps splitting the
    keys of Q·Kᵀ and the columns of P·V as Triton's 16-row decode forms do; operands read from shared memory by
    ldmatrix (no proxy fence: both sides generic). HEADS: KV heads a program, 2 (a pair, NPAIR = heads_k / 2) or
    1 (NPAIR = heads_k)."""
    dtype: gl.constexpr = Q.dtype.element_ty
    W: gl.constexpr = HEADS * D
    M: gl.constexpr = 16
    b, pair, k_len, bt_row = _program(SEQLENS, TABLE, stride_bt, NPAIR)
    col0 = pair * W

    ld: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [WARPS, 1], [1, 0])
    kv_l: gl.constexpr = gl.SwizzledSharedLayout(8, 1, 8, [1, 0])
    k_bufs = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, W], kv_l)
    v_bufs = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, W], kv_l)

    n_tiles = gl.cdiv(k_len, BLOCK_N)
    src = (K, V, bt_row, k_len, col0, stride_page, stride_slot)
    pg = _start_ring(src, k_bufs, v_bufs, PAGE, ld)

    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[1, WARPS], instr_shape=[16, 8])
    row_l: gl.constexpr = gl.SliceLayout(1, mma)
    q_ld: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [1, WARPS], [1, 0])
    q = _load_q(Q, b, pair * HEADS * GROUP, stride_qb, stride_qh, M, W, D, GROUP, HEADS * GROUP, q_ld)
    q = gl.convert_layout(q, gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2))

    m_i = gl.full([M], float("-inf"), gl.float32, row_l)
    l_i = gl.zeros([M], gl.float32, row_l)
    acc = gl.zeros([M, W], gl.float32, mma)
    for t in range(n_tiles):
        slot = t % STAGES
        pg = _next_tile(src, k_bufs, v_bufs, pg, t, n_tiles, PAGE, ld, False)
        m_i, l_i, acc = _mma2_tile(q, k_bufs.index(slot), v_bufs.index(slot), m_i, l_i, acc, t * BLOCK_N, k_len,
                                   qk_scale_log2, BLOCK_N, mma)
    async_copy.wait_group(0)
    _store(O, LSE, acc, m_i, l_i, b, pair * HEADS * GROUP, stride_ob, stride_oh, stride_lb, stride_lh, D, GROUP,
           HEADS * GROUP, mma)

CHUNK = gl.constexpr(32)          # key rows the producer addresses at once


@gluon.jit
def _ws_producer(K, V, k_bufs, v_bufs, ready, free, bt_row, k_len, col0, stride_page, stride_slot,
                 PAGE: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, W: gl.constexpr):
    """Fill the ring: tile t into slot t % STAGES once its last reader released it; each thread arrives on the
    slot's ready barrier when its own copies have landed."""
    ld: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [4, 1], [1, 0])
    key_l: gl.constexpr = gl.SliceLayout(1, ld)
    n_tiles = gl.cdiv(k_len, BLOCK_N)
    for t in range(n_tiles):
        slot = t % STAGES
        if t >= STAGES:
            mbarrier.wait(free.index(slot), (t // STAGES - 1) & 1)
        for r0 in gl.static_range(0, BLOCK_N, CHUNK):
            n = t * BLOCK_N + r0
            pg = _pages(bt_row, n, k_len, PAGE, CHUNK, key_l)
            _issue(K, V, k_bufs.index(slot).slice(r0, CHUNK, dim=0), v_bufs.index(slot).slice(r0, CHUNK, dim=0), pg,
                   n, k_len, col0, stride_page, stride_slot, PAGE, CHUNK, W, ld)
        async_copy.mbarrier_arrive(ready.index(slot), increment_count=False)


@gluon.jit
def _ws_consumer(Q, O, LSE, k_bufs, v_bufs, ready, free, done, x_rows, x_acc, b, pair, k_len, stride_qb, stride_qh,
                 stride_ob, stride_oh, stride_lb, stride_lh, qk_scale_log2, C: gl.constexpr, GROUP: gl.constexpr,
                 D: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, W: gl.constexpr):
    """Consumer C (0 or 1) of the tiles t = C, C + 2, ...: online softmax with mma.sync (16 rows, 4 warps). Consumer
    1 hands its (m, l, acc) over through shared memory; consumer 0 merges and stores."""
    M: gl.constexpr = 16
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[1, 4], instr_shape=[16, 8])
    row_l: gl.constexpr = gl.SliceLayout(1, mma)
    q_ld: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [1, 4], [1, 0])
    q = _load_q(Q, b, pair * 2 * GROUP, stride_qb, stride_qh, M, W, D, GROUP, 2 * GROUP, q_ld)
    q = gl.convert_layout(q, gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2))

    m_i = gl.full([M], float("-inf"), gl.float32, row_l)
    l_i = gl.zeros([M], gl.float32, row_l)
    acc = gl.zeros([M, W], gl.float32, mma)
    n_tiles = gl.cdiv(k_len, BLOCK_N)
    for t in range(C, n_tiles, 2):
        slot = t % STAGES
        mbarrier.wait(ready.index(slot), (t // STAGES) & 1)
        m_i, l_i, acc = _mma2_tile(q, k_bufs.index(slot), v_bufs.index(slot), m_i, l_i, acc, t * BLOCK_N, k_len,
                                   qk_scale_log2, BLOCK_N, mma)
        gl.thread_barrier()
        mbarrier.arrive(free.index(slot), count=1)

    if C == 1:
        x_rows.index(0).store(m_i)
        x_rows.index(1).store(l_i)
        x_acc.store(acc)
        gl.thread_barrier()
        mbarrier.arrive(done, count=1)
    else:
        mbarrier.wait(done, 0)
        m_o = x_rows.index(0).load(row_l)
        l_o = x_rows.index(1).load(row_l)
        acc_o = x_acc.load(mma)
        m = gl.maximum(m_i, m_o)
        m_sh = gl.where(m == float("-inf"), 0.0, m)
        a_i = gl.exp2(m_i - m_sh)
        a_o = gl.exp2(m_o - m_sh)
        l_i = l_i * a_i + l_o * a_o
        acc = acc * a_i[:, None] + acc_o * a_o[:, None]
        _store(O, LSE, acc, m, l_i, b, pair * 2 * GROUP, stride_ob, stride_oh, stride_lb, stride_lh, D, GROUP,
               2 * GROUP, mma)

@gluon.jit
def gluon_decode_ws_kernel(Q, K, V, O, LSE, TABLE, SEQLENS, stride_qb, stride_qh, stride_ob, stride_oh, stride_lb,
                           stride_lh, stride_bt, stride_page, stride_slot, qk_scale_log2,
                           GROUP: gl.constexpr, NPAIR: gl.constexpr, D: gl.constexpr, PAGE: gl.constexpr,
                           BLOCK_N: gl.constexpr, STAGES: gl.constexpr, CONSUMER_REGS: gl.constexpr):
    """Warp-specialised: a loading warpgroup (the default partition) keeps the ring of STAGES tiles full; two
    consumer warpgroups take alternate tiles, each with its own running softmax, merged at the end (a split of the
    keys inside the program: no combine kernel). One program an SM; a head pair a program."""
    dtype: gl.constexpr = Q.dtype.element_ty
    W: gl.constexpr = 2 * D
    b, pair, k_len, bt_row = _program(SEQLENS, TABLE, stride_bt, NPAIR)
    kv_l: gl.constexpr = gl.SwizzledSharedLayout(8, 1, 8, [1, 0])
    k_bufs = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, W], kv_l)
    v_bufs = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, W], kv_l)
    plain: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
    x_acc = gl.allocate_shared_memory(gl.float32, [16, W], plain)
    x_rows = gl.allocate_shared_memory(gl.float32, [2, 16], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    free = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    done = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout()).index(0)
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=128)
        mbarrier.init(free.index(i), count=1)
    mbarrier.init(done, count=1)
    gl.warp_specialize([
        (_ws_producer, (K, V, k_bufs, v_bufs, ready, free, bt_row, k_len, pair * W, stride_page, stride_slot, PAGE,
                        BLOCK_N, STAGES, W)),
        (_ws_consumer, (Q, O, LSE, k_bufs, v_bufs, ready, free, done, x_rows, x_acc, b, pair, k_len, stride_qb,
                        stride_qh, stride_ob, stride_oh, stride_lb, stride_lh, qk_scale_log2, 0, GROUP, D, BLOCK_N,
                        STAGES, W)),
        (_ws_consumer, (Q, O, LSE, k_bufs, v_bufs, ready, free, done, x_rows, x_acc, b, pair, k_len, stride_qb,
                        stride_qh, stride_ob, stride_oh, stride_lb, stride_lh, qk_scale_log2, 1, GROUP, D, BLOCK_N,
                        STAGES, W)),
    ], [4, 4], [CONSUMER_REGS, CONSUMER_REGS])


def launch(q, k_cache, v_cache, cache_seqlens, block_table, *, block_n=64, stages=3, compute=True, mma=3,
           warps=4, heads=2, ws_regs=0):
    """A callable running the experiment on q (b, 1, hq, d) against a paged cache; returns out (b, 1, hq, d).
    mma=3: the wgmma kernel (compute=False: its copies only); mma=2: the mma.sync kernel with `warps` warps and
    `heads` KV heads a program; ws_regs > 0: the warp-specialised kernel, its consumers at ws_regs registers."""
    b, sq, hq, d = q.shape
    hk = k_cache.shape[2]
    group = hq // hk
    assert sq == 1 and d == 128 and hk % 2 == 0 and 2 * group <= 16 and k_cache.stride() == v_cache.stride()
    out = torch.empty_like(q)
    lse = torch.empty(b, hq, dtype=torch.float32, device=q.device)
    scale_log2 = d ** -0.5 * 1.4426950408889634
    args = (q, k_cache, v_cache, out, lse, block_table, cache_seqlens, q.stride(0), q.stride(2), out.stride(0),
            out.stride(2), lse.stride(0), lse.stride(1), block_table.stride(0), k_cache.stride(0), k_cache.stride(1),
            scale_log2)
    heads = 2 if mma == 3 or ws_regs else heads
    meta = dict(GROUP=group, NPAIR=hk // heads, D=d, PAGE=k_cache.shape[1], BLOCK_N=block_n, STAGES=stages)

    def call():
        if ws_regs:
            gluon_decode_ws_kernel[(b * hk // 2,)](*args, **meta, CONSUMER_REGS=ws_regs, num_warps=4)
        elif mma == 3:
            gluon_decode_kernel[(b * hk // 2,)](*args, **meta, COMPUTE=compute, num_warps=4)
        else:
            gluon_decode_v2_kernel[(b * hk // heads,)](*args, **meta, WARPS=warps, HEADS=heads, num_warps=warps)
        return out
    return call
