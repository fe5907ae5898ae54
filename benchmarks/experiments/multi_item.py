"""Experiment: a decode kernel whose programs each run ITEMS (sequence, KV head) items back to back in ONE key
loop, so the software pipeline fills once per program and not once per item, and b = 64 x 8 KV heads runs as 256
programs (one wave at two an SM) in place of 512 (1.94 waves).

The question (NOTES.md, sixty-eighth session): issue 3's b = 64 paged row reads 0.980 of cuDNN with 512 programs of
4k keys, 0.993 with the same bytes in 256 programs of 8k keys. Is that the programs' fixed cost (fill, drain,
output), which this form removes without changing the shape?

bf16 / fp16, seqlen_q = 1, a GQA group packed in the M rows, paged or contiguous, every sequence the same length, a
multiple of BN (the experiment's shapes), no options, no split. The item's q is loaded in the loop (from L2 after
the first tile); when an item's last tile is done its output is written and the running (m, l, acc) reset."""
import triton
import triton.language as tl


@triton.jit
def multi_item_decode(Q, K, V, O, BT, stride_qb, stride_qh, stride_kp, stride_ks, stride_kh, stride_vp, stride_vs,
                      stride_vh, stride_ob, stride_oh, stride_bt, page_size, heads_k, n_tiles, qk_scale_log2,
                      G: tl.constexpr, M: tl.constexpr, BN: tl.constexpr, D: tl.constexpr, ITEMS: tl.constexpr,
                      PAGED: tl.constexpr, PAGE_TILE: tl.constexpr, Q_HOISTED: tl.constexpr = False):
    pid = tl.program_id(0)
    rows = tl.arange(0, M)
    offs_d = tl.arange(0, D)
    offs_n = tl.arange(0, BN)
    if Q_HOISTED:
        # one item a program: q loaded once, held in registers (as the package's kernel holds it)
        q_h = tl.load(Q + (pid // heads_k) * stride_qb + ((pid % heads_k) * G + rows)[:, None] * stride_qh
                      + offs_d[None, :], mask=(rows < G)[:, None], other=0.0)
    acc = tl.zeros((M, D), tl.float32)
    m_i = tl.full((M,), float("-inf"), tl.float32)
    l_i = tl.zeros((M,), tl.float32)
    for t in tl.range(0, ITEMS * n_tiles):
        it = t // n_tiles
        j = t - it * n_tiles
        item = pid * ITEMS + it
        b = item // heads_k
        h = item - b * heads_k
        if Q_HOISTED:
            q = q_h
        else:
            q = tl.load(Q + b * stride_qb + (h * G + rows)[:, None] * stride_qh + offs_d[None, :],
                        mask=(rows < G)[:, None], other=0.0)
        pos = j * BN + offs_n
        if PAGED:
            bt_row = BT + b.to(tl.int64) * stride_bt
            if PAGE_TILE > 0:
                # BN // PAGE_TILE whole pages (or one page holds the tile): one lookup a page
                PAGES: tl.constexpr = BN // PAGE_TILE
                first = j * BN + tl.arange(0, PAGES) * PAGE_TILE
                pages = tl.load(bt_row + first // page_size).to(tl.int64)
                page = tl.reshape(tl.broadcast_to(pages[:, None], (PAGES, PAGE_TILE)), (BN,))
            else:
                page = tl.load(bt_row + pos // page_size).to(tl.int64)
            slot = pos % page_size
        else:
            page = b.to(tl.int64)
            slot = pos.to(tl.int64)
        kp = K + h * stride_kh + page * stride_kp + slot * stride_ks
        vp = V + h * stride_vh + page * stride_vp + slot * stride_vs
        k = tl.load(kp[:, None] + offs_d[None, :])
        v = tl.load(vp[:, None] + offs_d[None, :])
        s = tl.dot(q, tl.trans(k)) * qk_scale_log2
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.exp2(s - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
        if j == n_tiles - 1:
            tl.store(O + b * stride_ob + (h * G + rows)[:, None] * stride_oh + offs_d[None, :],
                     (acc / l_i[:, None]).to(O.dtype.element_ty), mask=(rows < G)[:, None])
            acc = tl.zeros((M, D), tl.float32)
            m_i = tl.full((M,), float("-inf"), tl.float32)
            l_i = tl.zeros((M,), tl.float32)


def launch(q, k_cache, v_cache, seqlen, block_table=None, items=2, BN=128, M=16, num_warps=4, num_stages=3,
           q_hoisted=False):
    """q (b, 1, hq, d); caches as `attention_with_kvcache`'s, every sequence `seqlen` keys (a multiple of BN);
    b x heads_k a multiple of `items`. `q_hoisted` (one item a program only): q loaded once before the loop."""
    b, _, hq, d = q.shape
    hk = k_cache.shape[2]
    assert seqlen % BN == 0 and (b * hk) % items == 0 and not (q_hoisted and items > 1)
    out = q.new_empty(q.shape)
    paged = block_table is not None
    page_size = k_cache.shape[1] if paged else 1 << 30
    bt = block_table if paged else out
    page_tile = min(BN, page_size) if paged and (page_size % BN == 0 or BN % page_size == 0) else 0

    def call():
        multi_item_decode[(b * hk // items,)](
            q, k_cache, v_cache, out, bt, q.stride(0), q.stride(2), k_cache.stride(0), k_cache.stride(1),
            k_cache.stride(2), v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), out.stride(0), out.stride(2),
            bt.stride(0) if paged else 0, page_size, hk, seqlen // BN, d ** -0.5 * 1.4426950408889634, G=hq // hk,
            M=M, BN=BN, D=d, ITEMS=items, PAGED=paged, PAGE_TILE=page_tile, Q_HOISTED=q_hoisted,
            num_warps=num_warps, num_stages=num_stages)
        return out
    return call
