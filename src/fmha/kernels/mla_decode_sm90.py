"""Hopper (sm_90) fast path of MLA decode and of DeepSeek's sparse attention, written in Gluon.

`mla_decode.py` is the portable `triton.language` kernel (and what the CPU tests run). This one takes every
call with one KV head (its packed query rows, however few, run in 64-row blocks), DV = 512 latent columns plus
DT = 64 RoPE columns or none (DeepSeek-V4's head_dim 512):
- bf16/fp16 paged caches with pages of a multiple of 64 keys: TMA from one page per tile;
- token-sparse calls (index rows instead of a block table: sparse decode, `flash_mla_sparse_fwd`) and FP8
  caches (V3.2's 656-byte rows, V4's per-page layout of 584 bytes a key; paged or sparse), with or without V4's
  second (sliding-window) source: gathered, see "Gathers" below.
  (FP8 sparse decode planned whole, heads in 64-row blocks, runs `sparse_decode_sm90` instead, where a loading
  warpgroup dequantises in registers; a dense bf16/fp16 call with a RoPE part and at most 32 packed rows runs
  `mla_rows_sm90`'s transposed products, with this module's plan and arguments: `ROWS_KERNEL_MAX`.)
With 64 rows the `triton.language` kernel is compute-bound and stops at 0.45x FlashMLA (benchmarks/NOTES.md):
it computes the 64 x 64 x 576 score tile twice, once per warpgroup.

One program owns 64 packed query rows and one part of the key blocks (`schedule.plan_mla`, the same plan and
partial-result layout as the portable kernel, merged by `combine.py`, launched as this kernel's programmatic
dependent: `_launch_dependents`). Two warpgroups, each owning 256 of the 512 output columns (a 64 x 256 fp32
accumulator). The consumers issue their own loads, except with V3.2's FP8
cache and model1's on long token rows, where a third warpgroup (`_producer`) issues every gather (see "Loading
warpgroup" below).

Key tiles (64 keys x 576 columns) go in pairs: warpgroup 0 computes the scores of the first tile of a pair,
warpgroup 1 those of the second, so no score is computed twice and both run their Q·Kᵀ at the same time. The
running row max passes between them through shared memory ("seesaw"):
    WG0: S0 = Q·K0ᵀ; m0 = max(m, rowmax S0); P0 = exp2(S0 - m0); O_L = O_L·e^(m - m0) + P0·V0_L
    WG1: S1 = Q·K1ᵀ; m1 = max(m0, rowmax S1); P1 = exp2(S1 - m1); O_R = O_R·e^(m - m1) + P1·V1_R
    WG0: O_L = O_L·e^(m0 - m1) + P1·V1_L        WG1: O_R += (P0·e^(m0 - m1))·V0_R
Each warpgroup hands its P to the other through shared memory, written over its tile's RoPE columns (only Q·Kᵀ reads
them, and that is done by then), so the plan fits the 227 KB of shared memory: Q 72 KB and two 72 KB key tiles (with
model1's cache P1 has an 8 KB buffer of its own instead). Each warpgroup sums the probabilities it computed; the two
row sums are added at the end.
On the TMA (dense) forms the running max is raised lazily, only where a tile's scores pass it by more than
LAZY_BY, and warpgroup 0 skips its two accumulator rescales of a pair while no row's max moved.

Loads: a tile's slot is three parts (latent halves L and R, RoPE), each with its own barrier. Whichever
warpgroup uses a part last issues the load of the tile two ahead into it, so half of the next pair (its first
tile's L, its second tile's R) loads while this pair's last products run. Each warpgroup issues the scores of
its tile at the top of a pair, right after the previous pair's loads (one copy of that code, FP8's dequantisation
included). Outputs leave through the Q buffer (bf16 final rows or fp32 partials) by TMA store.

Gathers (sparse, FP8, a second source). Hopper's TMA cannot gather rows, so the warpgroup that issues a load
copies the part's 64 rows itself with cp.async (16 bytes a copy where the rows' alignment allows), each of its
128 threads arriving on the part's barrier when its own copies land; every consumer of a gathered part waits
on that barrier and fences (cp.async writes through the generic proxy, wgmma reads through the async one).
Keys that do not exist (index -1 or past the cache, past a token's valid length, past a sequence's end) are
zero-filled by the copy and masked in the scores. FP8: a latent half lands as e4m3 bytes in the upper half of
its own 32 KB buffer, with its own scales beside the tile, and the warpgroup that scores the tile turns it into
bf16 values in place (`_dequant`: every thread reads its bytes, a barrier, then the stores) just before its
Q·Kᵀ on that half; the other warpgroup reads it as values after the hand-offs that follow those scores.
model1's RoPE values (bf16, the last 64 of its 512 columns) land in the RoPE slot and are copied into half R
by the same step. A second source: the planned row's keys from `main_span` on are the extra cache's, each
tile wholly one source's (`_source` picks its fields without a branch, so the gather code exists once). The
index row (or block-table entries) a gather reads is staged in shared memory a tile pair ahead by cp.async
(`_stage_keys`), so its load's latency hides behind that pair instead of stalling the issuing warpgroup.

Loading warpgroup (FP8 caches: V3.2's always, model1's at h_q = 128 where a token's row is long; `uses_loader`). A
third warpgroup is possible when it is Triton's default partition and the consumers are both workers (their
setmaxnreg then lets ptxas keep a 64 x 256 accumulator without serialising the wgmmas); the three share 3 x 168
registers a thread (`PRODUCER_CONSUMER_REGS` each for the consumers). It walks the same pieces, loads Q and gathers
each part of each tile as soon as the consumers release the part's slot (`_release`, at the points where they would
otherwise issue the load), so the consumers keep only the dequantisation and the math. It measured +3% on V3.2's
sparse decode rows and +2-3% on model1's at h_q = 128 (18 key tiles a token), +5-6% more once P1 had a buffer of its
own there; at h_q = 64 it loses at every row length (since the twenty-ninth session's changes to the consumers' own
loads), and the bf16 gathers (the sparse prefill) lost 1-21% (-3..+1% since the thirty-fourth session, with 224
consumer registers): those keep their own loads. Dequantising in it as well
was slower on every row: one warpgroup's 128 threads do the work the two consumers' 256 did, and it stalls on every
gather it must wait for; only the halves each consumer scores first, still -20-28% (benchmarks/NOTES.md,
twenty-third, twenty-fifth and twenty-eighth sessions).

A paged bf16/fp16 cache may hold anything (NaN included) past a sequence's end; the last tile's rows there are
zeroed in shared memory before they are used as values (0 · NaN would poison the output), each warpgroup its
own half.
"""
from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_init, warpgroup_mma_wait)

from .._kv_fp8 import MODEL1_ROW, MODEL1_TAIL, model1_parts
from ..schedule import SCHED_BLOCK, SCHED_FIELDS as _SCHED_FIELDS
from .cluster_sm90 import THREADS
from .forward_sm90 import bar, bars, zero_rows_from
from .launch import cdiv, fixed_classes, launch
from .sm90 import box, descriptor_in, on_hopper

ROWS = gl.constexpr(64)           # packed query rows per program (wgmma's M)
BLOCK_N = gl.constexpr(64)        # keys per tile: one scheduling block
HALF = gl.constexpr(256)          # value columns per consumer warpgroup
DT = gl.constexpr(64)             # RoPE columns
SCHED_FIELDS = gl.constexpr(_SCHED_FIELDS)
# A key tile's ring slot is three parts, each with its own ready barrier; whichever warpgroup uses a part last
# loads the tile two ahead into it: the latent halves L (columns 0-255) and R (256-511) and the RoPE columns
# (which also carry P).
PART_L = gl.constexpr(0)
PART_R = gl.constexpr(1)
PART_ROPE = gl.constexpr(2)
# SPARSE: 0 a paged (block-table) call, 1 token-sparse, SHIFTED token-sparse whose sources' page sizes are powers of
# two, passed as their log2 (`_key_rows` shifts and masks instead of dividing: V4 +1-3%, NOTES.md twenty-sixth
# session).
SHIFTED = gl.constexpr(2)
# FP8 cache layouts (`_kv_fp8.py`): V3.2, 656 bytes a key: 512 e4m3 | 4 fp32 scales | 64 bf16 RoPE values;
# model1 (V4), per page: 576-byte rows of 448 e4m3 | 64 bf16 RoPE values, then 8 bytes a key: 7 UE8M0 scales | pad.
V32 = gl.constexpr(1)
MODEL1 = gl.constexpr(2)
MODEL1_NOPE = gl.constexpr(448)
SCALE_SMEM = gl.constexpr(gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
# The keys of a gathered tile, 4 rows a warp and 8 threads a row: every gather copy (`_copy_columns`) maps rows to
# threads this way, so the keys reach the copies without a layout conversion.
KEY_ROWS = gl.constexpr(gl.SliceLayout(1, gl.BlockedLayout([1, 16], [4, 8], [4, 1], [1, 0])))
# A 64-row warpgroup's wgmma results: a score tile (ROWS, BLOCK_N), an output half (ROWS, HALF), and P as the A
# operand of P·V from registers.
S_LAYOUT = gl.constexpr(gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                 instr_shape=[16, BLOCK_N.value, 16]))
O_LAYOUT = gl.constexpr(gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                 instr_shape=[16, HALF.value, 16]))
P_LAYOUT = gl.constexpr(gl.DotOperandLayout(operand_index=0, parent=O_LAYOUT.value, k_width=2))
LN2 = gl.constexpr(0.6931471805599453)
# The running max is only raised when a tile's scores exceed it by more than this (log2 units; `_raise_max`).
LAZY_BY = gl.constexpr(8.0)
LOG2E = gl.constexpr(1.4426950408889634)
STAGES = gl.constexpr(2)          # key tiles in flight: 2 x 72 KB
KIDX = gl.constexpr(8)            # the producer's staged index rows: tile t's in slot t % KIDX
# A block here is always 64 rows, however few a KV head has (TMA fills the missing ones with zeros, stores drop
# them): 16 rows are 4x their tensor-core work, 1 row 64x, but those calls are memory-bound and the padded block
# still reads faster than the portable kernel's 16-row transposed form. (The dense calls with a RoPE part and at
# most 32 rows now take `mla_rows_sm90` instead, ROWS_KERNEL_MAX below; these figures are the block's.) h_q = 16, s_q = 1: +4-6% (b = 128, s_k
# 4k-16k); 1-8 packed rows (h_q 1-8 with s_q 1 or 2, tensor parallelism's 8 or 4 heads a rank): 0.67-0.74 of the
# copy bandwidth on the portable kernel, 0.85-0.91 in 64-row blocks here, 1.23-1.27x
# (`history/mla_few_heads_h200_af3f68f.json`, q padded to 16 heads then; `experiments/mla_few_heads.py`). The FP8
# and token-sparse calls of 8 x 1 and 4 x 2 rows: 2.99-3.90x the portable kernel (V3.2 paged, V3.2 sparse topk
# 2048), 6.76x (V4 with its extra source) (`history/mla_few_heads_fp8_h200_5594b33.json`).
CONSUMER_REGS = 240               # the worker warpgroup's setmaxnreg (8 warps: 255 registers anyway)
# With a loading warpgroup (`_producer`) the three share 3 x 168 registers a thread: the consumers get this many,
# the loader the rest. V3.2's FP8 cache: 216 (the loader 72); 208 / 224 measured 2% / 2-10% slower on the V3.2
# sparse decode rows. model1 (V4): 208 (the loader 88); 216 lost 6-8% there (NOTES.md, twenty-third session).
# bf16/fp16 gathers (never by `uses_loader`'s rule; a test forces it): 224, the best of 208 / 216 / 224 on the sparse
# prefill, where it still measured -3..+1% against the consumers' own loads (NOTES.md, thirty-fourth session).
PRODUCER_CONSUMER_REGS = {"v32": 216, "model1": 208, None: 224}
# model1 sparse calls whose query tokens have at least this many key tiles take the loading warpgroup, with one /
# two 64-row query blocks a token (h_q = 64 / 128; None: never). It gains where a token's pairs outweigh the piece
# boundary it lengthens. Since the consumers' own loads got their early RoPE gathers and split first loads
# (twenty-ninth session, `probe_mla.py --loader-sweep`): h_q = 64 lost to it at 6 to 34 tiles (-2..-14% at b = 64,
# -5..-9% at b = 128); h_q = 128 lost 1-2% at 6, was level at 10 and gained 0.3-1.8% at 18 and 34.
MODEL1_LOADER_TILES = (None, 14)
# Dense bf16/fp16 calls with a RoPE part and at most this many packed rows a KV head run `mla_rows_sm90`'s transposed
# products instead of a 64-row block (0: never): b = 128, s_k 4k-16k, h_q 16 (s_q 1, 2) and 32 (s_q 1), +2.7..+9.3%
# over the block, 1.046-1.103x FlashMLA in the same process (`probe_mla.py --rows-kernel`,
# `history/probe_mla_rows_kernel_h200_42735e1.json`).
ROWS_KERNEL_MAX = 32


@gluon.jit
def _piece(SEQLENS, b, blk, remaining):
    """Batch b's piece of this part: (sequence length, key blocks taken from block blk on); `take` may be 0
    (an empty sequence)."""
    seqlen = gl.load(SEQLENS + b)
    take = gl.minimum(gl.cdiv(seqlen, BLOCK_N) - blk, remaining)
    return seqlen, take


@gluon.jit
def _score_part(q_lat, q_rope, bufs, t, s, PART: gl.constexpr, GATHER: gl.constexpr, FP8: gl.constexpr):
    """Add one part of Q·Kᵀ for key tile t (async), once that part has landed (FP8: and been dequantised;
    model1's half R also takes the RoPE part's values)."""
    k_lat, k_rope, k_ready, k_raw, k_scale = bufs
    slot = t % STAGES
    _landed(k_ready, t, PART, GATHER)
    if PART == PART_ROPE:
        s = warpgroup_mma(q_rope, k_rope.index(slot).permute((1, 0)), s, is_async=True)
    else:
        if FP8 != 0:
            if (FP8 == MODEL1) and (PART == PART_R):
                _landed(k_ready, t, PART_ROPE, GATHER)
            _dequant(bufs, slot, PART, FP8)
        # Q's buffer indexed by PART plus a run-time 0 (t >> 30: tiles never number 2^30), so that the compiler
        # cannot hoist Q's wgmma descriptors out of the loop, where they were kept in spilled registers and
        # reloaded in front of these products.
        s = warpgroup_mma(q_lat.index(PART + (t >> 30)), k_lat.index(2 * slot + PART).permute((1, 0)), s,
                          is_async=True)
    return s


@gluon.jit
def _scores(q_lat, q_rope, bufs, t, FIRST: gl.constexpr, s_layout: gl.constexpr, GATHER: gl.constexpr,
            FP8: gl.constexpr, HAS_ROPE: gl.constexpr):
    """Issue S = Q·Kᵀ over the 576 (512 without RoPE) columns of key tile t: latent half FIRST, the other
    half, then RoPE."""
    s = warpgroup_mma_init(gl.zeros([ROWS, BLOCK_N], gl.float32, s_layout))
    s = _score_part(q_lat, q_rope, bufs, t, s, FIRST, GATHER, FP8)
    s = _score_part(q_lat, q_rope, bufs, t, s, 1 - FIRST, GATHER, FP8)
    if HAS_ROPE:
        s = _score_part(q_lat, q_rope, bufs, t, s, PART_ROPE, GATHER, FP8)
    return s


@gluon.jit
def _landed(k_ready, t, PART: gl.constexpr, GATHER: gl.constexpr):
    """Wait until part PART of key tile t is in shared memory. A gathered part was written by cp.async, through
    the generic proxy: fence it before the tensor cores (the async proxy) read it. Each warpgroup waits for
    every gathered part it reads itself (the wait on a completed phase returns at once)."""
    mbarrier.wait(k_ready[PART].index(t % STAGES), (t // STAGES) & 1)
    if GATHER:
        fence_async_shared()


@gluon.jit
def _tile_keys_ok(kv, n, staged, s_layout: gl.constexpr, EXTRA: gl.constexpr):
    """SPARSE: which keys of the tile at planned key n exist (`_key_rows`' rule, the one the gathers zero-fill
    by), along the score tile's columns, from its index row `staged` (a `kidx` slot in shared memory,
    `_stage_keys`)."""
    layout: gl.constexpr = gl.SliceLayout(0, s_layout)
    src, m = _source(kv, n, EXTRA)
    page, slot, ok = _key_rows(src, m, staged.load(layout), layout, True)
    return ok


@gluon.jit
def _source(kv, n, EXTRA: gl.constexpr):
    """(source, key position in it) of planned key n: the main source's keys, then (EXTRA) the second
    source's from the planned row's key main_span on. Picked field by field (no branch), so the code that
    reads a source exists once."""
    main = kv[4]
    if EXTRA:
        x = n >= kv[6]
        extra = kv[5]
        src = (gl.where(x, extra[0], main[0]), gl.where(x, extra[1], main[1]), gl.where(x, extra[2], main[2]),
               gl.where(x, extra[3], main[3]), gl.where(x, extra[4], main[4]), gl.where(x, extra[5], main[5]),
               gl.where(x, extra[6], main[6]), gl.where(x, extra[7], main[7]), gl.where(x, extra[8], main[8]),
               gl.where(x, extra[9], main[9]))
        return src, gl.where(x, n - kv[6], n)
    return main, n


@gluon.jit
def _mask(s, n, full, seqlen, last_visible, qk_scale_log2, key_ok, s_layout: gl.constexpr, SPARSE: gl.constexpr):
    """Scaled log2 scores of the tile at key n: keys past the sequence or past a row's causal limit get -inf
    (only tiles that cross `full`, the first key some row cannot see, are masked); SPARSE: keys not `key_ok`."""
    s = s * qk_scale_log2
    if SPARSE:
        s = gl.where(key_ok[None, :], s, float("-inf"))
    elif n + BLOCK_N > full:
        k_pos = n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
        ok = (k_pos[None, :] < seqlen) & (k_pos[None, :] <= last_visible[:, None])
        s = gl.where(ok, s, float("-inf"))
    return s


@gluon.jit
def _raise_max(m, s, LAZY: gl.constexpr):
    """The running row max after scores s: max(m, row max of s), except that LAZY keeps m on rows where the
    tile's max exceeds it by at most LAZY_BY (log2 units). The probabilities are then taken against a stale max
    and reach 2^LAZY_BY at most; the output and LSE are unchanged (both are relative to the same max), and the
    accumulator's rescale is skipped whenever no row's max moved (`_rescale`)."""
    mx = gl.maximum(m, gl.max(s, 1))
    if LAZY:
        mx = gl.where(mx > m + LAZY_BY, mx, m)
    return mx


@gluon.jit
def _rescale(acc, factor, moved, row_o: gl.constexpr, LAZY: gl.constexpr):
    """acc times a per-row factor (in a row layout of the score tile). LAZY: skipped when no row's max `moved`
    (every factor is then 1, or 0 on a row that has no visible key yet, whose accumulator is all zeros)."""
    if LAZY:
        if gl.max(moved.to(gl.int32), 0) > 0:
            acc = acc * gl.convert_layout(factor, row_o)[:, None]
    else:
        acc = acc * gl.convert_layout(factor, row_o)[:, None]
    return acc


@gluon.jit
def _shift(m):
    """A row with no visible key yet has max -inf; exponents are taken relative to 0 there (no inf - inf)."""
    return gl.where(m == float("-inf"), 0.0, m)


@gluon.jit
def _zero_tail(v, n, seqlen, PAGED: gl.constexpr):
    """PAGED (a TMA-loaded tile, which may hold anything past the sequence's end): zero the rows of the
    (BLOCK_N, HALF) value tile at key n that lie at or past `seqlen` (`forward_sm90.zero_rows_from`). Gathered
    tiles arrive with those rows zero-filled: no code at all for them (a runtime test that never passes still left
    1,200 SASS instructions in the gather forms)."""
    if PAGED:
        if n + BLOCK_N > seqlen:
            zero_rows_from(v, seqlen - n)


@gluon.jit
def _put_rows(buf, x):
    """Publish a per-row vector to the other warpgroup (`_signal` then arrives on a barrier)."""
    buf.store(x)


@gluon.jit
def _release(k_free, slot, A: gl.constexpr, B: gl.constexpr):
    """Tell the producer that this warpgroup is done with parts A and B (-1: none) of ring slot `slot`."""
    gl.thread_barrier()
    mbarrier.arrive(k_free[A].index(slot), count=1)
    if B >= 0:
        mbarrier.arrive(k_free[B].index(slot), count=1)


@gluon.jit
def _signal(bar):
    # Every thread's shared-memory writes are done before the one arrive that publishes them.
    gl.thread_barrier()
    mbarrier.arrive(bar, count=1)


@gluon.jit
def _key_addresses(src, n, layout: gl.constexpr, SPARSE: gl.constexpr):
    """(addresses, exists) of what `_key_rows` reads for the keys n .. n + 63 of source `src`, in `layout`:
    SPARSE the token's index row, else the sequence's block-table entries; keys past the valid length (the
    sequence's) are not read."""
    k_pos = n + gl.arange(0, BLOCK_N, layout=layout)
    if SPARSE:
        return src[0] + k_pos, k_pos < src[1]
    else:
        return src[0] + (k_pos.to(gl.uint32) // src[9].to(gl.uint32)).to(gl.int32), k_pos < src[1]


@gluon.jit
def _fetch(kv, n, SPARSE: gl.constexpr, EXTRA: gl.constexpr):
    """What `_key_rows` reads for the tile at planned key n, loaded into registers (KEY_ROWS): the first two
    tiles of a piece, whose gathers cannot wait for `_stage_keys`."""
    src, m = _source(kv, n, EXTRA)
    addr, ok = _key_addresses(src, m, KEY_ROWS, SPARSE)
    return gl.load(addr, mask=ok, other=0)


@gluon.jit
def _stage_keys(kv, n, dst, SPARSE: gl.constexpr, EXTRA: gl.constexpr):
    """cp.async what `_key_rows` reads for the tile at planned key n into `dst` (BLOCK_N int32 in shared memory;
    0 for keys past the valid length). Issued before a gather's copies, it lands with them: every consumer of
    those parts may read it once it has waited on any of their barriers. The gathers stage each tile's row a
    tile pair before they use it, so its load's latency hides behind that pair's work instead of stalling the
    warpgroup that issues the copies; the score masks read the same rows."""
    src, m = _source(kv, n, EXTRA)
    addr, ok = _key_addresses(src, m, gl.BlockedLayout([1], [32], [4], [0]), SPARSE)
    async_copy.async_copy_global_to_shared(dst, addr, mask=ok)


@gluon.jit
def _key_rows(src, n, raw, layout: gl.constexpr, SPARSE: gl.constexpr):
    """(page, slot, exists) of the keys n .. n + 63 of source `src` from `raw` (what `_key_addresses` points at,
    0 past the valid length), in `layout`: SPARSE flat positions page * page_size + slot (invalid: negative,
    past the cache or past the valid length), else block-table pages (keys past the sequence's length do not
    exist)."""
    k_pos = n + gl.arange(0, BLOCK_N, layout=layout)
    page_size = src[9]
    if SPARSE:
        ok = (k_pos < src[1]) & (raw >= 0) & (raw < src[2])
        token = gl.where(ok, raw, 0)
        if SPARSE == SHIFTED:         # page_size holds log2 of the page size
            return token >> page_size, token & ((1 << page_size) - 1), ok
        # Unsigned (token >= 0 here): no sign fix-ups in the division.
        page = (token.to(gl.uint32) // page_size.to(gl.uint32)).to(gl.int32)
        return page, token - page * page_size, ok
    else:
        return raw, (k_pos.to(gl.uint32) % page_size.to(gl.uint32)).to(gl.int32), k_pos < src[1]


@gluon.jit
def _gather_rows(base, stride_page, stride_slot, keys, dst, OFFSET: gl.constexpr, WIDTH: gl.constexpr,
                 ROW_ALIGN: gl.constexpr):
    """cp.async, up to 16 bytes a copy, the keys `keys` (`_key_rows`, in KEY_ROWS) into the first WIDTH columns of
    `dst` (BLOCK_N, >= WIDTH): each key's row starts at `base + page * stride_page + slot * stride_slot + OFFSET`
    (in base's elements; rows are ROW_ALIGN bytes aligned, `supported` checked) and is read as dst's dtype. Keys
    that do not exist are zero-filled: the cache may hold NaN there, and 0 * NaN would poison the output."""
    ES: gl.constexpr = base.dtype.element_ty.primitive_bitwidth // 8
    # Row starts as multiples of the alignment the compiler can see (a multiplication by a constant), so the
    # copies vectorise: strides are multiples of ROW_ALIGN bytes.
    A: gl.constexpr = ROW_ALIGN // ES
    rows = keys[0].to(gl.int64) * (stride_page // A) + keys[1] * (stride_slot // A)
    row = (base + (rows * A + OFFSET)).to(gl.pointer_type(dst.dtype))
    # The columns in whole pieces of 8 x 16 bytes, then the rest, each copied with the key rows' thread mapping (8
    # threads a row), so the row pointers need no layout conversion (a mapping of other rows to threads goes through
    # shared memory and a warpgroup barrier, three times a piece). The pieces go in one copy (a power of two of
    # them, for its arange): Triton puts a warpgroup barrier between two copies into one allocation (sparse prefill
    # +0.4-2%, NOTES.md twenty-seventh session). A rest under 8 x 4 bytes is copied whole by one thread of its row
    # (the layout repeats it over the row's 8 threads; Triton predicates the repeats off).
    VEC: gl.constexpr = 128 // dst.dtype.primitive_bitwidth
    FULL: gl.constexpr = WIDTH // (8 * VEC)
    gl.static_assert((FULL & (FULL - 1)) == 0, "whole 128-byte pieces of a gathered row: a power of two")
    if FULL > 0:
        _copy_columns(row, keys[2], dst, 0, VEC, FULL * 8 * VEC)
    REST: gl.constexpr = WIDTH - FULL * 8 * VEC
    if REST > 0:
        SPLIT: gl.constexpr = (REST % 8 == 0) and (REST // 8 * dst.dtype.primitive_bitwidth >= 32)
        _copy_columns(row, keys[2], dst, 8 * VEC * FULL, REST // 8 if SPLIT else REST, REST)


@gluon.jit
def _copy_columns(row, ok, dst, COL: gl.constexpr, V: gl.constexpr, W: gl.constexpr):
    """cp.async columns COL .. COL + W - 1 of the rows `row` (pointers in KEY_ROWS) where `ok` into dst, V
    elements a thread with the key rows' thread mapping."""
    layout: gl.constexpr = gl.BlockedLayout([1, V], [4, 8], [4, 1], [1, 0])
    rows_layout: gl.constexpr = gl.SliceLayout(1, layout)
    cols = gl.arange(0, W, layout=gl.SliceLayout(0, layout))
    async_copy.async_copy_global_to_shared(dst.slice(COL, W, dim=1),
                                           gl.convert_layout(row, rows_layout)[:, None] + (COL + cols)[None, :],
                                           mask=gl.convert_layout(ok, rows_layout)[:, None])


@gluon.jit
def _gather_part(src, keys, bufs, slot, PART: gl.constexpr, FP8: gl.constexpr):
    """Issue the cp.async copies of one part of a tile whose keys are `keys`, from source `src` = (index or
    block table row, valid length, index bound, latent base, second base, latent page / slot strides, second
    page / slot strides, page size; the second base is the RoPE part's, or model1's scale rows: `_gather_bases`).
    bf16/fp16: the values. FP8: a latent half's e4m3 bytes into the upper half of its
    own buffer (`_dequant` turns them into values) with its scales; the RoPE part's bf16 values as they are."""
    k_lat, k_rope, k_ready, k_raw, k_scale = bufs
    if PART == PART_ROPE:
        if FP8 == MODEL1:             # the RoPE values close the 576-byte value row
            _gather_rows(src[3], src[5], src[6], keys, k_rope.index(slot), MODEL1_NOPE, DT, 16)
        else:                         # V3.2: bytes 528..655 of the row (src[4] is the cache itself); bf16: k_rope
            _gather_rows(src[4], src[7], src[8], keys, k_rope.index(slot), 528 if FP8 == V32 else 0, DT, 16)
    elif FP8 != 0:
        # model1's half R: e4m3 columns 256-447 (448-511 are the RoPE values); its 3 scales and the padding byte.
        WIDTH: gl.constexpr = MODEL1_NOPE - HALF if (FP8 == MODEL1) and (PART == PART_R) else HALF
        _gather_rows(src[3], src[5], src[6], keys, k_raw.index(2 * (2 * slot + PART) + 1), PART * HALF, WIDTH, 16)
        if FP8 == MODEL1:             # four UE8M0 bytes from the page's scale rows (src[4], 8 bytes a token)
            _gather_rows(src[4], src[7], src[8], keys, k_scale.index(2 * slot + PART), 4 * PART, 4, 8)
        else:                         # two fp32 scales from bytes 512..527 of the row
            _gather_rows(src[3], src[5], src[6], keys, k_scale.index(2 * slot + PART), 512 + 8 * PART, 8, 16)
    else:
        _gather_rows(src[3], src[5], src[6], keys, k_lat.index(2 * slot + PART), PART * HALF, HALF, 16)


@gluon.jit
def _gather_parts(src, n, raw, bufs, slot, FIRST: gl.constexpr, SECOND: gl.constexpr, THIRD: gl.constexpr,
                  SPARSE: gl.constexpr, FP8: gl.constexpr):
    """Gather parts FIRST, SECOND, THIRD (-1: none) of the tile at key n of source `src` (`raw`: what
    `_key_rows` reads for it): its keys once, then each part's copies and the arrive on that part's barrier (an arrive
    waits for all the thread's earlier copies, so each part's follows its own)."""
    k_lat, k_rope, k_ready, k_raw, k_scale = bufs
    keys = _key_rows(src, n, raw, KEY_ROWS, SPARSE)
    _gather_part(src, keys, bufs, slot, FIRST, FP8)
    async_copy.mbarrier_arrive(k_ready[FIRST].index(slot), increment_count=False)
    if SECOND >= 0:
        _gather_part(src, keys, bufs, slot, SECOND, FP8)
        async_copy.mbarrier_arrive(k_ready[SECOND].index(slot), increment_count=False)
    if THIRD >= 0:
        _gather_part(src, keys, bufs, slot, THIRD, FP8)
        async_copy.mbarrier_arrive(k_ready[THIRD].index(slot), increment_count=False)


# model1's power-of-two scales let an e4m3 byte become bf16 by bits: the byte sign-extended into the top of a 16-bit
# lane (prmt), shifted left 4 and masked keeps its sign at bit 15 and its 7 exponent/mantissa bits at bits 10-4,
# which is bf16's encoding of the same value times 2^-120 (subnormals included: bf16 has them too). Two exact
# power-of-two multiplies (mul.rn.bf16x2; split so each factor is a normal bf16) then give value x 2^(byte - 127),
# the same bf16 as the fp32 route. 2.5 instructions a value against 3 (convert, scale, pack). V3.2's fp32 scales
# stay on the fp32 route: rounding them to bf16 first (FlashMLA's numerics) moved the LSE by up to 2.3e-3 against
# the fp32 oracle (NOTES.md, eighteenth session).
_E4M3_TO_BF16 = gl.constexpr(
    "{ .reg .b32 a, b;\n"
    "prmt.b32 a, $2, 0, 0x9180;\n"
    "prmt.b32 b, $2, 0, 0xB3A2;\n"
    "shl.b32 a, a, 4;\n"
    "shl.b32 b, b, 4;\n"
    "and.b32 a, a, 0x87F087F0;\n"
    "and.b32 b, b, 0x87F087F0;\n"
    "mul.rn.bf16x2 a, a, $3;\n"
    "mul.rn.bf16x2 b, b, $3;\n"
    "mul.rn.bf16x2 $0, a, $7;\n"
    "mul.rn.bf16x2 $1, b, $7; }")


@gluon.jit
def _dequant_chunk(x, scale, dst, FP8: gl.constexpr):
    """Store e4m3 bytes x (BLOCK_N, 64) times their per-key scale into dst (a 64-column slice of a value tile):
    V3.2 an fp32 scale, model1 the pair of bf16x2 multipliers `_chunk_scale` makes (`_E4M3_TO_BF16`)."""
    if FP8 == MODEL1:
        m1, m2 = scale
        value = gl.inline_asm_elementwise(_E4M3_TO_BF16, "=r,=r,r,r,r,r,r,r,r,r,r",
                                          [x, m1[:, None] + gl.zeros_like(x).to(gl.int32),
                                           m2[:, None] + gl.zeros_like(x).to(gl.int32)], gl.bfloat16, True, 4)
        dst.store(value)
    else:
        value = x.to(gl.float8e4nv, bitcast=True).to(gl.float32) * scale[:, None]
        dst.store(value.to(dst.dtype))


@gluon.jit
def _chunk_scale(scales, J: gl.constexpr, FP8: gl.constexpr, layout: gl.constexpr):
    """Per-key scale of 64-column chunk J of a latent half: V3.2 fp32 scale J // 2 (groups of 128); model1 UE8M0
    byte J (groups of 64) as `ue8m0_multipliers`."""
    col = gl.arange(0, scales.shape[1], layout=gl.SliceLayout(0, scales.type.layout))[None, :]
    if FP8 == V32:
        s = gl.sum(gl.where(col == J // 2, scales, 0.0), 1)
        return gl.convert_layout(s, gl.SliceLayout(1, layout))
    else:
        m1, m2 = ue8m0_multipliers(gl.sum(gl.where(col == J, scales.to(gl.int32), 0), 1))
        return gl.convert_layout(m1, gl.SliceLayout(1, layout)), gl.convert_layout(m2, gl.SliceLayout(1, layout))


@gluon.jit
def ue8m0_multipliers(byte):
    """UE8M0 scale bytes (int32, 2^(byte - 127)) as the two bf16x2 multipliers `_E4M3_TO_BF16` takes: 2^(k - k2)
    and 2^k2 with k = byte - 7 (the bit route's values are 2^-120 too small) and k2 = max(k - 127, 0), each a
    normal bf16, in both halves of a word."""
    k = byte - 7
    k2 = gl.maximum(k - 127, 0)
    return ((k - k2 + 127) << 7) * 65537, ((k2 + 127) << 7) * 65537


@gluon.jit
def _dequant(bufs, slot, PART: gl.constexpr, FP8: gl.constexpr):
    """FP8: turn latent half PART of the tile in ring slot `slot`, landed as e4m3 bytes in the upper half of its
    own buffer with its scales beside it, into values in that buffer (NVMMA layout), for the tensor cores; for
    model1's half R the last 64 columns are the RoPE values, landed bf16 in the tile's RoPE slot. Every thread
    reads what it needs before any writes (a barrier between), then stores and fences for the async proxy."""
    k_lat, k_rope, k_ready, k_raw, k_scale = bufs
    layout: gl.constexpr = gl.BlockedLayout([1, 16], [8, 4], [4, 1], [1, 0])           # (64, 64) bytes
    raw = k_raw.index(2 * (2 * slot + PART) + 1)
    dst = k_lat.index(2 * slot + PART)
    # Scales in a layout whose rows sit in the same threads as the bytes' (the per-row scale needs no shuffle).
    if FP8 == V32:
        scales = k_scale.index(2 * slot + PART)._reinterpret(gl.float32, [BLOCK_N, 2], SCALE_SMEM).load(
            gl.BlockedLayout([1, 2], [8, 4], [4, 1], [1, 0]))
    else:
        scales = k_scale.index(2 * slot + PART).load(gl.BlockedLayout([1, 8], [8, 4], [4, 1], [1, 0]))
    # Value chunks 0 and 1 fill the lower half of the buffer, clear of the bytes: written before the barrier, so
    # only half the bytes are held at a time. Chunks 2 and 3 overwrite the bytes: every thread reads first.
    _dequant_chunk(raw.slice(0, 64, dim=1).load(layout), _chunk_scale(scales, 0, FP8, layout),
                   dst.slice(0, 64, dim=1), FP8)
    _dequant_chunk(raw.slice(64, 64, dim=1).load(layout), _chunk_scale(scales, 1, FP8, layout),
                   dst.slice(64, 64, dim=1), FP8)
    x2 = raw.slice(128, 64, dim=1).load(layout)
    if (FP8 == MODEL1) and (PART == PART_R):
        x3 = k_rope.index(slot).load(layout)                        # bf16 RoPE values, (64, 64)
    else:
        x3 = raw.slice(192, 64, dim=1).load(layout)
    gl.thread_barrier()
    _dequant_chunk(x2, _chunk_scale(scales, 2, FP8, layout), dst.slice(128, 64, dim=1), FP8)
    if (FP8 == MODEL1) and (PART == PART_R):
        dst.slice(192, 64, dim=1).store(x3.to(dst.dtype))
    else:
        _dequant_chunk(x3, _chunk_scale(scales, 3, FP8, layout), dst.slice(192, 64, dim=1), FP8)
    fence_async_shared()
    gl.thread_barrier()


@gluon.jit
def _load_parts(kv, bufs, n, t, raw, FIRST: gl.constexpr, SECOND: gl.constexpr, THIRD: gl.constexpr,
                SPARSE: gl.constexpr, FP8: gl.constexpr, ROPE_PART: gl.constexpr, EXTRA: gl.constexpr):
    """Load parts FIRST, SECOND, THIRD (PART_L, PART_R or PART_ROPE; -1: none) of key tile t (planned keys
    n .. n + 63) into the tile's ring slot: TMA copies (a bf16/fp16 paged cache), or a gather by the calling
    warpgroup's 128 threads (SPARSE or FP8; `raw`: what `_key_rows` reads for the tile), each arriving on a
    part's barrier when its copies land. `kv` = (latent descriptor, rope descriptor, block table row, page size,
    main source, extra source, main_span) (`_gather_part` has the sources); ROPE_PART: the tile has a RoPE part to load
    (none for bf16 head_dim 512: the RoPE slot then only carries P)."""
    k_lat_desc, k_rope_desc, table, page_size, main, extra, main_span = kv
    slot = t % STAGES
    # A RoPE part in the list is dropped when there is none (it is never FIRST).
    S2: gl.constexpr = SECOND if ROPE_PART or SECOND != PART_ROPE else -1
    S3: gl.constexpr = THIRD if ROPE_PART or THIRD != PART_ROPE else -1
    if SPARSE or (FP8 != 0):
        src, m = _source(kv, n, EXTRA)
        _gather_parts(src, m, raw, bufs, slot, FIRST, S2, S3, SPARSE, FP8)
    else:
        page = gl.load(table + n // page_size)
        _tma_part(k_lat_desc, k_rope_desc, bufs, page, n % page_size, slot, FIRST)
        if S2 >= 0:
            _tma_part(k_lat_desc, k_rope_desc, bufs, page, n % page_size, slot, S2)
        if S3 >= 0:
            _tma_part(k_lat_desc, k_rope_desc, bufs, page, n % page_size, slot, S3)


@gluon.jit
def _next_half_l(kv, bufs, kidx, n0, c, jp, SPARSE: gl.constexpr, FP8: gl.constexpr, GATHER: gl.constexpr,
                 ROPE_PART: gl.constexpr, EXTRA: gl.constexpr):
    """Warpgroup 0's load of half L of the next pair's first tile (planned key n0 + 2 tiles, ring position c + 2)
    into the slot half its P0·V0_L has freed (gathers: from the tile's index row, staged in `kidx` slot jp)."""
    _load_parts(kv, bufs, n0 + 2 * BLOCK_N, c + 2, kidx.index(jp).load(KEY_ROWS) if GATHER else 0, PART_L, -1, -1,
                SPARSE, FP8, ROPE_PART, EXTRA)


@gluon.jit
def _first_loads(kv, bufs, kidx, blk, c, j, raw, SPARSE: gl.constexpr, FP8: gl.constexpr, GATHER: gl.constexpr,
                 ROPE_PART: gl.constexpr, EXTRA: gl.constexpr):
    """Tile j (0 or 1) of a piece's first pair (its first key block `blk`, ring position c): gathers stage the
    index rows of this tile (for its score mask) and of the tile two ahead (for that tile's loads) in `kidx`,
    then every part of the tile is loaded (`raw`: what `_key_rows` reads for it)."""
    n = (blk + j) * BLOCK_N
    if GATHER:
        _stage_keys(kv, n + 2 * BLOCK_N, kidx.index(2 * j), SPARSE, EXTRA)
        _stage_keys(kv, n, kidx.index(2 * j + 1), SPARSE, EXTRA)
    _load_parts(kv, bufs, n, c + j, raw, PART_L, PART_R, PART_ROPE, SPARSE, FP8, ROPE_PART, EXTRA)


@gluon.jit
def _tma_part(k_lat_desc, k_rope_desc, bufs, page, row, slot, PART: gl.constexpr):
    """One TMA copy: part PART of the tile at row `row` of page `page`, on the part's barrier."""
    k_lat, k_rope, k_ready, k_raw, k_scale = bufs
    bar = k_ready[PART].index(slot)
    if PART == PART_ROPE:
        mbarrier.expect(bar, k_rope_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(k_rope_desc, [page, row, 0], bar,
                                        k_rope.index(slot).reshape(k_rope_desc.block_type.shape))
    else:
        mbarrier.expect(bar, k_lat_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(k_lat_desc, [page, row, PART * HALF], bar,
                                        k_lat.index(2 * slot + PART).reshape(k_lat_desc.block_type.shape))


@gluon.jit
def _produce(kv, bufs, k_free, kidx, src, keys, n, t, PART: gl.constexpr, STAGE: gl.constexpr, SPARSE: gl.constexpr,
             FP8: gl.constexpr, EXTRA: gl.constexpr):
    """Gather part PART of tile t (planned keys n .. of source `src`, `keys` from `_key_rows`) once the consumers
    have released its ring slot's last use, each thread arriving on the part's barrier when its copies land;
    STAGE (sparse): first stage the tile's index row in kidx for the score masks (it lands with this part)."""
    k_lat, k_rope, k_ready, k_raw, k_scale = bufs
    slot = t % STAGES
    mbarrier.wait(k_free[PART].index(slot), ((t // STAGES) & 1) ^ 1)
    if STAGE and SPARSE:
        _stage_keys(kv, n, kidx.index(t % KIDX), SPARSE, EXTRA)
    _gather_part(src, keys, bufs, slot, PART, FP8)
    async_copy.mbarrier_arrive(k_ready[PART].index(slot), increment_count=False)


@gluon.jit
def _producer(descs, q_lat, q_rope, bufs, k_free, q_ready, q_free, kidx, outs, caches, sizes, SPARSE: gl.constexpr,
              FP8: gl.constexpr, HAS_ROPE: gl.constexpr, ROPE_PART: gl.constexpr, EXTRA: gl.constexpr):
    """The loading warpgroup (`uses_loader`: FP8 caches): walks the program's pieces as the consumers do,
    loads each piece's Q, and gathers every part of every key tile into the ring as soon as the consumers
    release it (`_release`), in the order they release them. The index rows are read a tile pair ahead. A
    piece's Q follows its first pair's gathers: those wait only for the last piece's tiles, Q for its outputs.
    Its arguments are the consumers' (`descs`, `outs`, `caches`, `sizes` as `mla_decode_sm90_kernel` packs them)."""
    q_lat_desc, q_rope_desc, k_lat_desc, k_rope_desc = descs[0], descs[1], descs[2], descs[3]
    SCHED, SEQLENS = outs[2], outs[3]
    batch, rows_per_k = sizes[0], sizes[3]
    row_blocks = gl.cdiv(rows_per_k, ROWS)
    row0 = (gl.program_id(0) % row_blocks) * ROWS
    meta = SCHED + (gl.program_id(0) // row_blocks) * SCHED_FIELDS
    b = gl.load(meta)
    blk = gl.load(meta + 1)
    remaining = gl.load(meta + 2)
    c = 0
    w = 0
    while (remaining > 0) & (b < batch):
        seqlen, take = _piece(SEQLENS, b, blk, remaining)
        if take > 0:
            main, extra = _kv_sources(b, seqlen, caches, SPARSE, EXTRA)
            kv = (k_lat_desc, k_rope_desc, main[0], main[9], main, extra, caches[16])
            raw0 = _fetch(kv, blk * BLOCK_N, SPARSE, EXTRA)
            raw1 = _fetch(kv, (blk + 1) * BLOCK_N, SPARSE, EXTRA)
            for i in range(0, take, 2):
                n0 = (blk + i) * BLOCK_N
                # The next pair's index rows (masked past the valid length).
                next0 = _fetch(kv, n0 + 2 * BLOCK_N, SPARSE, EXTRA)
                next1 = _fetch(kv, n0 + 3 * BLOCK_N, SPARSE, EXTRA)
                # Each tile's source and keys once, for all its parts, issued in the order the consumers free
                # them. Warpgroup 0's tile: half L mid-pair, the rest at the pair's end; warpgroup 1's: half R
                # first, after its first P·V. Warpgroup 1 scores its tile from half R, so that half goes first as
                # soon as it is free, not behind the first tile's parts freed at the pair's end (ncu had warpgroup
                # 1 waiting for it at the top of each pair; V3.2 +0-2.5% in two A/Bs, NOTES.md twenty-seventh
                # session). model1's half R is dequantised with the RoPE part; P1 has a buffer of its own there, so
                # the RoPE part of warpgroup 1's tile is free once its scores are issued and goes before its half R.
                has1 = i + 1 < take
                n1 = n0 + BLOCK_N
                src0, m0 = _source(kv, n0, EXTRA)
                keys0 = _key_rows(src0, m0, raw0, KEY_ROWS, SPARSE)
                src1, m1 = _source(kv, n1, EXTRA)
                keys1 = _key_rows(src1, m1, raw1, KEY_ROWS, SPARSE)
                if FP8 == MODEL1:
                    if has1:
                        _produce(kv, bufs, k_free, kidx, src1, keys1, n1, c + 1, PART_ROPE, True, SPARSE, FP8, EXTRA)
                        _produce(kv, bufs, k_free, kidx, src1, keys1, n1, c + 1, PART_R, False, SPARSE, FP8, EXTRA)
                    _produce(kv, bufs, k_free, kidx, src0, keys0, n0, c, PART_L, True, SPARSE, FP8, EXTRA)
                    _produce(kv, bufs, k_free, kidx, src0, keys0, n0, c, PART_R, False, SPARSE, FP8, EXTRA)
                    _produce(kv, bufs, k_free, kidx, src0, keys0, n0, c, PART_ROPE, False, SPARSE, FP8, EXTRA)
                    if has1:
                        _produce(kv, bufs, k_free, kidx, src1, keys1, n1, c + 1, PART_L, False, SPARSE, FP8, EXTRA)
                else:
                    if has1:
                        _produce(kv, bufs, k_free, kidx, src1, keys1, n1, c + 1, PART_R, True, SPARSE, FP8, EXTRA)
                    _produce(kv, bufs, k_free, kidx, src0, keys0, n0, c, PART_L, True, SPARSE, FP8, EXTRA)
                    _produce(kv, bufs, k_free, kidx, src0, keys0, n0, c, PART_R, False, SPARSE, FP8, EXTRA)
                    if ROPE_PART:
                        _produce(kv, bufs, k_free, kidx, src0, keys0, n0, c, PART_ROPE, False, SPARSE, FP8, EXTRA)
                    if has1:
                        _produce(kv, bufs, k_free, kidx, src1, keys1, n1, c + 1, PART_L, False, SPARSE, FP8, EXTRA)
                        if ROPE_PART:
                            _produce(kv, bufs, k_free, kidx, src1, keys1, n1, c + 1, PART_ROPE, False, SPARSE, FP8,
                                     EXTRA)
                if i == 0:                # Q waits for the last piece's outputs to leave its buffer
                    _load_q(q_lat_desc, q_rope_desc, q_lat, q_rope, q_ready, q_free, b, row0, w, HAS_ROPE)
                raw0 = next0
                raw1 = next1
                c += gl.minimum(take - i, 2)
            w += 1
        remaining -= gl.maximum(take, 0)
        b += 1
        blk = 0


@gluon.jit
def _kv_sources(b, seqlen, caches, SPARSE: gl.constexpr, EXTRA: gl.constexpr):
    """The fields (`_gather_part`) of batch b's main and second sources (the second the main one without EXTRA).
    `caches` = the kernel's cache pointers, strides and sizes (`mla_decode_sm90_kernel`). `kv` (`_load_parts`)
    is made of them by the caller (a tuple returned by a function loses its None entries)."""
    (BLOCK_TABLE, KV_LAT, K_ROPE, VALID_LENS, X_LAT, X_ROPE, X_TABLE, X_VALID, page_size, stride_bt, seq_tokens,
     index_bound, stride_kp, stride_ks, stride_rp, stride_rs, main_span, main_topk, x_page_size, x_bound, stride_xt,
     stride_xp, stride_xs, stride_xrp, stride_xrs) = caches
    table = BLOCK_TABLE + b.to(gl.int64) * stride_bt
    # SPARSE: `table` is the token's index row, of which the first `valid` count. Gathered tiles arrive with
    # missing keys zero-filled; a paged tile's keys past the sequence are zeroed before use.
    valid = seqlen
    if SPARSE:
        # One valid length per sequence of the call (seq_tokens query tokens each); one past the index row
        # (main_topk wide; a tile may reach past it) counts as the row's end.
        valid = gl.minimum(gl.load(VALID_LENS + b // seq_tokens), main_topk)
    main = (table, valid, index_bound, KV_LAT, K_ROPE, stride_kp, stride_ks, stride_rp, stride_rs, page_size)
    extra = main
    if EXTRA:                     # the second source's keys follow the main source's main_span keys
        x_valid = gl.minimum(gl.load(X_VALID + b // seq_tokens), seqlen - main_span)   # its row's width
        extra = (X_TABLE + b.to(gl.int64) * stride_xt, x_valid, x_bound, X_LAT, X_ROPE, stride_xp, stride_xs,
                 stride_xrp, stride_xrs, x_page_size)
    return main, extra


@gluon.jit
def _load_q(q_lat_desc, q_rope_desc, q_lat, q_rope, q_ready, q_free, b, row0, w, HAS_ROPE: gl.constexpr):
    """TMA piece w's Q rows (batch b, packed rows row0 ..) once both consumers are done with the last piece
    (its Q buffer also staged their outputs)."""
    mbarrier.wait(q_free, (w & 1) ^ 1)
    if HAS_ROPE:
        mbarrier.expect(q_ready, 2 * q_lat_desc.block_type.nbytes + q_rope_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(q_rope_desc, [b, row0, 0], q_ready,
                                        q_rope.reshape(q_rope_desc.block_type.shape))
    else:
        mbarrier.expect(q_ready, 2 * q_lat_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(q_lat_desc, [b, row0, 0], q_ready,
                                    q_lat.index(0).reshape(q_lat_desc.block_type.shape))
    tma.async_copy_global_to_shared(q_lat_desc, [b, row0, HALF], q_ready,
                                    q_lat.index(1).reshape(q_lat_desc.block_type.shape))


@gluon.jit
def _consumer(descs, q_lat, q_rope, bufs, k_free, q_ready, q_free, xchg, kidx, outs, caches, sizes,
              WG: gl.constexpr, CAUSAL: gl.constexpr, HAS_SINKS: gl.constexpr,
              SPARSE: gl.constexpr, FP8: gl.constexpr, GATHER: gl.constexpr, HAS_MAX: gl.constexpr,
              HAS_ROPE: gl.constexpr, ROPE_PART: gl.constexpr, EXTRA: gl.constexpr, PRODUCER: gl.constexpr):
    q_lat_desc, q_rope_desc, k_lat_desc, k_rope_desc, o_desc, o_part_desc = descs
    handoff, rows_smem, p_buf = xchg
    LSE, LSE_PART, SCHED, SEQLENS, SPLIT_OFFSETS, SINKS, MAX_LOGITS = outs
    (batch, seqlen_q, group, rows_per_k, qk_scale_log2, stride_lb, stride_lh, stride_ls, seq_tokens, stride_lps,
     stride_mb, stride_mh) = sizes
    s_layout: gl.constexpr = S_LAYOUT
    o_layout: gl.constexpr = O_LAYOUT
    p_layout: gl.constexpr = P_LAYOUT
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    dtype: gl.constexpr = q_lat.dtype
    # Warpgroup 0 skips its accumulator's rescales while no row's max moves (`_raise_max`, `_rescale`): on the
    # TMA forms only; in the gather forms the branch raised the spills and measured slower.
    LAZY: gl.constexpr = not GATHER
    # Gathers issued by the consumers: warpgroup 0 sends the next pair's half L(c + 2) out behind P1·V1_L, not before
    # it, so P1·V1_L, whose end frees half L of warpgroup 1's next tile (its last part to go out), starts a gather's
    # issue time sooner; L(c + 2) is not needed before the next pair (NOTES.md, hundred-and-seventeenth session).
    LATE_L: gl.constexpr = GATHER and not PRODUCER
    OWN_P: gl.constexpr = FP8 == MODEL1     # P1 in a buffer of its own (`p_buf`), else in its tile's RoPE slot
    k_lat, k_rope, k_ready, k_raw, k_scale = bufs
    f32_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([1, ROWS, HALF], gl.float32)
    # handoff barriers: 0 scale0, 1 scale1, 2 P0, 3 P1, 4 + WG row sums, 6 partial staged; rows_smem: m0, a0,
    # m1, a1, l0, l1
    sm_mine = rows_smem.index(2 * WG)
    sa_mine = rows_smem.index(2 * WG + 1)
    sm_other = rows_smem.index(2 - 2 * WG)
    sa_other = rows_smem.index(3 - 2 * WG)

    # Programs go part-major: the query blocks of one part (which read the same keys) run side by side.
    row_blocks = gl.cdiv(rows_per_k, ROWS)
    row0 = (gl.program_id(0) % row_blocks) * ROWS
    offs_m = row0 + gl.arange(0, ROWS, layout=row_s)
    q_pos = offs_m // group
    q_head = offs_m % group

    meta = SCHED + (gl.program_id(0) // row_blocks) * SCHED_FIELDS
    b = gl.load(meta)
    blk = gl.load(meta + 1)
    remaining = gl.load(meta + 2)
    split = gl.load(meta + 3)
    c = 0                         # key tiles so far (ring slot and barrier phase)
    pairs = 0                     # tile pairs so far: the hand-off barriers' phase
    w = 0                         # sequence pieces so far
    staged = 0                    # partial pieces so far (handoff 6's phase)
    if HAS_SINKS:                 # the program's rows throughout: loaded once, not at each piece's end
        sink = gl.load(SINKS + q_head)
    while (remaining > 0) & (b < batch):
        seqlen, take = _piece(SEQLENS, b, blk, remaining)
        if take > 0:
            main, extra = _kv_sources(b, seqlen, caches, SPARSE, EXTRA)
            kv = (k_lat_desc, k_rope_desc, main[0], main[9], main, extra, caches[16])
            if (WG == 0) and not PRODUCER:
                _load_q(q_lat_desc, q_rope_desc, q_lat, q_rope, q_ready, q_free, b, row0, w, HAS_ROPE)
            if HAS_MAX and not PRODUCER:
                # The sparse prefill (the only caller with HAS_MAX) runs one piece a program: warpgroup 0 loads
                # both first tiles, their index rows read first so the two loads are in flight together, unrolled
                # (looped it lost 1-3%).
                if WG == 0:
                    raw0 = _fetch(kv, blk * BLOCK_N, SPARSE, EXTRA)
                    raw1 = _fetch(kv, (blk + 1) * BLOCK_N, SPARSE, EXTRA)
                    for j in gl.static_range(2):
                        if j < take:
                            _first_loads(kv, bufs, kidx, blk, c, j, raw0 if j == 0 else raw1, SPARSE, FP8, GATHER,
                                         ROPE_PART, EXTRA)
            elif (not PRODUCER) and (WG < take):
                # Decode: each warpgroup loads the first tile it scores (warpgroup 0 issuing both kept the other
                # waiting at every piece start: V4 h_q = 64 b = 128 +6.8%, NOTES.md twenty-ninth session).
                raw = _fetch(kv, (blk + WG) * BLOCK_N, SPARSE, EXTRA) if GATHER else 0
                _first_loads(kv, bufs, kidx, blk, c, WG, raw, SPARSE, FP8, GATHER, ROPE_PART, EXTRA)
            # Causal (bottom-right): query i sees keys j <= seqlen - seqlen_q + i.
            full = seqlen
            last_visible = gl.zeros([ROWS], gl.int32, row_s) + (seqlen - 1)
            if CAUSAL:
                full = seqlen - seqlen_q + 1
                last_visible = seqlen - seqlen_q + q_pos
            acc = gl.zeros([ROWS, HALF], gl.float32, o_layout)
            l_i = gl.zeros([ROWS], gl.float32, row_s)
            m_i = gl.full([ROWS], float("-inf"), gl.float32, row_s)
            mbarrier.wait(q_ready, w & 1)
            for i in range(0, take, 2):
                n0 = (blk + i) * BLOCK_N
                n1 = n0 + BLOCK_N
                has1 = i + 1 < take
                ph = pairs & 1
                jp = (i // 2) & 1         # `kidx` slots: this pair's in jp, the last pair's in 1 - jp
                # Each warpgroup's scores of its tile (FP8: dequantised first), written once: issued at the top
                # of the pair, they follow the previous pair's last loads as they would at its end.
                if WG == 0:
                    s_tok = _scores(q_lat, q_rope, bufs, c, PART_L, s_layout, GATHER, FP8, HAS_ROPE)
                    key_ok = _tile_keys_ok(kv, n0, kidx.index(c % KIDX if PRODUCER else 1 - jp), s_layout,
                                           EXTRA) if SPARSE else 0
                    s = _mask(warpgroup_mma_wait(0, deps=(s_tok,)), n0, full, seqlen, last_visible, qk_scale_log2,
                              key_ok, s_layout, SPARSE)
                    m_new = _raise_max(m_i, s, LAZY)
                    alpha = gl.exp2(m_i - _shift(m_new))
                    p = gl.exp2(s - _shift(m_new)[:, None])
                    _put_rows(sm_mine, m_new)
                    _put_rows(sa_mine, alpha)
                    _signal(handoff[0])
                    l_i = l_i * alpha + gl.sum(p, 1)
                    acc = _rescale(acc, alpha, m_new != m_i, row_o, LAZY)
                    v0 = k_lat.index(2 * (c % STAGES))
                    _zero_tail(v0, n0, seqlen, not GATHER)
                    o_tok = warpgroup_mma(gl.convert_layout(p.to(dtype), p_layout), v0, acc, is_async=True)
                    # WG1's max: rescale P0 to it and hand P0 over in this tile's RoPE slot.
                    mbarrier.wait(handoff[1], ph)
                    alpha1 = sa_other.load(row_s)
                    m_i = sm_other.load(row_s)
                    moved1 = m_i != m_new
                    k_rope.index(c % STAGES).store((p * alpha1[:, None]).to(dtype))
                    fence_async_shared()
                    _signal(handoff[2])
                    acc = warpgroup_mma_wait(0, deps=(o_tok,))
                    if PRODUCER:              # this slot's half L is free
                        _release(k_free, c % STAGES, PART_L, -1)
                    elif (i + 2 < take) and not LATE_L:   # this slot's half L is free: the next pair's first tile
                        _next_half_l(kv, bufs, kidx, n0, c, jp, SPARSE, FP8, GATHER, ROPE_PART, EXTRA)
                    acc = _rescale(acc, alpha1, moved1, row_o, LAZY)
                    l_i = l_i * alpha1
                    mbarrier.wait(handoff[3], ph)
                    if has1:
                        slot1 = (c + 1) % STAGES
                        v1 = k_lat.index(2 * slot1)
                        if GATHER:                # scored by warpgroup 1: wait for its gather here too
                            _landed(k_ready, c + 1, PART_L, GATHER)
                        _zero_tail(v1, n1, seqlen, not GATHER)
                        o_tok = warpgroup_mma(p_buf if OWN_P else k_rope.index(slot1), v1, acc, is_async=True)
                        if LATE_L and (i + 2 < take):
                            _next_half_l(kv, bufs, kidx, n0, c, jp, SPARSE, FP8, GATHER, ROPE_PART, EXTRA)
                        if PRODUCER:
                            acc = warpgroup_mma_wait(0, deps=(o_tok,))
                            _release(k_free, slot1, PART_L, -1 if OWN_P else PART_ROPE)
                        elif i + 3 < take:
                            # The next gather's index row read while P1·V1_L runs, not after it: its latency was
                            # waited for at the address math (NOTES.md, hundred-and-eighteenth session). The wait
                            # is in each branch so that the read is not sunk below it.
                            raw = kidx.index(2 + jp).load(KEY_ROWS) if GATHER else 0
                            acc = warpgroup_mma_wait(0, deps=(o_tok,))
                            if GATHER:            # the tile of this site in the next pair
                                _stage_keys(kv, n1 + 4 * BLOCK_N, kidx.index(3 - jp), SPARSE, EXTRA)
                            _load_parts(kv, bufs, n1 + 2 * BLOCK_N, c + 3, raw, PART_L, -1 if OWN_P else PART_ROPE,
                                        -1, SPARSE, FP8, ROPE_PART, EXTRA)
                        else:
                            acc = warpgroup_mma_wait(0, deps=(o_tok,))
                else:
                    if has1:
                        s_tok = _scores(q_lat, q_rope, bufs, c + 1, PART_R, s_layout, GATHER, FP8, HAS_ROPE)
                        if OWN_P:                 # its half R is dequantised: the RoPE part is free
                            if PRODUCER:
                                _release(k_free, (c + 1) % STAGES, PART_ROPE, -1)
                            elif i + 3 < take:    # the next pair's second tile (its index row landed with L(c+1))
                                _load_parts(kv, bufs, n1 + 2 * BLOCK_N, c + 3, kidx.index(2 + jp).load(KEY_ROWS),
                                            PART_ROPE, -1, -1, SPARSE, FP8, ROPE_PART, EXTRA)
                        key_ok = _tile_keys_ok(kv, n1, kidx.index((c + 1) % KIDX if PRODUCER else 3 - jp), s_layout,
                                               EXTRA) if SPARSE else 0
                        s = _mask(warpgroup_mma_wait(0, deps=(s_tok,)), n1, full, seqlen, last_visible,
                                  qk_scale_log2, key_ok, s_layout, SPARSE)
                    else:
                        s = gl.full([ROWS, BLOCK_N], float("-inf"), gl.float32, s_layout)
                    mbarrier.wait(handoff[0], ph)
                    m0 = sm_other.load(row_s)
                    alpha0 = sa_other.load(row_s)
                    m_new = _raise_max(m0, s, LAZY)
                    alpha1 = gl.exp2(m0 - _shift(m_new))
                    _put_rows(sm_mine, m_new)
                    _put_rows(sa_mine, alpha1)
                    _signal(handoff[1])
                    # P1 goes to warpgroup 0 before this warpgroup rescales its accumulator, which would delay
                    # warpgroup 0's P1·V1_L by 128 multiplies a thread.
                    p = gl.exp2(s - _shift(m_new)[:, None])           # zeros without a second tile
                    slot1 = (c + 1) % STAGES
                    if has1:
                        (p_buf if OWN_P else k_rope.index(slot1)).store(p.to(dtype))
                        fence_async_shared()
                    _signal(handoff[3])
                    scale = alpha0 * alpha1
                    l_i = l_i * scale + gl.sum(p, 1)
                    # Not skipped when no max moved (LAZY): that doubled the spills here.
                    o_tok = warpgroup_mma_init(acc * gl.convert_layout(scale, row_o)[:, None])
                    m_i = m_new
                    if has1:
                        v1 = k_lat.index(2 * slot1 + 1)
                        _zero_tail(v1, n1, seqlen, not GATHER)
                        o_tok = warpgroup_mma(gl.convert_layout(p.to(dtype), p_layout), v1, o_tok, is_async=True)
                    mbarrier.wait(handoff[2], ph)
                    v0 = k_lat.index(2 * (c % STAGES) + 1)
                    if GATHER:                    # scored by warpgroup 0: wait for its gather here too
                        _landed(k_ready, c, PART_R, GATHER)
                    _zero_tail(v0, n0, seqlen, not GATHER)
                    o_tok = warpgroup_mma(k_rope.index(c % STAGES), v0, o_tok, is_async=True)
                    if PRODUCER:
                        if has1:
                            warpgroup_mma_wait(1, deps=(o_tok,))    # P1·V1_R is done, P0·V0_R may not be
                            _release(k_free, slot1, PART_R, -1)
                    elif i + 3 < take:
                        raw = kidx.index(2 + jp).load(KEY_ROWS) if GATHER else 0        # before the wait, as above
                        warpgroup_mma_wait(1, deps=(o_tok,))        # P1·V1_R is done, P0·V0_R may not be
                        _load_parts(kv, bufs, n1 + 2 * BLOCK_N, c + 3, raw, PART_R, -1, -1, SPARSE, FP8, ROPE_PART,
                                    EXTRA)
                    if PRODUCER:
                        acc = warpgroup_mma_wait(0, deps=(o_tok,))
                        _release(k_free, c % STAGES, PART_R, PART_ROPE)
                    elif i + 2 < take:
                        raw = kidx.index(jp).load(KEY_ROWS) if GATHER else 0            # before the wait, as above
                        acc = warpgroup_mma_wait(0, deps=(o_tok,))
                        if GATHER:                # the tile of this site in the next pair
                            _stage_keys(kv, n0 + 4 * BLOCK_N, kidx.index(1 - jp), SPARSE, EXTRA)
                        _load_parts(kv, bufs, n0 + 2 * BLOCK_N, c + 2, raw, PART_R, PART_ROPE, -1, SPARSE, FP8,
                                    ROPE_PART, EXTRA)
                    else:
                        acc = warpgroup_mma_wait(0, deps=(o_tok,))
                c += gl.minimum(take - i, 2)
                pairs += 1

            # Row sums: each warpgroup has the part over the tiles whose scores it computed.
            _put_rows(rows_smem.index(4 + WG), l_i)
            _signal(handoff[4 + WG])
            mbarrier.wait(handoff[5 - WG], w & 1)
            l_i = l_i + rows_smem.index(5 - WG).load(row_s)
            empty = l_i == 0.0
            inv = gl.convert_layout(gl.where(empty, 0.0, 1.0 / gl.where(empty, 1.0, l_i)), row_o)
            lse2 = m_i + gl.log2(gl.where(empty, 1.0, l_i))        # log2 units
            out = acc * inv[:, None]
            # The outputs leave through the Q buffer (free now: both warpgroups are past their last Q·Kᵀ) and
            # a TMA store.
            if (blk == 0) & (take == gl.cdiv(seqlen, BLOCK_N)):
                # The whole sequence: final output. FlashMLA's convention for a row with no key: LSE +inf.
                lse = gl.where(empty, float("inf"), lse2 * LN2)
                if HAS_SINKS:
                    keep = gl.where(empty, 1.0, 1.0 / (1.0 + gl.exp2((sink - gl.where(empty, 0.0, lse)) * LOG2E)))
                    out = out * gl.convert_layout(keep, row_o)[:, None]
                q_lat.index(WG).store(out.to(dtype))
                fence_async_shared()
                gl.thread_barrier()
                tma.async_copy_shared_to_global(o_desc, [b, row0, WG * HALF],
                                                q_lat.index(WG).reshape(o_desc.block_type.shape))
                if WG == 0:
                    # seq_tokens > 1: b is a query token of a flattened (batch, s_q) call (its s_q = 1)
                    gl.store(LSE + (b // seq_tokens).to(gl.int64) * stride_lb + q_head * stride_lh
                             + (b % seq_tokens + q_pos) * stride_ls, lse, mask=offs_m < rows_per_k)
                    if HAS_MAX:               # the largest scaled score (-inf with no key); s_q = 1 here
                        gl.store(MAX_LOGITS + b.to(gl.int64) * stride_mb + q_head * stride_mh, m_i * LN2,
                                 mask=offs_m < rows_per_k)
                tma.store_wait(0)
            else:
                # A piece: an fp32 partial at this batch's split slot; an empty piece has LSE -inf (weight 0).
                # 64 KB per warpgroup: the two take turns with the 72 KB buffer.
                lse = gl.where(empty, float("-inf"), lse2 * LN2)
                slot = gl.load(SPLIT_OFFSETS + b) + split
                if WG == 1:
                    mbarrier.wait(handoff[6], staged & 1)
                f32_stage = q_lat._reinterpret(gl.float32, [1, ROWS, HALF], f32_layout)
                f32_stage.reshape([ROWS, HALF]).store(out)
                fence_async_shared()
                gl.thread_barrier()
                tma.async_copy_shared_to_global(o_part_desc, [slot, row0, WG * HALF], f32_stage)
                if WG == 0:
                    gl.store(LSE_PART + slot.to(gl.int64) * stride_lps + offs_m, lse, mask=offs_m < rows_per_k)
                tma.store_wait(0)
                if WG == 0:
                    _signal(handoff[6])
                staged += 1
            _signal(q_free)
            w += 1
        remaining -= gl.maximum(take, 0)
        b += 1
        blk = 0
        split = 0


_LAUNCH_DEPENDENTS = gl.constexpr("{ griddepcontrol.launch_dependents;\nmov.u32 $0, $1; }")


@gluon.jit
def _launch_dependents():
    """Let the launch that depends on this one programmatically (`combine.combine_kernel` with PDL) start now: its
    programs with nothing to merge leave at once, the others wait for this kernel to complete. A no-op for a launch
    without the attribute."""
    tid = gl.arange(0, 128, layout=THREADS)
    gl.inline_asm_elementwise(_LAUNCH_DEPENDENTS, "=r,r", [tid], gl.int32, False, 1)


@gluon.jit
def mla_decode_sm90_kernel(q_lat_desc, q_rope_desc, k_lat_desc, k_rope_desc, o_desc, o_part_desc, LSE, LSE_PART,
                           SCHED, SEQLENS, SPLIT_OFFSETS, SINKS, BLOCK_TABLE, KV_LAT, K_ROPE, VALID_LENS, MAX_LOGITS,
                           X_LAT, X_ROPE, X_TABLE, X_VALID,
                           batch, seqlen_q, group, rows_per_k, page_size, stride_bt, qk_scale_log2,
                           stride_lb, stride_lh, stride_ls, seq_tokens, stride_lps,
                           index_bound, stride_kp, stride_ks, stride_rp, stride_rs, stride_mb, stride_mh,
                           main_span, main_topk, x_page_size, x_bound, stride_xt, stride_xp, stride_xs, stride_xrp,
                           stride_xrs, CAUSAL: gl.constexpr, HAS_SINKS: gl.constexpr, SPARSE: gl.constexpr,
                           FP8: gl.constexpr, HAS_MAX: gl.constexpr, HAS_ROPE: gl.constexpr, EXTRA: gl.constexpr,
                           LOADER: gl.constexpr, CONSUMER_REGS: gl.constexpr,
                           PRODUCER_CONSUMER_REGS: gl.constexpr):
    """Grid: parts x query blocks of 64 packed rows, part-major; a single KV head. Two consumer warpgroups, plus the
    loading warpgroup with LOADER (`uses_loader`, the module docstring). A consumer as the default partition beside a
    third warpgroup would run at 168 registers (65536 / 384), and ptxas then serialises the
    wgmmas of a 64 x 256 fp32 accumulator kernel."""
    _launch_dependents()
    dtype: gl.constexpr = q_lat_desc.dtype
    GATHER: gl.constexpr = SPARSE or (FP8 != 0)
    ROPE_PART: gl.constexpr = HAS_ROPE or (FP8 == MODEL1)      # model1's RoPE values land in the RoPE slot
    half_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([ROWS, HALF], dtype)
    rope_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([ROWS, DT], dtype)
    q_lat = gl.allocate_shared_memory(dtype, [2, ROWS, HALF], half_layout)
    k_lat = gl.allocate_shared_memory(dtype, [2 * STAGES, BLOCK_N, HALF], half_layout)
    k_rope = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, DT], rope_layout)
    if HAS_ROPE:
        q_rope = gl.allocate_shared_memory(dtype, [ROWS, DT], rope_layout)
    else:                             # never read
        q_rope = k_rope.index(0)
    # P0 and P1 pass between the warpgroups in the RoPE slots of their tiles, except P1 with model1's cache: it has
    # a buffer of its own there (8 KB), so the RoPE part of warpgroup 1's tile, only read by the dequantisation of
    # its half R, is gathered again as soon as its scores are issued, by the loader (`_producer`: V4 h_q = 128
    # +5.4 / +5.8%) or by warpgroup 1 itself (V4 h_q = 64 +3.7 / +2.4%; the buffer with the RoPE part's load left
    # where it was lost 2-3%: NOTES.md, twenty-eighth and twenty-ninth sessions).
    if FP8 == MODEL1:
        p_buf = gl.allocate_shared_memory(dtype, [BLOCK_N, DT], rope_layout)
    else:
        p_buf = k_rope.index(0)       # never read
    # FP8: a latent half's e4m3 bytes land in the upper half of its own buffer (k_raw, index 2 * buffer + 1),
    # its two scales per key beside it (k_scale, one buffer per latent buffer). Rows are 256 bytes apart, so
    # without a swizzle the two rows that `_dequant`'s 16-byte reads take in one phase hit the same banks; the
    # 64-byte chunks XORed by row % 4 put them apart (V3.2: a third of the shared-load wavefronts were conflicts,
    # now none; V4 h_q = 128 +2.5%, V3.2 +0.6%: NOTES.md, twenty-fifth session). The gathers' writes stay whole
    # 128-byte rows.
    k_raw = k_lat._reinterpret(gl.uint8, [4 * STAGES, BLOCK_N, HALF], gl.SwizzledSharedLayout(64, 1, 4, [1, 0]))
    k_scale = gl.allocate_shared_memory(gl.uint8, [2 * STAGES if FP8 != 0 else 1, BLOCK_N, 8], SCALE_SMEM)
    rows_smem = gl.allocate_shared_memory(gl.float32, [6, ROWS], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    # Gathers: staged index rows (or block-table entries): without a producer two tiles a pair, two pairs
    # (`_stage_keys`); with one, tile t's in slot t % KIDX.
    KIDX_ROWS: gl.constexpr = KIDX if LOADER else 4
    kidx = gl.allocate_shared_memory(gl.int32, [KIDX_ROWS, BLOCK_N], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    q_bars = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    q_ready = q_bars.index(0)
    q_free = q_bars.index(1)
    mbarrier.init(q_ready, count=1)
    mbarrier.init(q_free, count=2)
    # Each part's ready barriers (one per ring slot) and each hand-off barrier in an allocation of its own: Triton
    # puts a warpgroup barrier between two waits on barriers of one allocation, and a tile pair has a dozen waits.
    # A TMA load arrives once (with its byte count); a gather once per thread of the loading warpgroup.
    k_ready = (bars(STAGES, 128 if GATHER else 1), bars(STAGES, 128 if GATHER else 1),
               bars(STAGES, 128 if GATHER else 1))
    k_free = k_ready                  # unused without a producer
    if LOADER:                        # a consumer released a part (`_release`)
        k_free = (bars(STAGES, 1), bars(STAGES, 1), bars(STAGES, 1))
    handoff = (bar(1), bar(1), bar(1), bar(1), bar(1), bar(1), bar(1))

    # What the partitions take, packed once (None entries included: descriptors and pointers a call does not use).
    descs = (q_lat_desc, q_rope_desc, k_lat_desc, k_rope_desc, o_desc, o_part_desc)
    bufs = (k_lat, k_rope, k_ready, k_raw, k_scale)
    xchg = (handoff, rows_smem, p_buf)      # what the consumers exchange
    outs = (LSE, LSE_PART, SCHED, SEQLENS, SPLIT_OFFSETS, SINKS, MAX_LOGITS)
    caches = (BLOCK_TABLE, KV_LAT, K_ROPE, VALID_LENS, X_LAT, X_ROPE, X_TABLE, X_VALID, page_size, stride_bt,
              seq_tokens, index_bound, stride_kp, stride_ks, stride_rp, stride_rs, main_span, main_topk, x_page_size,
              x_bound, stride_xt, stride_xp, stride_xs, stride_xrp, stride_xrs)
    sizes = (batch, seqlen_q, group, rows_per_k, qk_scale_log2, stride_lb, stride_lh, stride_ls, seq_tokens,
             stride_lps, stride_mb, stride_mh)
    if LOADER:                        # the loading warpgroup (`_producer`) as the default partition
        gl.warp_specialize([
            (_producer, (descs, q_lat, q_rope, bufs, k_free, q_ready, q_free, kidx, outs, caches, sizes, SPARSE, FP8,
                         HAS_ROPE, ROPE_PART, EXTRA)),
            (_consumer, (descs, q_lat, q_rope, bufs, k_free, q_ready, q_free, xchg, kidx, outs, caches, sizes,
                         0, CAUSAL, HAS_SINKS, SPARSE, FP8, GATHER, HAS_MAX, HAS_ROPE, ROPE_PART, EXTRA, True)),
            (_consumer, (descs, q_lat, q_rope, bufs, k_free, q_ready, q_free, xchg, kidx, outs, caches, sizes,
                         1, CAUSAL, HAS_SINKS, SPARSE, FP8, GATHER, HAS_MAX, HAS_ROPE, ROPE_PART, EXTRA, True)),
        ], [4, 4], [PRODUCER_CONSUMER_REGS, PRODUCER_CONSUMER_REGS])
    else:
        gl.warp_specialize([
            (_consumer, (descs, q_lat, q_rope, bufs, k_free, q_ready, q_free, xchg, kidx, outs, caches, sizes,
                         0, CAUSAL, HAS_SINKS, SPARSE, FP8, GATHER, HAS_MAX, HAS_ROPE, ROPE_PART, EXTRA, False)),
            (_consumer, (descs, q_lat, q_rope, bufs, k_free, q_ready, q_free, xchg, kidx, outs, caches, sizes,
                         1, CAUSAL, HAS_SINKS, SPARSE, FP8, GATHER, HAS_MAX, HAS_ROPE, ROPE_PART, EXTRA, False)),
        ], [4], [CONSUMER_REGS])


# ----------------------------------------------------------------------------------------------------------
# Launch. Callers pass validated tensors.

def _view3(t, rows_dims):
    """(shape, strides) of a 3-D TMA view (outer, rows, columns) of t, or None when TMA cannot read it:
    rows_dims = (1, 2) merges q's (s_q, h_q) into packed rows (needs stride(1) == h_q * stride(2)); (1,) takes
    a cache's (pages, page_size, 1, d) as (pages, page_size, d)."""
    el = t.element_size()
    if t.stride(-1) != 1 or t.data_ptr() % 16 or any((s * el) % 16 for s in t.stride()[:-1]):
        return None
    if rows_dims == (1, 2):
        b, s, h, d = t.shape
        if s > 1 and t.stride(1) != h * t.stride(2):
            return None
        return [b, s * h, d], [t.stride(0), t.stride(2), 1]
    pages, page, heads, d = t.shape
    if heads != 1:
        return None
    return [pages, page, d], [t.stride(0), t.stride(1), 1]


def supported(q_lat, q_rope, kv_lat, k_rope, out, sparse=False, fp8_layout=None, extra=None):
    """The TMA views (q latent, q rope, cache latent, cache rope, out) when this path can run the call:
    Hopper, fp16/bf16 (bf16 with an FP8 cache, whose RoPE values are bf16), one KV head, 512 (+ 64 RoPE)
    columns, TMA-readable q and out, and for a paged bf16/fp16 cache
    pages of a multiple of 64 keys with TMA-readable strides. Sparse and FP8 calls gather their keys (no cache
    views, any page size, rows 16-byte aligned, model1's 8; `extra` as `mla_decode_forward_sm90` takes it).
    Otherwise None."""
    if not on_hopper(q_lat) or (q_rope is None) != (k_rope is None):
        return None
    if q_lat.dtype not in (torch.float16, torch.bfloat16) or out.dtype != q_lat.dtype:
        return None
    if fp8_layout is None:
        if kv_lat.dtype != q_lat.dtype:
            return None
    elif kv_lat.dtype != torch.uint8 or q_lat.dtype != torch.bfloat16 or (q_rope is None) != (fp8_layout == "model1"):
        return None
    if q_lat.shape[-1] != 2 * HALF.value:
        return None
    if q_rope is not None and q_rope.shape[-1] != DT.value:
        return None
    gather = sparse or fp8_layout is not None
    if kv_lat.shape[2] != 1 or (extra is not None and extra[0].shape[2] != 1):
        return None                      # one KV head (the second source's too)
    if not gather and kv_lat.shape[1] % BLOCK_N.value:
        return None
    if gather and row_alignment(*(kv_lat, k_rope, *(extra[:2] if extra is not None else ())),
                                model1=fp8_layout == "model1") < 16:
        return None                      # the kernel's gathers assume 16-byte aligned rows
    rope = q_rope is not None
    cache = (True, True) if gather else (_view3(kv_lat, (1,)), _view3(k_rope, (1,)) if rope else True)
    views = (_view3(q_lat, (1, 2)), _view3(q_rope, (1, 2)) if rope else True, *cache, _view3(out, (1, 2)))
    return None if None in views else views


def row_alignment(*caches, model1=False):
    """The largest power of two up to 16 dividing every cache's base address and page / slot strides in
    bytes: how far the gathers may vectorise (None entries are skipped). model1: its value rows are 576 bytes
    apart, whatever the view's slot stride (584) says."""
    align = 16
    for t in caches:
        if t is not None:
            es = t.element_size()
            while any(x % align for x in (t.data_ptr(), t.stride(0) * es, MODEL1_ROW if model1 else t.stride(1) * es)):
                align //= 2
    return align


def _pow2(n):
    return n > 0 and n & (n - 1) == 0


def _one_key_pages(lat, rope):
    """A sparse call's cache (latent and RoPE views; rope may be None) whose pages follow each other in memory (page
    p + 1's first key where page p's last would be followed), viewed as pages of one key: a flat position
    `page * page_size + slot` then addresses the same key, and the gathers' page arithmetic (a division by the
    page size for every key) folds away, page_size 1 being a value the JIT specialises on. V3.2's sparse decode
    +3% (NOTES.md, twenty-sixth session). Other caches (model1's pages end in their scale rows) as they are."""
    def pages_follow(t):
        return t is None or t.stride(0) == t.shape[1] * t.stride(1)

    def one_key(t):
        if t is None:
            return t
        return t.as_strided((t.shape[0] * t.shape[1], 1, *t.shape[2:]), (t.stride(1), t.stride(1), *t.stride()[2:]))

    if lat.shape[1] == 1 or not (pages_follow(lat) and pages_follow(rope)):
        return lat, rope
    return one_key(lat), one_key(rope)


def _gather_bases(lat, rope, fp8_layout):
    """(latent base, second base, (latent page, latent slot, second page, second slot) strides in elements) of a
    cache as the gathers read it: the second base is the RoPE part (bf16/fp16; V3.2: the cache itself), or for
    model1 the page's scale rows (`_kv_fp8.model1_parts`), its value rows 576 bytes apart."""
    if fp8_layout == "model1":
        return lat, model1_parts(lat)[1], (lat.stride(0), MODEL1_ROW, lat.stride(0), MODEL1_TAIL)
    rope = lat if rope is None else rope
    return lat, rope, (lat.stride(0), lat.stride(1), rope.stride(0), rope.stride(1))


def mla_decode_forward_sm90(views, q_lat, q_rope, kv_lat, k_rope, block_table, cache_seqlens, metadata,
                            split_offsets, out, lse, o_part, lse_part, *, softmax_scale, causal, sinks,
                            valid_lens=None, max_logits=None, fp8_layout=None, extra=None):
    """Launch over `metadata`'s parts; writes whole sequences to out / lse and pieces to o_part / lse_part
    (the portable kernel's layout: (pieces, rows_per_k, 512) fp32), which the caller combines. Token-sparse
    (`valid_lens` given): `block_table` holds each "batch" (query token)'s cache indices, gathered by cp.async;
    `max_logits (b, h_q)`: also write each row's largest scaled score (the plan runs every token whole).
    `fp8_layout` "v32" / "model1": the cache is packed FP8 rows (kv_lat = k_rope = the uint8 tensor), gathered
    and dequantised. `extra` = (x_lat, x_rope, x_table, x_valid, main_span): a second sparse source, as
    `mla_decode.mla_decode_forward` takes it. `views` is `supported`'s result, or the `_Plan` this function returned
    for an earlier call of the same `plan_key`; returns the call's `_Plan`."""
    tensors = (q_lat, q_rope, kv_lat, k_rope, block_table, cache_seqlens, metadata, split_offsets, out, lse, o_part,
               lse_part, sinks, valid_lens, max_logits, extra)
    plan = views if isinstance(views, _Plan) else _plan(views, *tensors, softmax_scale=softmax_scale, causal=causal,
                                                        fp8_layout=fp8_layout)
    launch(plan.kernel, plan.grid, plan.bind(*tensors), plan.meta, plan.fixed)
    return plan


def plan_key(q_lat, q_rope, kv_lat, k_rope, block_table, cache_seqlens, metadata, split_offsets, out, lse, sinks,
             valid_lens, max_logits, extra, *, softmax_scale, causal, fp8_layout, whole):
    """All that `supported` (this module's and `sparse_decode_sm90`'s) and `_plan` read of a call of
    `mla_decode.mla_decode_forward`'s Gluon branch: the layouts (shapes, strides, dtypes) of q, the caches, out and
    their 16-byte alignment, the other tensors' shapes and strides or absence, the device and the options. The
    data's addresses are `_Plan.bind`'s."""
    def laid(t):            # read by the views and the gathers' row alignment
        return None if t is None else (t.shape, t.stride(), t.dtype, t.data_ptr() % 16)

    def shaped(t):          # read for sizes and strides only
        return None if t is None else (t.shape, t.stride())
    x = extra and (laid(extra[0]), laid(extra[1]), shaped(extra[2]), extra[3] is None, extra[4])
    return (laid(q_lat), laid(q_rope), laid(kv_lat), laid(k_rope), laid(out), shaped(block_table), shaped(lse),
            shaped(metadata), shaped(max_logits), x, cache_seqlens is None, split_offsets is None, sinks is None,
            valid_lens is None, q_lat.device, softmax_scale, causal, fp8_layout, whole)


class _Plan:
    """A launch of `mla_decode_sm90_kernel` (or of `mla_rows_sm90_kernel`, which takes the same arguments) without
    its tensors (`_plan`): the kernel, the grid, the meta-parameters, the scalar
    arguments after the tensors and their `launch` classes (`fixed`), the (view, box, layout) of each descriptor
    (q latent, q RoPE, cache latent, cache RoPE, out, partials; None where the call has none), and whether the
    cache is seen as pages of one key (`_one_key_pages`). `bind` makes a call's arguments from its tensors."""
    __slots__ = ("kernel", "grid", "meta", "scalars", "fixed", "boxes", "one_key", "fp8_layout")

    def __init__(self, kernel, grid, meta, scalars, boxes, one_key, fp8_layout):
        self.kernel, self.grid, self.meta, self.scalars, self.boxes = kernel, grid, meta, scalars, boxes
        self.one_key, self.fp8_layout = one_key, fp8_layout
        self.fixed = fixed_classes(scalars, meta)

    def bind(self, q_lat, q_rope, kv_lat, k_rope, block_table, cache_seqlens, metadata, split_offsets, out, lse,
             o_part, lse_part, sinks, valid_lens, max_logits, extra):
        """The kernel's arguments for these tensors (a call of the plan's key)."""
        descs = tuple(None if kept is None else descriptor_in(t, kept)
                      for t, kept in zip((q_lat, q_rope, kv_lat, k_rope, out, o_part), self.boxes))
        if self.one_key:
            kv_lat, k_rope = _one_key_pages(kv_lat, k_rope)
            if extra is not None:
                extra = (*_one_key_pages(extra[0], extra[1]), *extra[2:])
        lat_base, second_base, _ = _gather_bases(kv_lat, k_rope, self.fp8_layout)
        x_args = (None, None, None, None)
        if extra is not None:
            x_args = (*_gather_bases(extra[0], extra[1], self.fp8_layout)[:2], extra[2], extra[3])
        return (*descs, lse, lse_part, metadata, cache_seqlens, split_offsets, sinks, block_table, lat_base,
                second_base, valid_lens, max_logits, *x_args, *self.scalars)


def _plan(views, q_lat, q_rope, kv_lat, k_rope, block_table, cache_seqlens, metadata, split_offsets, out, lse,
          o_part, lse_part, sinks, valid_lens, max_logits, extra, *, softmax_scale, causal, fp8_layout):
    """`_Plan` of a `mla_decode_forward_sm90` call (its arguments; `views` from `supported`)."""
    batch, seqlen_q, heads_q, _ = q_lat.shape
    rows_per_k = seqlen_q * heads_q
    sparse = valid_lens is not None
    gather = sparse or fp8_layout is not None
    rope = q_rope is not None
    vq, vr, vk, vkr, vo = views
    one_key = sparse and fp8_layout != "model1"
    if one_key:
        kv_lat, k_rope = _one_key_pages(kv_lat, k_rope)
        if extra is not None:
            extra = (*_one_key_pages(extra[0], extra[1]), *extra[2:])
    half, dt = HALF.value, DT.value
    # Few packed rows of a dense call with a RoPE part: the transposed products of `mla_rows_sm90`, in NQ-row boxes.
    from . import mla_rows_sm90
    few = not gather and rope and rows_per_k <= ROWS_KERNEL_MAX
    rows = mla_rows_sm90.rows_tile(rows_per_k) if few else ROWS.value
    part_view = ([o_part.shape[0], rows_per_k, 2 * half], [o_part.stride(0), o_part.stride(1), 1])
    boxes = (box(q_lat, vq, [1, rows, half]), box(q_rope, vr, [1, rows, dt]) if rope else None,
             None if gather else box(kv_lat, vk, [1, BLOCK_N.value, half]),
             box(k_rope, vkr, [1, BLOCK_N.value, dt]) if rope and not gather else None,
             box(out, vo, [1, rows, half]), box(o_part, part_view, [1, rows, half]))
    page_size = kv_lat.shape[1]
    strides = _gather_bases(kv_lat, k_rope, fp8_layout)[2]
    if extra is not None:
        x_lat, x_rope, x_table, x_valid, main_span = extra
        x_strides = _gather_bases(x_lat, x_rope, fp8_layout)[2]
        x_sizes = (main_span, x_lat.shape[1], x_lat.shape[0] * x_lat.shape[1], x_table.stride(0), *x_strides)
    else:
        x_sizes = (1 << 30, 1, 0, 0, 0, 0, 0, 0)
    # Page sizes of powers of two (above 1, which the JIT specialises on) go in as shifts (SHIFTED).
    shifted = sparse and page_size > 1 and _pow2(page_size) and (extra is None or _pow2(x_sizes[1]))
    if shifted:
        x_sizes = (x_sizes[0], x_sizes[1].bit_length() - 1, *x_sizes[2:])
    scalars = (batch, seqlen_q, heads_q, rows_per_k, page_size.bit_length() - 1 if shifted else page_size,
               block_table.stride(0),
               softmax_scale * LOG2E.value, lse.stride(0), lse.stride(1), lse.stride(2), batch // lse.shape[0],
               lse_part.stride(0), kv_lat.shape[0] * page_size, *strides,
               *((max_logits.stride(0), max_logits.stride(1)) if max_logits is not None else (0, 0)),
               x_sizes[0], block_table.shape[-1], *x_sizes[1:])
    grid = (metadata.shape[0] * cdiv(rows_per_k, rows),)
    row_keys = extra[4] + extra[2].shape[-1] if extra is not None else block_table.shape[-1]
    loader = uses_loader(fp8_layout, sparse, row_keys, cdiv(rows_per_k, rows))
    if few:
        meta = dict(NQ=rows, CAUSAL=causal, HAS_SINKS=sinks is not None, num_warps=4)
        return _Plan(mla_rows_sm90.mla_rows_sm90_kernel, grid, meta, scalars, boxes, one_key, fp8_layout)
    meta = dict(CAUSAL=causal, HAS_SINKS=sinks is not None, SPARSE=SHIFTED.value if shifted else int(sparse),
                FP8={None: 0, "v32": V32.value, "model1": MODEL1.value}[fp8_layout], HAS_MAX=max_logits is not None,
                HAS_ROPE=rope, EXTRA=extra is not None, LOADER=loader, CONSUMER_REGS=CONSUMER_REGS,
                PRODUCER_CONSUMER_REGS=PRODUCER_CONSUMER_REGS[fp8_layout], num_warps=4)
    return _Plan(mla_decode_sm90_kernel, grid, meta, scalars, boxes, one_key, fp8_layout)


def uses_loader(fp8_layout, sparse, row_keys, row_blocks=1):
    """Whether a call takes the loading warpgroup (`_producer`): every V3.2 FP8 call; model1 sparse calls whose
    query tokens' planned rows (`row_keys` keys, the second source's included) have at least MODEL1_LOADER_TILES
    key tiles (its entry for a token's `row_blocks` query blocks of 64 rows, 1 or more). The bf16/fp16 forms
    never (the sparse prefill measured -3..+1% with it, NOTES.md thirty-fourth session; a test forces it on)."""
    if fp8_layout == "v32":
        return True
    least = MODEL1_LOADER_TILES[min(row_blocks, len(MODEL1_LOADER_TILES)) - 1]
    return (fp8_layout == "model1" and sparse and least is not None
            and cdiv(row_keys, BLOCK_N.value) >= least)


assert SCHED_BLOCK == BLOCK_N.value, "a key tile is one scheduling block"
