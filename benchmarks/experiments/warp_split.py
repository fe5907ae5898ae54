"""Experiment: a decode kernel whose warps each own their own key tiles (a batched 3-D `tl.dot`, warps on the
batch dimension; an FP8 cache is converted to q's dtype
after the load, descales 1), so the online softmax never crosses warps inside the loop; the warps' partial (m, l, acc)
merge once at the end. bf16 / fp16, seqlen_q = 1, packed GQA rows <= M, paged or contiguous, no options."""
import triton
import triton.language as tl


@triton.jit
def warp_split_decode(Q, K, V, O, LENS, BT, stride_qb, stride_qh, stride_kp, stride_ks, stride_kh,
                      stride_vp, stride_vs, stride_vh, stride_ob, stride_oh, stride_bt, page_size, heads_k,
                      qk_scale_log2, G: tl.constexpr, M: tl.constexpr, W: tl.constexpr, BN: tl.constexpr,
                      D: tl.constexpr, PAGED: tl.constexpr, PAGE_TILE: tl.constexpr):
    pid = tl.program_id(0)
    b = pid // heads_k
    h = pid % heads_k
    k_len = tl.load(LENS + b)
    rows = tl.arange(0, M)
    offs_d = tl.arange(0, D)
    q = tl.load(Q + b * stride_qb + (h * G + rows)[:, None] * stride_qh + offs_d[None, :],
                mask=(rows < G)[:, None], other=0.0)
    q3 = tl.broadcast_to(q[None, :, :], (W, M, D))
    acc = tl.zeros((W, M, D), tl.float32)
    m_i = tl.full((W, M), float("-inf"), tl.float32)
    l_i = tl.zeros((W, M), tl.float32)
    key = tl.arange(0, W)[:, None] * BN + tl.arange(0, BN)[None, :]
    bt_row = BT + b.to(tl.int64) * stride_bt
    k_base = K + h * stride_kh
    v_base = V + h * stride_vh
    TILE: tl.constexpr = W * BN
    full_end = (k_len // TILE) * TILE
    for n in tl.range(0, full_end, TILE):
        pos = n + key
        if PAGED:
            if PAGE_TILE > 0:
                # each warp's BN keys are BN // PAGE_TILE whole pages (or lie in one page): one lookup a page
                PAGES: tl.constexpr = BN // PAGE_TILE
                first = n + tl.arange(0, W)[:, None] * BN + tl.arange(0, PAGES)[None, :] * PAGE_TILE
                pages = tl.load(bt_row + first // page_size).to(tl.int64)
                page = tl.reshape(tl.broadcast_to(pages[:, :, None], (W, PAGES, PAGE_TILE)), (W, BN))
            else:
                page = tl.load(bt_row + pos // page_size).to(tl.int64)
            slot = pos % page_size
        else:
            page = b.to(tl.int64)
            slot = pos.to(tl.int64)
        kp = k_base + page * stride_kp + slot * stride_ks
        vp = v_base + page * stride_vp + slot * stride_vs
        k3 = tl.load(kp[:, :, None] + offs_d[None, None, :]).to(q.dtype)
        v3 = tl.load(vp[:, :, None] + offs_d[None, None, :]).to(q.dtype)
        s = tl.dot(q3, tl.trans(k3, (0, 2, 1))) * qk_scale_log2
        m_new = tl.maximum(m_i, tl.max(s, 2))
        p = tl.exp2(s - m_new[:, :, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 2)
        acc = acc * alpha[:, :, None] + tl.dot(p.to(v3.dtype), v3)
        m_i = m_new
    if full_end < k_len:
        pos = full_end + key
        ok = pos < k_len
        if PAGED:
            page = tl.load(bt_row + pos // page_size, mask=ok, other=0).to(tl.int64)
            slot = pos % page_size
        else:
            page = b.to(tl.int64)
            slot = pos.to(tl.int64)
        kp = k_base + page * stride_kp + slot * stride_ks
        vp = v_base + page * stride_vp + slot * stride_vs
        k3 = tl.load(kp[:, :, None] + offs_d[None, None, :], mask=ok[:, :, None], other=0.0).to(q.dtype)
        v3 = tl.load(vp[:, :, None] + offs_d[None, None, :], mask=ok[:, :, None], other=0.0).to(q.dtype)
        s = tl.dot(q3, tl.trans(k3, (0, 2, 1))) * qk_scale_log2
        s = tl.where(ok[:, None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 2))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp2(s - m_safe[:, :, None])
        alpha = tl.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 2)
        acc = acc * alpha[:, :, None] + tl.dot(p.to(v3.dtype), v3)
        m_i = m_new
    m_all = tl.max(m_i, 0)
    m_all = tl.where(m_all == float("-inf"), 0.0, m_all)
    f = tl.exp2(m_i - m_all[None, :])
    l_all = tl.sum(l_i * f, 0)
    o = tl.sum(acc * f[:, :, None], 0)
    o = o / tl.where(l_all == 0.0, 1.0, l_all)[:, None]
    tl.store(O + b * stride_ob + (h * G + rows)[:, None] * stride_oh + offs_d[None, :], o.to(O.dtype.element_ty),
             mask=(rows < G)[:, None])


def launch(q, k_cache, v_cache, lens, block_table=None, W=4, BN=32, M=16, num_warps=4, num_stages=3):
    """q (b, 1, hq, d); caches as `attention_with_kvcache`'s."""
    b, _, hq, d = q.shape
    hk = k_cache.shape[2]
    out = q.new_empty(q.shape)
    paged = block_table is not None
    page_size = k_cache.shape[1] if paged else 1 << 30
    bt = block_table if paged else lens
    page_tile = min(BN, page_size) if paged and (page_size % BN == 0 or BN % page_size == 0) else 0
    warp_split_decode[(b * hk,)](
        q, k_cache, v_cache, out, lens, bt, q.stride(0), q.stride(2), k_cache.stride(0), k_cache.stride(1),
        k_cache.stride(2), v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), out.stride(0), out.stride(2),
        bt.stride(0), page_size, hk, d ** -0.5 * 1.4426950408889634, G=hq // hk, M=M, W=W, BN=BN, D=d,
        PAGED=paged, PAGE_TILE=page_tile, num_warps=num_warps, num_stages=num_stages)
    return out
