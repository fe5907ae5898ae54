"""`@triton.jit` helpers shared by the attention kernels: masking, score transforms, one online-softmax step."""
import triton
import triton.language as tl

LOG2E = tl.constexpr(1.4426950408889634)
LN2 = tl.constexpr(0.6931471805599453)


@triton.jit
def visible(q_pos, k_pos, diag, window_left, window_right, k_len,
            MASK_LEFT: tl.constexpr, MASK_RIGHT: tl.constexpr):
    """(M, N) mask: key `k_pos` exists and lies in query `q_pos`'s bottom-right-aligned window."""
    ok = (k_pos < k_len)[None, :]
    rel = k_pos[None, :] - (q_pos + diag)[:, None]      # j - (i + Sk - Sq)
    if MASK_LEFT:
        ok = ok & (rel >= -window_left)
    if MASK_RIGHT:
        ok = ok & (rel <= window_right)
    return ok


@triton.jit
def scores_log2(qk, q_pos, k_pos, diag, slope_log2, qk_scale_log2, softcap,
                HAS_SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr):
    """Raw q·k → scaled scores in log2 units (so the softmax can use exp2)."""
    if HAS_SOFTCAP:
        # softcap * tanh(x / softcap), tanh written with exp2 so the same code runs in the interpreter.
        x = qk * (qk_scale_log2 / (LOG2E * softcap))
        e = tl.exp2(-2.0 * LOG2E * tl.abs(x))
        t = (1.0 - e) / (1.0 + e)
        s = tl.where(x >= 0, t, -t) * (softcap * LOG2E)
    else:
        s = qk * qk_scale_log2
    if HAS_ALIBI:
        dist = tl.abs((q_pos + diag)[:, None] - k_pos[None, :]).to(tl.float32)
        s = s - slope_log2[:, None] * dist
    return s


@triton.jit
def softmax_update(l_i, m_i, s, MASKED: tl.constexpr):
    """One (M, N) tile of log2 scores `s` against the running (l, m): its probabilities p, the factor alpha on
    what was accumulated before, and the new (l, m)."""
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_shift = m_new
    if MASKED:
        # A row that has seen no key yet keeps m = -inf; shift it by 0 so exp2 gives 0, not NaN.
        m_shift = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.exp2(s - m_shift[:, None])
    alpha = tl.exp2(m_i - m_shift)
    l_i = l_i * alpha + tl.sum(p, 1)
    return p, alpha, l_i, m_new


@triton.jit
def sink_keep(lse, empty, sink):
    """The factor e^lse / (e^lse + e^sink) that a sink puts on a row's output (the LSE itself stays sink-free);
    1 for a row with no key, whose output is already 0 (and where sink - lse could be inf - inf)."""
    return tl.where(empty, 1.0, 1.0 / (1.0 + tl.exp2((sink - tl.where(empty, 0.0, lse)) * LOG2E)))


@triton.jit
def lse_ptrs(LSE, b, q_head, q_pos, stride_b, stride_h, stride_s, seq_tokens):
    """Where batch b's LSE rows go in a `(batch, h_q, s_q)` tensor. `seq_tokens` > 1: the kernel's batches are
    the query tokens of a flattened `(batch // seq_tokens, seq_tokens)` call (its own s_q is 1), and token b's
    LSE is written in place at `[b // seq_tokens, :, b % seq_tokens]` (no copy kernel after the call)."""
    return LSE + (b // seq_tokens).to(tl.int64) * stride_b + q_head * stride_h + (b % seq_tokens + q_pos) * stride_s
