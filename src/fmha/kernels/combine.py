"""The split-KV combine kernel: merge each query row's partial results over disjoint key ranges.

    o = sum_i e^{lse_i - lse} o_i,   lse = log sum_i e^{lse_i}   (a part with lse_i = -inf has weight 0)

Partials are fp32 rows `O_PART[slot, row, :]` / `LSE_PART[slot, row]`, `row` being a packed query row of one
batch (kv_head, query position, query head within the group). Two ways of numbering the slots:
  - uniform: every batch has `num_splits` parts, slots 0..num_splits-1 (attention_with_kvcache);
  - variable: batch b owns slots SPLIT_OFFSETS[b] .. SPLIT_OFFSETS[b+1]-1 (the MLA tile scheduler), and a
    batch with exactly one part was written as final output by the split kernel, so it is skipped here.
One launch for the whole merge: the torch-op merge it replaces cost about ten launches per call.
"""
import triton
import triton.language as tl

from .common import LOG2E, sink_keep


@triton.jit
def combine_kernel(O, LSE, O_PART, LSE_PART, SPLIT_OFFSETS, SINKS,
                   num_splits, group, rows_per_k, empty_lse,
                   stride_ob, stride_os, stride_oh, stride_lseb, stride_lseh, stride_lses,
                   stride_ps, stride_pb, stride_pr, stride_lps, stride_lpb,
                   DV: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_S: tl.constexpr,
                   VARIABLE_SPLITS: tl.constexpr, HAS_SINKS: tl.constexpr):
    # One program per (batch, packed row). The parts are read BLOCK_S at a time as one tile, not one after
    # another: a merge of 32 parts over 4 programs, each waiting on 2 x 32 dependent loads, took ~10% of a
    # b=1 long-context decode call.
    b = tl.program_id(0)
    row = tl.program_id(1)
    if VARIABLE_SPLITS:
        first = tl.load(SPLIT_OFFSETS + b)
        n = tl.load(SPLIT_OFFSETS + b + 1) - first
    else:
        first = 0
        n = num_splits
    if n != 1:
        offs_s = tl.arange(0, BLOCK_S)
        offs_d = tl.arange(0, BLOCK_DV)
        o_part = O_PART + b.to(tl.int64) * stride_pb + row.to(tl.int64) * stride_pr + offs_d[None, :]
        lse_part = LSE_PART + b.to(tl.int64) * stride_lpb + row
        # Online over chunks of parts (one chunk unless a batch has more than BLOCK_S parts).
        m = float("-inf")
        den = 0.0
        acc = tl.zeros([BLOCK_DV], dtype=tl.float32)
        for s0 in range(0, n, BLOCK_S):
            slot = (first + s0 + offs_s).to(tl.int64)
            s_ok = s0 + offs_s < n
            lse_c = tl.load(lse_part + slot * stride_lps, mask=s_ok, other=float("-inf"))
            m_new = tl.maximum(m, tl.max(lse_c, 0))
            m_shift = tl.where(m_new == float("-inf"), 0.0, m_new)     # no part seen yet: weights 0, not NaN
            alpha = tl.exp2((m - m_shift) * LOG2E)
            w = tl.exp2((lse_c - m_shift) * LOG2E)
            o_c = tl.load(o_part + slot[:, None] * stride_ps, mask=s_ok[:, None] & (offs_d < DV)[None, :], other=0.0)
            acc = acc * alpha + tl.sum(w[:, None] * o_c, 0)
            den = den * alpha + tl.sum(w, 0)
            m = m_new
        m_shift = tl.where(m == float("-inf"), 0.0, m)
        empty = den == 0.0
        out = acc / tl.where(empty, 1.0, den)
        lse = tl.where(empty, empty_lse, m_shift + tl.log(tl.where(empty, 1.0, den)))
        kv_head = row // rows_per_k
        r = row % rows_per_k
        q_pos = r // group
        q_head = kv_head * group + r % group
        if HAS_SINKS:
            out = out * sink_keep(lse, empty, tl.load(SINKS + q_head))
        o_row = O + b.to(tl.int64) * stride_ob + q_pos * stride_os + q_head * stride_oh
        tl.store(o_row + offs_d, out.to(O.dtype.element_ty), mask=offs_d < DV)
        tl.store(LSE + b.to(tl.int64) * stride_lseb + q_head * stride_lseh + q_pos * stride_lses, lse)


# Parts x value columns held in one tile (fp32): 64 parts at dv = 128, 16 at dv = 512.
_TILE_ELEMENTS = 8192


def combine(out, lse, o_part, lse_part, *, rows_per_k, group, split_offsets=None, num_splits=0, sinks=None,
            empty_lse=float("-inf")):
    """Merge partials into `out (b, s_q, h_q, dv)` and `lse (b, h_q, s_q)`.

    o_part: `(slots, [b,] rows, dv)` fp32, lse_part: `(slots, [b,] rows)` fp32 — with the batch axis for uniform
    splits (`num_splits` slots per batch), without it when `split_offsets (b + 1,)` numbers each batch's slots.
    A row's packed index is `kv_head * rows_per_k + q_pos * group + (q_head % group)`.
    """
    batch, dv = out.shape[0], out.shape[-1]
    total_rows = o_part.shape[-2]
    per_batch = split_offsets is None
    block_dv = triton.next_power_of_2(dv)
    most = num_splits if per_batch else o_part.shape[0]        # parts one batch can have
    block_s = max(2, min(triton.next_power_of_2(max(most, 1)), _TILE_ELEMENTS // block_dv))
    combine_kernel[(batch, total_rows)](
        out, lse, o_part, lse_part, split_offsets, sinks,
        num_splits, group, rows_per_k, empty_lse,
        out.stride(0), out.stride(1), out.stride(2), lse.stride(0), lse.stride(1), lse.stride(2),
        o_part.stride(0), o_part.stride(1) if per_batch else 0, o_part.stride(-2),
        lse_part.stride(0), lse_part.stride(1) if per_batch else 0,
        DV=dv, BLOCK_DV=block_dv, BLOCK_S=block_s,
        VARIABLE_SPLITS=not per_batch, HAS_SINKS=sinks is not None, num_warps=4,
    )
