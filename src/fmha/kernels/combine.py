"""The split-KV combine kernel: merge each query row's partial results over disjoint key ranges.

    o = sum_i e^{lse_i - lse} o_i,   lse = log sum_i e^{lse_i}   (a part with lse_i = -inf has weight 0)

Partials are fp32 rows `O_PART[slot, row, :]` / `LSE_PART[slot, row]`, `row` being a packed query row of one
batch (kv_head, query position, query head within the group). Two ways of numbering the slots:
  - uniform: every batch has `num_splits` parts, slots 0..num_splits-1 (attention_with_kvcache);
  - variable: batch b owns slots SPLIT_OFFSETS[b] .. SPLIT_OFFSETS[b+1]-1 (the MLA tile scheduler), and a
    batch with exactly one part was written as final output by the split kernel, so it is skipped here.
Packed queries (CU_Q): batch b is sequence b, its partial rows those of its first positions (the slabs are
(batch, positions)), merged into the packed output's rows from CU_Q[b] for the positions the sequence has.
One launch for the whole merge: the torch-op merge it replaces cost about ten launches per call.

PDL (after the Gluon MLA kernel, which lets its dependents launch as it starts): the combine is a programmatic
dependent launch, and a program with nothing to merge (a batch the split kernel ran whole) leaves before
`gdc_wait`, so on a whole-planned call the launch drains beside the split kernel (on the SMs its plan leaves idle)
instead of after it. The plan's split offsets were written before the split kernel started; the partials are read
only after the wait, and program (0, 0) always waits, so the combine never completes before the split kernel.
"""
import triton
import triton.language as tl

from .common import LOG2E, lse_ptrs, sink_keep
from .launch import Plans, cdiv, fixed_classes, launch, next_pow2, prev_pow2


@triton.jit
def merge_parts(o_part, lse_part, o_mask, row_ok, first, n, stride_o, stride_l, BLOCK_S: tl.constexpr,
                UNROLL: tl.constexpr = False):
    """Parts `first .. first + n - 1` of a block of rows merged: `o_part` (rows, columns) and `lse_part` (rows,)
    point at the rows of part 0, part i's at `i * stride_o` / `i * stride_l` further. Returns the merged output,
    LSE (-inf where `empty`) and `empty`: the rows no part saw a key of. Parts go BLOCK_S at a time, online over the
    groups; a group's loads depend on nothing the group computes, so they are all in flight at once (one round trip
    to memory a group). Either as one [BLOCK_S, rows] tile of LSEs and one [BLOCK_S, rows, columns] tile of values,
    summed as a reduction of the first axis (`combine_kernel`: up to 64 parts of small tiles), or UNROLL: part by
    part, each folded in online, which holds no 3-D tile of 64-bit addresses (`forward`'s split merge: a few parts
    of its whole tile, beside the kernel's registers). The parts are read through L2 only (`.cg`): they may have
    been written by other programs of the running kernel (`forward`'s split merge)."""
    m = tl.full(row_ok.shape, float("-inf"), dtype=tl.float32)
    den = tl.zeros(row_ok.shape, dtype=tl.float32)
    acc = tl.zeros(o_mask.shape, dtype=tl.float32)
    for s0 in range(0, n, BLOCK_S):
        if UNROLL:
            for j in tl.static_range(BLOCK_S):
                ok = s0 + j < n
                slot = tl.cast(first + s0 + j, tl.int64)
                lse_j = tl.load(lse_part + slot * stride_l, mask=row_ok & ok, other=float("-inf"),
                                cache_modifier=".cg")
                o_j = tl.load(o_part + slot * stride_o, mask=o_mask & ok, other=0.0, cache_modifier=".cg")
                m_new = tl.maximum(m, lse_j)
                m_shift = tl.where(m_new == float("-inf"), 0.0, m_new)     # no part seen yet: weights 0, not NaN
                alpha = tl.exp2((m - m_shift) * LOG2E)
                w = tl.exp2((lse_j - m_shift) * LOG2E)
                acc = acc * alpha[:, None] + w[:, None] * o_j
                den = den * alpha + w
                m = m_new
        else:
            offs_s = s0 + tl.arange(0, BLOCK_S)
            slots = (first + offs_s).to(tl.int64)
            s_ok = offs_s < n
            lse_t = tl.load(lse_part[None, :] + slots[:, None] * stride_l, mask=s_ok[:, None] & row_ok[None, :],
                            other=float("-inf"), cache_modifier=".cg")
            o_t = tl.load(o_part[None, :, :] + slots[:, None, None] * stride_o,
                          mask=s_ok[:, None, None] & o_mask[None, :, :], other=0.0, cache_modifier=".cg")
            m_new = tl.maximum(m, tl.max(lse_t, axis=0))
            m_shift = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.exp2((m - m_shift) * LOG2E)
            w = tl.exp2((lse_t - m_shift[None, :]) * LOG2E)
            acc = acc * alpha[:, None] + tl.sum(w[:, :, None] * o_t, axis=0)
            den = den * alpha + tl.sum(w, axis=0)
            m = m_new
    m_shift = tl.where(m == float("-inf"), 0.0, m)
    empty = den == 0.0
    out = acc / tl.where(empty, 1.0, den)[:, None]
    return out, tl.where(empty, float("-inf"), m_shift + tl.log(tl.where(empty, 1.0, den))), empty


@triton.jit
def combine_kernel(O, LSE, O_PART, LSE_PART, SPLIT_OFFSETS, SINKS, CU_Q,
                   num_splits, group, rows_per_k, total_rows, empty_lse,
                   stride_ob, stride_os, stride_oh, stride_lseb, stride_lseh, stride_lses, seq_tokens,
                   stride_ps, stride_pb, stride_pr, stride_lps, stride_lpb,
                   DV: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_S: tl.constexpr,
                   VARIABLE_SPLITS: tl.constexpr, HAS_SINKS: tl.constexpr, PDL: tl.constexpr = False):
    # A program merges BLOCK_R packed rows of one batch, BLOCK_DV of their DV values (program_id 1 picks which).
    # Batches and row blocks share the grid's first axis (batch-major): a second axis holds at most 65535
    # programs, fewer than the row blocks of a long chunk's forced split (16k queries of 32 heads: 65536).
    # Parts go BLOCK_S at a time (`merge_parts`).
    row_blocks = tl.cdiv(total_rows, BLOCK_R)
    b = tl.program_id(0) // row_blocks
    rows = (tl.program_id(0) % row_blocks) * BLOCK_R + tl.arange(0, BLOCK_R)
    row_ok = rows < total_rows
    d0 = tl.program_id(1) * BLOCK_DV
    if VARIABLE_SPLITS:
        first = tl.load(SPLIT_OFFSETS + b)
        n = tl.load(SPLIT_OFFSETS + b + 1) - first
    else:
        first = 0
        n = num_splits
    live = n != 1                 # a batch of one part: its output written by the split kernel
    if CU_Q is not None:
        # Packed sequences: rows_per_k // group positions a slab; a sequence longer than that is another launch's
        # (`forward.attention_forward`'s short sequences) and has no parts here. A program with none of its rows
        # in its sequence merges nothing (a short launch's slabs hold its longest sequences' positions: a decode
        # uses one of them).
        q_start = tl.load(CU_Q + b)
        q_len = tl.load(CU_Q + b + 1) - q_start
        row_ok = row_ok & ((rows % rows_per_k) // group < q_len) & (q_len <= rows_per_k // group)
        live = live & (tl.sum(row_ok.to(tl.int32), axis=0) > 0)
    if PDL:
        if live | ((tl.program_id(0) == 0) & (tl.program_id(1) == 0)):
            tl.extra.cuda.gdc_wait()      # the split kernel's partials (and its completion) from here on
    if live:
        offs_d = d0 + tl.arange(0, BLOCK_DV)
        o_mask = row_ok[:, None] & (offs_d < DV)[None, :]
        o_part = O_PART + b.to(tl.int64) * stride_pb + rows.to(tl.int64)[:, None] * stride_pr + offs_d[None, :]
        lse_part = LSE_PART + b.to(tl.int64) * stride_lpb + rows
        out, lse, empty = merge_parts(o_part, lse_part, o_mask, row_ok, first, n, stride_ps, stride_lps,
                                      BLOCK_S)
        lse = tl.where(empty, empty_lse, lse)
        kv_head = rows // rows_per_k
        r = rows % rows_per_k
        q_pos = r // group
        q_head = kv_head * group + r % group
        if HAS_SINKS:
            out = out * sink_keep(lse, empty, tl.load(SINKS + q_head, mask=row_ok, other=0.0))[:, None]
        # 64-bit products: `out` may be a caller's view whose row or head stride times the index passes 2^31.
        o_row = O + b.to(tl.int64) * stride_ob + q_pos.to(tl.int64) * stride_os + q_head.to(tl.int64) * stride_oh
        if CU_Q is not None:      # the sequence's rows of the packed output
            o_row += q_start.to(tl.int64) * stride_os
        tl.store(o_row[:, None] + offs_d[None, :], out.to(O.dtype.element_ty), mask=o_mask)
        lse_row = lse_ptrs(LSE, b, q_head, q_pos, stride_lseb, stride_lseh, stride_lses, seq_tokens)
        if CU_Q is not None:
            lse_row += q_start.to(tl.int64) * stride_lses
        tl.store(lse_row, lse, mask=row_ok & (d0 == 0))


# fp32 values of the parts' tile a program has in flight at once (BLOCK_S x BLOCK_R x BLOCK_DV); at most
# _MAX_GROUP parts a tile (the most `schedule.plan_num_splits` plans: a planned split decode merges in one tile).
_IN_FLIGHT = 8192
_MAX_GROUP = 64
# A grid short of covering every SM twice splits the DV values over programs, down to this many a program.
_MIN_DV_CHUNK = 32


def combine(out, lse, o_part, lse_part, *, rows_per_k, group, split_offsets=None, num_splits=0, sinks=None,
            empty_lse=float("-inf"), cu_seqlens_q=None, pdl=False):
    """Merge partials into `out (b, s_q, h_q, dv)` and `lse (b, h_q, s_q)`, or `lse (b // t, h_q, t)` when the b
    batches are the t query tokens each of a flattened call (s_q = 1; `common.lse_ptrs`), or with `cu_seqlens_q
    (b + 1,)` int32 into packed `out (total_q, h_q, dv)` and `lse (h_q, total_q)`: sequence b's partials (its
    first s_q = rows_per_k // group positions) go to its rows, those it has, and a sequence of more rows than
    s_q is left as it is.

    o_part: `(slots, [b,] rows, dv)` fp32, lse_part: `(slots, [b,] rows)` fp32 — with the batch axis for uniform
    splits (`num_splits` slots per batch), without it when `split_offsets (b + 1,)` numbers each batch's slots.
    A row's packed index is `kv_head * rows_per_k + q_pos * group + (q_head % group)`.
    `pdl`: launched as a programmatic dependent launch (the module docstring; CUDA sm_90+, with `split_offsets`).
    """
    if cu_seqlens_q is not None:         # packed: one batch of every token, sequence b read from CU_Q (batch stride 0)
        out, lse = (t.unsqueeze(0).expand(o_part.shape[1], *t.shape) for t in (out, lse))
    key = (out.shape, out.stride(), lse.shape, lse.stride(), o_part.shape, o_part.stride(), lse_part.shape,
           lse_part.stride(), out.device, rows_per_k, group, split_offsets is None, num_splits, sinks is None,
           empty_lse, cu_seqlens_q is None, pdl)
    plan = _PLANS.get(key)
    if plan is None:
        plan = _PLANS.keep(key, _plan(out, lse, o_part, lse_part, rows_per_k=rows_per_k, group=group,
                                      per_batch=split_offsets is None, num_splits=num_splits, sinks=sinks,
                                      empty_lse=empty_lse, pdl=pdl))
    grid, scalars, meta, fixed = plan
    launch(combine_kernel, grid, (out, lse, o_part, lse_part, split_offsets, sinks, cu_seqlens_q, *scalars), meta,
           fixed)


# Launch plans of `combine` (grid, scalar arguments, meta, `launch`'s fixed classes) by its tensors' shapes, strides
# and device and its options: a decode step's combine is planned once.
_PLANS = Plans()


def _plan(out, lse, o_part, lse_part, *, rows_per_k, group, per_batch, num_splits, sinks, empty_lse, pdl):
    """`combine`'s launch without its tensors."""
    from ..schedule import num_sms

    batch, dv = out.shape[0], out.shape[-1]
    total_rows = o_part.shape[-2]
    # Parts per batch: exact for uniform splits, one tile for all of them (every part's loads in flight at once); the
    # average for the scheduler's (a batch with more loops).
    parts = num_splits if per_batch else -(-o_part.shape[0] // max(batch, 1))
    block_s = min(_MAX_GROUP, next_pow2(max(parts, 2)))        # a tile's first axis: a power of two
    # A small grid (b = 1 long-context decode: 33-64 parts of 32 rows) splits DV so that more SMs read the parts.
    cover = 2 * num_sms(out.device)
    block_dv = min(next_pow2(dv), max(_MIN_DV_CHUNK, prev_pow2(_IN_FLIGHT // block_s)))
    while block_dv > _MIN_DV_CHUNK and batch * total_rows * cdiv(dv, block_dv) < cover:
        block_dv //= 2
    # Rows per program: as many as the in-flight budget allows while the grid still covers every SM twice.
    block_r = prev_pow2(max(1, min(_IN_FLIGHT // (block_s * block_dv), batch * total_rows // cover, 8)))
    scalars = (num_splits, group, rows_per_k, total_rows, empty_lse,
               out.stride(0), out.stride(1), out.stride(2), lse.stride(0), lse.stride(1), lse.stride(2),
               batch // max(lse.shape[0], 1), o_part.stride(0), o_part.stride(1) if per_batch else 0,
               o_part.stride(-2), lse_part.stride(0), lse_part.stride(1) if per_batch else 0)
    meta = dict(DV=dv, BLOCK_DV=block_dv, BLOCK_R=block_r, BLOCK_S=block_s, VARIABLE_SPLITS=not per_batch,
                HAS_SINKS=sinks is not None, num_warps=4)
    if pdl:
        meta.update(PDL=True, launch_pdl=True)
    return (batch * cdiv(total_rows, block_r), cdiv(dv, block_dv)), scalars, meta, fixed_classes(scalars, meta)
