"""Hopper (sm_90) fast path of the dense prefill forward, written in Gluon.

The `triton.language` kernel in `forward.py` is the portable path (and the one the CPU tests run); this one
is what `attention_forward` dispatches to on an H100/H200 for calls padded or packed (varlen), or a chunk of queries
over a KV cache, contiguous or paged (chunked prefill), causal or not, with or without a sliding window (left,
right; left may be one bound a sequence), sinks, a softcap and ALiBi, `head_dim_qk == head_dim_v` in
{64, 128, 256} or DeepSeek's 192 / 128 (fp16 / bf16: also other head dims from 40, run padded to those,
`padded_dims`), q/k/v strides that TMA accepts (16-byte aligned); fp16 / bf16, or FP8 (e4m3) q, k and v in calls
without a cache (below). The schedule is FlashAttention-3's:

* persistent: one program per SM runs work items (128 or 192 query rows of one head) until none is left:
  causal items go out in L2-sized chunks of heads, longest first inside a chunk, a program taking the next
  untaken one when it starts one (an atomic counter; windowed and packed items too); unmasked items, all alike,
  round-robin (`_work_item`, `_next_item`); a windowed item's key tiles start at its first row's first visible key;
* a one-warp producer partition: Q (double-buffered, so the next item's Q lands during this one; d = 256 and 192
  have one buffer, which each consumer releases after its last Q·Kᵀ) and K and V tiles through `STAGES`-deep
  rings of shared-memory slots, each completing on its own mbarrier; K and V slots are released separately (K
  after Q·Kᵀ, V after P·V), so loads run a full tile ahead; it works out each item's fields once and posts them
  with the item's index beside its Q buffer (`_post_item`);
* two consumer warpgroups (three for long d = 64 calls, `_WIDE_TILES`, where the producer becomes the
  default partition), each owning 64 of the item's query rows and reading the same K/V slots. Within one
  warpgroup, tile j's softmax runs while the tensor cores do tile j-1's P·V (intra-warpgroup overlap):
  issue S_j = Q·K_jᵀ, issue O += P_{j-1}·V_{j-1}, wait for S_j, softmax, wait for O, release the slots.
  With PINGPONG the two warpgroups take turns issuing (mbarrier hand-off), so one's softmax overlaps the
  other's matrix products. Causal, two warpgroups, no ping-pong, 128-key tiles (d = 64): warpgroup 0's rows
  see only the first 64 keys of the diagonal tile, which it then runs at half width (`_half_tile`). Causal
  d = 128: the running max moves only past a margin, and a warp whose rows' maxima stayed skips its
  accumulator's rescale (`_rescale`, a per-warp branch in inline PTX).

Each tensor is seen by TMA as (batch, seqlen, columns), head h starting at column h * head_stride, so a tile
that runs past a sequence's end gets TMA's zero fill (keys there are masked to -inf; query rows there are
never stored). The output is written with masked pointer stores, one row per query, except in short padded d = 256
calls, where it goes through a staging buffer by TMA store (`tma_store`; the box clips rows past the end). Packed
sequences (VARLEN) are one batch of (1, total, columns): a sequence's tiles start at its cu_seqlens row, and a tile
that runs past its end reads the next sequence's rows, masked like those past a padded sequence's end; in an even
GQA group a sequence's last row block of at most 64 rows runs two query heads in one item (`_paired_tail`). A
head_dim_qk that is not a power of two (192) is held as QK_PARTS column parts of a power-of-two width (`_QK_PART`),
each its own TMA box and shared-memory slot, and Q·Kᵀ is one wgmma per part into the same scores (`_scores`). A
head dim run padded (96 as 128, ...) is seen as (batch, seqlen, heads, head_dim) instead, whose boxes get TMA's
zeros past the head's last column (`_at`, `_as_box`); the output's extra columns, zeros, are not stored
(`DV_STORE`).

A KV cache: each sequence's key count from cache_seqlens, its keys at the start of its row of a contiguous cache
(TMA batch = sequence), or paged: each key tile in boxes of at most a page, each box from the page its block-table
entry names (`_box_origin`). Rows past a sequence's length are read, masked to -inf in S, and zeroed in V's shared
memory before P·V (`_wait_v`), since they may hold NaN and 0 * NaN is NaN; so are the rows past the last packed
sequence, for a buffer longer than cu_seqlens_k[-1].

FP8, as FlashAttention-3: both products on e4m3 tensor cores, which read 8-bit operands only K-major, so P·V takes
V transposed, (kv head, head_dim_v, keys), from a copy made before the launch (`transposed_v`, a Triton kernel,
which also zeroes a packed buffer's rows past its last sequence, so FP8 calls never clean V tiles), or, in short
causal calls (`transpose_by_default`) or when asked for (`TRANSPOSE`, padded calls), transposed in the kernel by a
fourth warpgroup from a staging ring (`_transposer`);
P is rounded to e4m3 after scaling by 2^8 (`_p_shift`), the row sums kept in fp32 from the unrounded values; the
descales of each (batch, KV head), read by the kernel, scale the scores and the output. No conditional rescale (the
shift takes its headroom) and no TMA-store epilogue (the output is bf16 or fp16, not the inputs' dtype).
"""
from __future__ import annotations

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)

from ..schedule import num_sms
from .launch import Plans, _arg_class, cdiv, fixed_classes, launch, zeroed_counter
from .sm90 import box as sm90_box, descriptor, descriptor_in, offsets_64, on_hopper
from .transpose import TAIL, packed_start, transpose_keys

_ROWS = 64                        # query rows per consumer warpgroup; a CTA has two or three
ROWS = gl.constexpr(_ROWS)        # the same, for the kernels
LOG2E = 1.4426950408889634
L2_BUDGET = 24 << 20              # bytes of K/V that causal work items share at a time (H100 L2: 50 MB)
LN2 = gl.constexpr(0.6931471805599453)
LOG2E_ = gl.constexpr(LOG2E)
# Registers a thread for the three warpgroups of a CTA (65536 / 384, rounded down to a multiple of 8). Beside 2
# consumer warpgroups the producer warp's warpgroup (3 of its warps idle) gets what they leave: 40 beside 232, 24
# beside 240; beside 3 it is the default partition and gets what the consumers leave.
REGS_3WG = gl.constexpr(3 * 168)

# head_dim_qk -> (BLOCK_N, STAGES, Q_BUFS, consumer register budget, consumer warpgroups)
_TILES = {64: (128, 3, 2, 232, 2), 128: (128, 2, 2, 240, 2), 256: (64, 2, 1, 232, 2), 192: (128, 2, 1, 232, 2)}
# d = 128 at 240 registers against 232 (`history/tune_prefill_*regs240*_h100_d6140ea*.json`, four processes): unmasked
# 4k +4..+7%, 16k +1.5..+6%, 1k +1..+3%; causal level (+-4% both ways at 4k and 16k, ping-pong on or off). At 240
# d = 64 lost 2% at 1k and d = 256 8% at 4k. A paged KV-cache chunk lost 1.5-5% (16-key pages, chunks of 64-512,
# `history/probe_kvcache_regs240_h100_d6140ea.json`: the producer spills at 24): paged calls take PAGED_REGS.
PAGED_REGS = 232
# 192 (DeepSeek's 192 / 128): one Q buffer to fit 227 KB with 128-key tiles. Against (64, 2, 2) and (64, 3, 1) in one
# `tune_prefill.py --dims 192 --all-configs` run (826c0e5; its JSON did not come back, the printed lines did) it was
# ahead by 10% or more at 4k and 16k and within 3% either way at 1k; `results/prefill_d192_h100.json` has it against
# cuDNN.
# (head_dim_qk, head_dim_v) pairs this path runs, and the column part Q and K are loaded in where head_dim_qk is
# not a power of two (Gluon's tiles must be): 192 as three parts of 64. (192, 256) is for head dims 136-192 run
# padded (`padded_dims`): a quarter fewer Q·Kᵀ products than (256, 256), in `_PAIR_TILES`' tiles.
HEAD_DIMS = {(64, 64), (128, 128), (256, 256), (192, 128), (192, 256)}
FP8_HEAD_DIMS = HEAD_DIMS - {(192, 256)}
_QK_PART = {192: 64}
# Other head dims run padded to a pair of HEAD_DIMS (`padded_dims`) that widens each by at most PAD_MAX. Against
# the portable kernel in one `fmha bench prefill` run (H200, `history/prefill_padded_h200_wip56a.json`, 1k-16k, causal
# or not): 96 -> 128 1.28-1.67x (1.00-1.06x cuDNN), 80 -> 128 1.19-1.69x, 48 -> 64 1.51-1.65x, 160 -> 256 1.12-1.50x
# (0.83-0.89x cuDNN); 32 -> 64 (twice the products) 0.93-1.05x. The widest below 2 (H200,
# `history/prefill_pad72_152_h200_a0623e5.json`): 72 -> 128 1.84-2.17x (0.71-0.98x cuDNN), 136 / 144 / 152 -> 256
# 2.16-3.34x / 1.14-1.51x / 2.01-3.18x (0.72-0.87x cuDNN). So every multiple of 8 from 40 to 256 runs padded.
PAD_MAX = 1.9
# head_dim -> the same, for long calls: 192-row work items over three consumer warpgroups, FlashAttention-3's d = 64
# shape, from WIDE_MIN_ROWS query rows without a mask and WIDE_MIN_ROWS_CAUSAL with one. Against two warpgroups in
# one run (`history/tune_prefill_mask_d64_h100_9a27bd9.json`, `..._mask_long_d64_h100_9a27bd9_{a,b}.json`):
# unmasked +8..+11% at 8k-16k, +6% at 4k, -2% at 1k; causal +3..+5% at 8k-16k, level at 4k, -19% at 1k.
_WIDE_TILES = {64: (128, 3, 2, 160, 3)}
# (head_dim_qk, head_dim_v) -> tiles, where the pair's differ from head_dim_qk's: (192, 256) takes d = 256's (64-key
# tiles, one Q buffer: 197 KB of shared memory; sm_90 compile spills 56-64 bytes, as (256, 256)'s 44-96). Against
# padding to (256, 256), in two processes (H200, `history/prefill_pair192_256_h200_5a4b978.json` against
# `history/prefill_pad72_152_h200_a0623e5.json` and `prefill_padded_h200_wip56a.json`; 1k-16k, causal or not):
# d = 136 1.07-1.12x (0.81-0.93x cuDNN, from 0.72-0.87x), d = 160 1.04-1.09x (0.87-0.96x cuDNN, from 0.83-0.89x).
_PAIR_TILES = {(192, 256): (64, 2, 1, 232, 2)}
WIDE_MIN_ROWS = 2048
WIDE_MIN_ROWS_CAUSAL = 8192
# The output of padded d = 256 calls shorter than TMA_STORE_MAX_ROWS leaves by TMA store from a staging buffer
# (`_consumer`'s epilogue) instead of pointer stores: an item's epilogue took 2-3.9 us there, 7-13% of a 1k item
# (`history/probe_prefill_timeline_d256_h100_b01370f.json`). Against the pointer stores in one process: 1k +4.7..+6.2%
# (`history/tune_prefill_tmastore_d256_h100_cabd962*.json`), 2k / 3k +2..+4% (`..._tma_bound_h100_fa7a936.json`);
# from 4k rows level within noise (`..._tma_bound_rounds5_h100_b20ab8d.json`, medians of five), hence the bound.
TMA_STORE_DIMS = (256,)
TMA_STORE_MAX_ROWS = 4096
PINGPONG_MIN_ROWS_D128 = 4096     # causal d = 128 calls from this many query rows take turns (`launch_args`)
# FP8 V transposed in the kernel (`_transposer`) instead of copied first (`transposed_v`): the head dims it runs at
# (`transpose_in_kernel`), and the consumers' registers then (`attn_fwd_sm90_kernel`'s partitions; with the
# transposer as the default partition nothing spills at 232). Not d = 256: with a fourth warpgroup ptxas cannot fit
# its 64 x 256 accumulator in the 128 registers a thread it compiles the kernel for (C7602, sm_90 compile). Where it
# is the default: `transpose_by_default`.
TRANSPOSE_DIMS = (64, 128, 192)
TRANSPOSE_REGS = 232
# A window's bound of -1 (unbounded) as the kernel takes it, past every key; larger bounds are clipped to it, so that
# no row's first or last visible key overflows int32.
UNBOUNDED = 1 << 30
UNBOUNDED_ = gl.constexpr(UNBOUNDED)


@gluon.jit
def _work_item(t, n_m, n_bh, head_chunk, heads_q, group, seqlen_q, seqlen_k, CU_Q, CU_K, SEQLENS, left, LEFTS, right,
               BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr, WGS: gl.constexpr, VARLEN: gl.constexpr,
               WINDOW: gl.constexpr, HEADS: gl.constexpr):
    """Work item t → (batch, (first) head, kv head, first query row, first key tile, key tiles, the sequence's query
    and key lengths, its first query and key rows in the TMA views, its TMA batch coordinate, a row's first visible
    key less its index). VARLEN: sequence b's rows are [CU_Q[b], CU_Q[b + 1]) of one packed batch (seqlen_q /
    seqlen_k are the longest), and a block past its end has no key tiles. CAUSAL: keys up to each row's diagonal,
    WINDOW: from `left` before it (LEFTS[b] instead when LEFTS is not None, negative for none) to `right` past it;
    the item's key tiles start at its first row's first visible key. Items go out in order of t (see
    `_next_item`). Without a mask, all row blocks of one head are next to each other, sharing its K/V in L2.
    Causal: heads are taken `head_chunk` at a time (as many as keep their K/V in L2), and inside a chunk the row
    blocks with the most key tiles come first, all heads of the chunk together, so that short items fill the end.
    HEADS = 2 (GQA heads paired, `launch_args`): an item is ROWS rows of two query heads of one KV head, each
    consumer warpgroup one head, and "head" counts head pairs in n_bh and head_chunk; otherwise an item is
    WGS * ROWS rows of one head."""
    if CAUSAL:
        chunk = t // (head_chunk * n_m)
        width = gl.minimum(head_chunk, n_bh - chunk * head_chunk)
        r = t - chunk * head_chunk * n_m
        m_idx = n_m - 1 - r // width
        bh = chunk * head_chunk + r % width
    else:
        bh = t // n_m
        m_idx = t % n_m
    ITEM_ROWS: gl.constexpr = ROWS if HEADS > 1 else WGS * ROWS
    b = bh // (heads_q // HEADS)
    h = bh % (heads_q // HEADS) * HEADS
    m_start = m_idx * ITEM_ROWS
    if VARLEN:
        row_q = gl.load(CU_Q + b)
        row_k = 0
        if CU_K is not None:      # packed keys (read around q's count: the order of the loads before caches)
            row_k = gl.load(CU_K + b)
        sq = gl.load(CU_Q + b + 1) - row_q
        if CU_K is not None:
            sk = gl.load(CU_K + b + 1) - row_k
        if SEQLENS is not None:   # a paged cache's key count, or how many of its packed keys a sequence uses
            sk = gl.load(SEQLENS + b)
        tb = 0
    else:
        row_q = 0
        row_k = 0
        sq = seqlen_q
        sk = seqlen_k
        if SEQLENS is not None:   # a KV cache: each sequence's own key count
            sk = gl.load(SEQLENS + b)
            if CU_K is not None:  # and its first key row (cache_leftpad): keys are rows [CU_K[b], SEQLENS[b])
                row_k = gl.load(CU_K + b)
                sk = gl.maximum(sk - row_k, 0)
        tb = b
    hi = sk
    if CAUSAL:
        diag = sk - sq
        if WINDOW:
            diag += right
        hi = gl.maximum(gl.minimum(hi, m_start + ITEM_ROWS + diag), 0)
    if VARLEN:
        hi = gl.where(m_start < sq, hi, 0)
    lo = 0
    lead = 0
    n_tiles = gl.cdiv(hi, BLOCK_N)
    if WINDOW:
        if LEFTS is not None:
            left = gl.load(LEFTS + b)
            left = gl.where(left < 0, UNBOUNDED_, gl.minimum(left, UNBOUNDED_))
        lead = sk - sq - left
        lo = gl.maximum(m_start + lead, 0) // BLOCK_N
        n_tiles = gl.maximum(n_tiles - lo, 0)
    return b, h, h // group, m_start, lo, n_tiles, sq, sk, row_q, row_k, tb, lead


@gluon.jit
def _paired_tail(m_start, sq, PAIR_TAILS: gl.constexpr):
    """Whether an item of one head (`_work_item`: its first row m_start, the sequence's sq rows) is the last row
    block of at most ROWS rows of a packed sequence, in a kernel that pairs them (PAIR_TAILS: packed sequences, two
    consumer warpgroups, an even GQA group; `_plan`): that block of query heads h and h + 1 (h even) runs as one
    item, each consumer warpgroup one head (as HEADS = 2 does every item), and head h + 1's item is left out
    (`_skipped`). Without it the second warpgroup's rows there all lie past the sequence's end: half of the item's
    work, and its keys read twice. A constexpr, so that the other kernels compile without it: MHA packed prefill
    with it compiled in (where it never fires) ran 0.3-1.9% slower at d = 64 (CUDA-graph timing, H200; NOTES.md,
    eighty-first session)."""
    pair = False
    if PAIR_TAILS:
        pair = sq - m_start <= ROWS
    return pair


@gluon.jit
def _next_item(COUNTER, t, DYNAMIC: gl.constexpr):
    """A program's first item is its own index. Items of unequal lengths (causal, or packed sequences): each next
    one is the first not yet taken (one atomic per item), so programs that drew short items take more of them.
    Unmasked items, all alike: every grid-th one, with no counter to zero before the launch and no atomics (+0.7%
    at d = 64 1k, level at 4k: benchmarks/results/history/ab_static_schedule_h100_4172235.json)."""
    if DYNAMIC:
        return gl.num_programs(0) + gl.atomic_add(COUNTER, 1)
    return t + gl.num_programs(0)


@gluon.jit
def _release_counter(COUNTER):
    """COUNTER's two words are the causal items taken past the first grid and the programs done. The last program
    to finish zeroes both: every other one has taken its last item by then, so the next launch on this stream finds
    the counter zeroed with no memset launch before it (`launch.zeroed_counter`)."""
    if gl.atomic_add(COUNTER + 1, 1) == gl.num_programs(0) - 1:
        gl.atomic_xchg(COUNTER, 0)
        gl.atomic_xchg(COUNTER + 1, 0)


LOOKAHEAD = gl.constexpr(32)     # left-out packed sequences `_past_empty` reads at once (a lane each)
ITEM_WORDS = 16                   # an item slot in shared memory: its index and `_work_item`'s twelve fields
ITEM_WORDS_ = gl.constexpr(ITEM_WORDS)


@gluon.jit
def _post_item(slot, t, item, WARPS: gl.constexpr):
    """The producer hands item t and its fields (`_work_item`; None past the last item) to the consumers in shared
    memory, before the Q barrier's arrive: they read them instead of working them out again, which took a consumer
    0.16-0.46 us an item between its index and its first scores (`history/probe_prefill_timeline_h100_96ea02e.json`).
    Every thread holds and writes the whole slot."""
    layout: gl.constexpr = gl.BlockedLayout([ITEM_WORDS_], [32], [WARPS], [0])
    word = gl.arange(0, ITEM_WORDS_, layout=layout)
    v = gl.full([ITEM_WORDS_], t, gl.int32, layout)
    if item is not None:
        for i in gl.static_range(len(item)):
            v = gl.where(word == i + 1, item[i], v)
    slot.store(v)


@gluon.jit
def _word(v, word, i: gl.constexpr):
    """Word i of a slot every thread holds whole (the selects fold away: `word` is known in each register)."""
    return gl.sum(gl.where(word == i, v, 0), axis=0)


@gluon.jit
def _read_item(slot, WARPS: gl.constexpr):
    """(item index, its `_work_item` fields) as the producer posted them (`_post_item`)."""
    layout: gl.constexpr = gl.BlockedLayout([ITEM_WORDS_], [32], [WARPS], [0])
    word = gl.arange(0, ITEM_WORDS_, layout=layout)
    v = slot.load(layout)
    item = (_word(v, word, 1), _word(v, word, 2), _word(v, word, 3), _word(v, word, 4), _word(v, word, 5),
            _word(v, word, 6), _word(v, word, 7), _word(v, word, 8), _word(v, word, 9), _word(v, word, 10),
            _word(v, word, 11), _word(v, word, 12))
    return _word(v, word, 0), item


@gluon.jit
def _box_origin(b, key, pages, PAGE_ROWS: gl.constexpr):
    """(TMA batch coordinate, row) of the box that starts at key `key` of TMA batch b. Paged (PAGE_ROWS > 0): b is
    the sequence, `pages` = (its block-table row, page_size, its last page), and the box lies inside one page: past
    the last page it re-reads that page (rows past the sequence's end, masked and zeroed like any others there), so
    that no block-table entry past the sequence's is read."""
    tb = b
    row = key
    if PAGE_ROWS > 0:
        table, page_size, last_page = pages
        page = gl.minimum(key // page_size, last_page)
        tb = gl.load(table + page)
        row = key - page * page_size
    return tb, row


@gluon.jit
def _at(desc, tb, row, head, stride_h, col):
    """TMA coordinates of column `col` of head `head` at (TMA batch tb, row) in desc's view: (batch, seqlen,
    columns), head h from column h * stride_h, or, for a padded head dim (`padded_dims`), (batch, seqlen, heads,
    head_dim)."""
    if len(desc.block_type.shape) == 4:
        return [tb, row, head, col]
    else:
        return [tb, row, head * stride_h + col]


@gluon.jit
def _as_box(smem, desc, rows: gl.constexpr):
    """A (rows, columns) shared-memory slot seen as a TMA box of desc's rank with `rows` rows."""
    box: gl.constexpr = desc.block_type.shape
    if len(box) == 4:
        return smem.reshape([1, rows, 1, box[3]])
    else:
        return smem.reshape([1, rows, box[2]])


@gluon.jit
def _known_fields(item, seqlen_q, seqlen_k, SEQLENS, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr,
                  VARLEN: gl.constexpr, WINDOW: gl.constexpr):
    """A posted item (`_read_item`) with the fields this call's kind fixes put back as the compiler knows them
    (`_work_item`'s constants and kernel arguments): read from shared memory they are opaque, and an unmasked
    d = 128 1k call ran 8% slower (`history/tune_prefill_post_fields_h100_34ea477.json`)."""
    b, h, hk, m_start, lo, n_tiles, sq, sk, row_q, row_k, tb, lead = item
    if not VARLEN:
        row_q = 0
        row_k = 0
        sq = seqlen_q
        tb = b
        if SEQLENS is None:
            sk = seqlen_k
    if not WINDOW:
        lo = 0
        lead = 0
        if not CAUSAL and not VARLEN:
            n_tiles = gl.cdiv(sk, BLOCK_N)
    return b, h, hk, m_start, lo, n_tiles, sq, sk, row_q, row_k, tb, lead


@gluon.jit
def _load_kv_tile(k_desc, v_desc, k_smem, v_smem, k_ready, k_empty, v_ready, v_empty, kv, b, row_k, row_v, i, hk,
                  stride_kh, stride_vh, pages, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, QK_PARTS: gl.constexpr,
                  PAGE_ROWS: gl.constexpr, V_COPY: gl.constexpr):
    """Key tile i of (TMA batch b, first row row_k, kv head hk) into ring position kv, K (its QK_PARTS column parts)
    and V each once its slot is free; returns kv + 1. Paged (PAGE_ROWS > 0): BLOCK_N // PAGE_ROWS boxes a tile, each
    from the page the block table names (`_box_origin`). V_COPY: V comes from its transposed FP8 copy
    (`transposed_v`), its keys from column row_v (row_k but for packed sequences); otherwise as K (with TRANSPOSE,
    into the staging ring that `_transposer` reads, v_smem and its barriers being that ring's)."""
    k_box: gl.constexpr = k_desc.block_type.shape
    v_box: gl.constexpr = v_desc.block_type.shape
    BOXES: gl.constexpr = 1 if PAGE_ROWS == 0 else BLOCK_N // PAGE_ROWS
    slot = kv % STAGES
    phase = ((kv // STAGES) & 1) ^ 1
    mbarrier.wait(k_empty.index(slot), phase)
    mbarrier.expect(k_ready.index(slot), BOXES * QK_PARTS * k_desc.block_type.nbytes)
    for r in gl.static_range(BOXES):
        tb, row = _box_origin(b, row_k + i * BLOCK_N + r * k_box[1], pages, PAGE_ROWS)
        for j in gl.static_range(QK_PARTS):
            dst = _as_box(k_smem.index(QK_PARTS * slot + j), k_desc, BLOCK_N)
            if BOXES > 1:
                dst = dst.slice(r * k_box[1], k_box[1], dim=1)
            tma.async_copy_global_to_shared(k_desc, _at(k_desc, tb, row, hk, stride_kh, j * k_box[-1]),
                                            k_ready.index(slot), dst)
    mbarrier.wait(v_empty.index(slot), phase)
    mbarrier.expect(v_ready.index(slot), BOXES * v_desc.block_type.nbytes)
    if V_COPY:
        # FP8: V transposed, (batch, kv heads * head_dim_v, keys), kv head hk's rows from hk * stride_vh (its
        # head_dim_v), one box of (1, head_dim_v, BLOCK_N) (`_pv`); no pages
        gl.static_assert(BOXES == 1, "FP8 V tiles come from V's copy, not pages")
        tma.async_copy_global_to_shared(v_desc, [b, hk * stride_vh, row_v + i * BLOCK_N], v_ready.index(slot),
                                        v_smem.index(slot).reshape(v_box))
    else:
        for r in gl.static_range(BOXES):
            tb, row = _box_origin(b, row_k + i * BLOCK_N + r * v_box[1], pages, PAGE_ROWS)
            dst = _as_box(v_smem.index(slot), v_desc, BLOCK_N)
            if BOXES > 1:
                dst = dst.slice(r * v_box[1], v_box[1], dim=1)
            tma.async_copy_global_to_shared(v_desc, _at(v_desc, tb, row, hk, stride_vh, 0), v_ready.index(slot), dst)
    return kv + 1


@gluon.jit
def _load_item(args, t, item, kv, w, BLOCK_N: gl.constexpr,
               STAGES: gl.constexpr, Q_BUFS: gl.constexpr, WGS: gl.constexpr, QK_PARTS: gl.constexpr,
               PAGE_ROWS: gl.constexpr, HEADS: gl.constexpr, VARLEN: gl.constexpr, V_COPY: gl.constexpr,
               PAIR_TAILS: gl.constexpr):
    """Post work item t (the producer's w-th; `item`: its `_work_item` fields) and load its Q rows and key tiles
    lo .. lo + n_tiles - 1 of its sk keys; returns (kv, w) after it. Consumer warpgroup g's Q: rows
    m_start + g * ROWS of head h, or with HEADS = 2 (or a paired tail, `_paired_tail`) rows m_start of head h + g."""
    (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, items, q_ready, q_empty, k_ready, k_empty, v_ready, v_empty,
     _, _, _, _, _, _, _, _, stride_qh, stride_kh, stride_vh, _, _, _, _, _, _, BLOCK_TABLE, stride_bt,
     page_size) = args
    b, h, hk, m_start, lo, n_tiles, _, sk, row_q, row_k, tb, _ = item
    pair = _paired_tail(m_start, item[6], PAIR_TAILS)
    row_v = row_k
    if VARLEN and V_COPY:
        # FP8 packed sequences: V's copy has sequence b's keys from an aligned column (row_k = CU_K[b])
        row_v = packed_start(row_k, b)
    pages = (None, 0, 0)
    if PAGE_ROWS > 0:             # a paged KV cache: sequence b's block-table row and its last page
        # (b, not the TMA batch tb, which for packed queries is the packed view's 0)
        pages = (BLOCK_TABLE + b * stride_bt, page_size, gl.maximum(gl.cdiv(row_k + sk, page_size) - 1, 0))
    # The descriptors are 3-D, (batch, seqlen, columns) with boxes (1, rows, head_dim), or 4-D for a padded head
    # dim (`_at`); each box lands in a 2-D slot seen through a view of the box's shape (`_as_box`).
    q_box: gl.constexpr = q_desc.block_type.shape
    qb = w % Q_BUFS
    # With one Q buffer (d = 256, 192) the item's first key tile goes out before its Q: its ring slots free up
    # while the consumers are still on the previous item, whereas the Q buffer frees only after their last Q·Kᵀ
    # (`q_last` in `_consumer`). Waiting for Q first left every item boundary with nothing in flight while Q was
    # released only at the item's end (d=256 1k causal: 228 -> 344 TFLOP/s, `history/prefill_h100_f93e080.json`);
    # two tiles first (as then) queue Q behind the slot of the item's last V, which frees only at its end. One
    # tile first, with the early release, against two and the release at the end (two processes, both orders,
    # `history/tune_prefill_earlyq_*_h100_0075e25*.json`): 1k +2..+6.5% (d = 256 and 192, masked or not), 4k and
    # 16k level. With two Q buffers the Q goes first: it is free early, and queuing it behind the tiles' slots
    # cost d = 64 / 128 2-9% in f93e080's run.
    head = gl.minimum(n_tiles, 1) if Q_BUFS == 1 else 0
    for i in range(head):
        kv = _load_kv_tile(k_desc, v_desc, k_smem, v_smem, k_ready, k_empty, v_ready, v_empty, kv, tb, row_k,
                           row_v, lo + i, hk, stride_kh, stride_vh, pages, BLOCK_N, STAGES, QK_PARTS, PAGE_ROWS,
                           V_COPY)
    # A buffer is free once every consumer released it; the first pass over a ring waits on nothing.
    mbarrier.wait(q_empty.index(qb), ((w // Q_BUFS) & 1) ^ 1)
    _post_item(items.index(qb), t, item, gl.num_warps())
    mbarrier.expect(q_ready.index(qb), WGS * QK_PARTS * q_desc.block_type.nbytes)
    for g in gl.static_range(WGS):
        for j in gl.static_range(QK_PARTS):
            if HEADS > 1:
                q_row = row_q + m_start
                q_head = h + g
            else:
                q_row = row_q + m_start + g * ROWS
                q_head = h
                if g > 0:
                    q_row = gl.where(pair, row_q + m_start, q_row)
                    q_head = gl.where(pair, h + g, q_head)
            tma.async_copy_global_to_shared(q_desc, _at(q_desc, tb, q_row, q_head, stride_qh, j * q_box[-1]),
                                            q_ready.index(qb),
                                            q_smem.index(QK_PARTS * (WGS * qb + g) + j).reshape(q_box))
    for i in range(head, n_tiles):
        kv = _load_kv_tile(k_desc, v_desc, k_smem, v_smem, k_ready, k_empty, v_ready, v_empty, kv, tb, row_k,
                           row_v, lo + i, hk, stride_kh, stride_vh, pages, BLOCK_N, STAGES, QK_PARTS, PAGE_ROWS,
                           V_COPY)
    return kv, w + 1


@gluon.jit
def _skipped(item, PAIR_TAILS: gl.constexpr, MIN_ROWS: gl.constexpr):
    """Whether a packed sequence's item is left out: its first row past the sequence's query length, the odd head
    of a paired tail (`_paired_tail`: the even head's item runs it), or (MIN_ROWS > 0) a sequence of at most
    MIN_ROWS query rows."""
    paired_odd = _paired_tail(item[3], item[6], PAIR_TAILS) & (item[1] % 2 == 1)
    skip = (item[3] >= item[6]) | paired_odd
    if MIN_ROWS > 0:
        skip = skip | (item[6] <= MIN_ROWS)
    return skip


@gluon.jit
def _past_empty(COUNTER, t, item, CU_Q, n_m, n_bh, head_chunk, heads_q, CAUSAL: gl.constexpr, WGS: gl.constexpr,
                HEADS: gl.constexpr, MIN_ROWS: gl.constexpr):
    """Item t of a packed sequence is empty (`_skipped`): move the counter past the run of empty items it is in, so
    that the next item taken (`_next_item`) is the first after the run. A sequence left out (at most MIN_ROWS query
    rows, or none): its items and those of the left-out sequences after it, up to LOOKAHEAD of them read at once
    (a lane each). A sequence with rows: its row blocks past its end, in its causal chunk (the longest blocks come
    first there) or its head (unmasked: a head's blocks in order). Each sequence's items are one run of t, since a
    packed call's causal chunks never span two sequences (`_chunk`). Taken one at a time (an atomic and the
    sequence's lengths each), a mixed batch's empty items (every query head's of each decode; past the end of each
    short sequence's heads) held every program for more than a tenth of the call."""
    ITEM_ROWS: gl.constexpr = ROWS if HEADS > 1 else WGS * ROWS
    heads = heads_q // HEADS      # items' heads a sequence
    if item[6] <= MIN_ROWS:
        layout: gl.constexpr = gl.BlockedLayout([1], [32], [gl.num_warps()], [0])
        b = item[0] + 1 + gl.arange(0, LOOKAHEAD, layout=layout)
        there = b < n_bh // heads
        rows = gl.load(CU_Q + b + 1, mask=there, other=0) - gl.load(CU_Q + b, mask=there, other=0)
        end = gl.min(gl.where(rows > MIN_ROWS, b, item[0] + 1 + LOOKAHEAD), axis=0) * heads * n_m
    elif CAUSAL:
        chunk = t // (head_chunk * n_m)
        width = gl.minimum(head_chunk, n_bh - chunk * head_chunk)
        end = chunk * head_chunk * n_m + (n_m - gl.cdiv(item[6], ITEM_ROWS)) * width
    else:
        end = (t // n_m + 1) * n_m
    gl.atomic_max(COUNTER, end - gl.num_programs(0))


@gluon.jit
def _first_with_rows(t, args, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr, WGS: gl.constexpr, WINDOW: gl.constexpr,
                     HEADS: gl.constexpr, MIN_ROWS: gl.constexpr, PAIR_TAILS: gl.constexpr):
    """Packed sequences: (the first item from t on whose rows start inside their sequence, its `_work_item`). The
    grid counts every sequence's blocks up to the longest; a block past its own sequence's end is never posted, so
    the consumers see only items with rows. Each item's fields are worked out once; an index past the last item
    is read as the last one, so that nothing is loaded out of bounds. MIN_ROWS > 0: a sequence of at most that
    many query rows has no items here either (another launch runs it: `forward.attention_forward`'s short
    sequences)."""
    (_, _, _, _, _, _, _, _, _, _, _, _, _, COUNTER, n_m, n_bh, head_chunk, heads_q, group, seqlen_q, seqlen_k, _, _,
     _, CU_Q, CU_K, left, LEFTS, right, SEQLENS, _, _, _) = args
    item = _work_item(gl.minimum(t, n_m * n_bh - 1), n_m, n_bh, head_chunk, heads_q, group, seqlen_q, seqlen_k, CU_Q,
                      CU_K, SEQLENS, left, LEFTS, right, BLOCK_N, CAUSAL, WGS, True, WINDOW, HEADS)
    while (t < n_m * n_bh) & _skipped(item, PAIR_TAILS, MIN_ROWS):
        _past_empty(COUNTER, t, item, CU_Q, n_m, n_bh, head_chunk, heads_q, CAUSAL, WGS, HEADS, MIN_ROWS)
        t = _next_item(COUNTER, t, True)
        item = _work_item(gl.minimum(t, n_m * n_bh - 1), n_m, n_bh, head_chunk, heads_q, group, seqlen_q, seqlen_k,
                          CU_Q, CU_K, SEQLENS, left, LEFTS, right, BLOCK_N, CAUSAL, WGS, True, WINDOW, HEADS)
    return t, item


@gluon.jit
def _producer(args, staging, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, Q_BUFS: gl.constexpr, CAUSAL: gl.constexpr,
              WGS: gl.constexpr, QK_PARTS: gl.constexpr, VARLEN: gl.constexpr, WINDOW: gl.constexpr,
              PAGE_ROWS: gl.constexpr, DYNAMIC: gl.constexpr, HEADS: gl.constexpr, V_COPY: gl.constexpr,
              TRANSPOSE: gl.constexpr, MIN_ROWS: gl.constexpr, PAIR_TAILS: gl.constexpr):
    """The producer warp. DYNAMIC: items of unequal lengths, taken through the counter (`_next_item`).
    TRANSPOSE: V tiles go to the staging ring (`args` holds it in V's place), and after the last one the producer
    marks the next position as the end for `_transposer` (`staging`: that ring's barriers and the end flag)."""
    (_, _, _, _, _, _, items, q_ready, q_empty, _, _, _, _, COUNTER, n_m, n_bh, head_chunk, heads_q, group, seqlen_q,
     seqlen_k, _, _, _, CU_Q, CU_K, left, LEFTS, right, SEQLENS, _, _, _) = args
    kv = 0                        # K/V tiles loaded so far: position in the ring and its phase
    w = 0                         # work items so far: the Q buffer and its phase
    t = gl.program_id(0)
    if TRANSPOSE:                 # read by the transposer once a staging slot's barrier says it landed
        for i in gl.static_range(STAGES):
            _set_flag(staging[2].index(i), 0)
    if VARLEN:
        t, item = _first_with_rows(t, args, BLOCK_N, CAUSAL, WGS, WINDOW, HEADS, MIN_ROWS, PAIR_TAILS)
        while t < n_m * n_bh:
            kv, w = _load_item(args, t, item, kv, w, BLOCK_N, STAGES, Q_BUFS, WGS, QK_PARTS, PAGE_ROWS, HEADS,
                               VARLEN, V_COPY, PAIR_TAILS)
            t, item = _first_with_rows(_next_item(COUNTER, t, True), args, BLOCK_N, CAUSAL, WGS, WINDOW,
                                       HEADS, MIN_ROWS, PAIR_TAILS)
    else:
        while t < n_m * n_bh:
            item = _work_item(t, n_m, n_bh, head_chunk, heads_q, group, seqlen_q, seqlen_k, CU_Q, CU_K, SEQLENS, left,
                              LEFTS, right, BLOCK_N, CAUSAL, WGS, VARLEN, WINDOW, HEADS)
            kv, w = _load_item(args, t, item, kv, w, BLOCK_N, STAGES, Q_BUFS, WGS, QK_PARTS, PAGE_ROWS, HEADS,
                               VARLEN, V_COPY, PAIR_TAILS)
            t = _next_item(COUNTER, t, DYNAMIC)
    # The end: an index past the last item tells the consumers to stop.
    qb = w % Q_BUFS
    mbarrier.wait(q_empty.index(qb), ((w // Q_BUFS) & 1) ^ 1)
    _post_item(items.index(qb), t, None, gl.num_warps())
    mbarrier.arrive(q_ready.index(qb), count=1)
    if TRANSPOSE:
        # The end: the next staging slot arrives, once free, with its flag set. One flag a slot: the transposer
        # reads slot s's flag before it releases the slot, so the producer sets it only after the transposer has
        # read it for every earlier tile of that slot (with one flag for all, the end could be read at the last
        # tile, still untransposed, and the consumers would wait for it forever).
        raw_ready, raw_empty, stop = staging
        mbarrier.wait(raw_empty.index(kv % STAGES), ((kv // STAGES) & 1) ^ 1)
        _set_flag(stop.index(kv % STAGES), 1)
        mbarrier.arrive(raw_ready.index(kv % STAGES), count=1)
    if DYNAMIC:
        _release_counter(COUNTER)


@gluon.jit
def _set_flag(flag, value):
    """Write a one-word shared flag (every thread of the partition, the same value)."""
    flag.store(gl.full([1], value, gl.int32, gl.BlockedLayout([1], [32], [gl.num_warps()], [0])))


@gluon.jit
def _transposer(raw, staging, v_smem, v_ready, v_empty, BLOCK_N: gl.constexpr, HEAD_DV: gl.constexpr,
                STAGES: gl.constexpr):
    """FP8 V transposed in the kernel (TRANSPOSE), by a warpgroup of its own: each (keys, head_dim_v) tile that
    the producer's TMA lands in the staging ring `raw` is written (head_dim_v, keys) into V's slot of the same ring
    position (`_pv`) once the consumers have freed it, in chunks of CH keys (32 bytes a thread, blocks of 4 keys x
    8 columns: at 128 x 128, 62 instructions a thread and 48 shared-memory wavefronts a warp a chunk, 3x the ideal,
    `benchmarks/probe_transpose_layouts.py`; Triton turns them into byte permutes), then marked ready and its
    staging slot released. Stops at the ring position whose flag the producer sets (`_producer`)."""
    raw_ready, raw_empty, stop = staging
    TPW_D: gl.constexpr = HEAD_DV // 32       # threads across head_dim_v, 8 columns each, the four warps side by side
    CH: gl.constexpr = 4 * (32 // TPW_D)      # keys a chunk
    blk: gl.constexpr = gl.BlockedLayout([4, 8], [32 // TPW_D, TPW_D], [1, 4], [1, 0])
    flag: gl.constexpr = gl.BlockedLayout([1], [32], [gl.num_warps()], [0])
    kv = 0
    mbarrier.wait(raw_ready.index(0), 0)
    while gl.max(stop.index(kv % STAGES).load(flag), 0) == 0:
        slot = kv % STAGES
        mbarrier.wait(v_empty.index(slot), ((kv // STAGES) & 1) ^ 1)
        for c in gl.static_range(BLOCK_N // CH):
            x = raw.index(slot).slice(c * CH, CH, dim=0).load(blk)
            v_smem.index(slot).slice(c * CH, CH, dim=1).store(gl.permute(x, [1, 0]))
        fence_async_shared()      # the stores before the consumers' wgmma reads
        gl.thread_barrier()
        mbarrier.arrive(v_ready.index(slot), count=1)
        mbarrier.arrive(raw_empty.index(slot), count=1)
        kv += 1
        mbarrier.wait(raw_ready.index(kv % STAGES), (kv // STAGES) & 1)


@gluon.jit
def bars(n: gl.constexpr, count: gl.constexpr):
    """n mbarriers in an allocation of their own, each expecting `count` arrivals. Triton's membar puts a CTA barrier
    between two inits of one allocation: a few in a kernel's prologue, once a program (the prefill and FP8 decode
    kernels timed level with their inits interleaved over the rings, `history/mend_ab*_h200*_{7d0dc4f,24bcdcb}.json`).
    `sparse_decode_sm90` allocates its own: `sm90.launch_pairs` finds two of them by their variables' names."""
    b = gl.allocate_shared_memory(gl.int64, [n, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(n):
        mbarrier.init(b.index(i), count=count)
    return b


@gluon.jit
def bar(count: gl.constexpr):
    """One mbarrier in an allocation of its own."""
    return bars(1, count).index(0)


@gluon.jit
def _softmax_tile(s, i, m_i, l_i, q_pos, bounds, qk_scale_log2, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr,
                  WINDOW: gl.constexpr, SOFTCAP: gl.constexpr, ALIBI: gl.constexpr, s_layout: gl.constexpr,
                  LAZY: gl.constexpr = False, P_SHIFT: gl.constexpr = 0.0):
    """Fold the raw scores of key tile `i` (of BLOCK_N keys; `s` may hold only its first columns) into (m_i, l_i);
    returns the probabilities and the rescale factor. `bounds` = (key count, the diagonal's offset (keys a row sees
    past its own index, `right` included), first tile that crosses the end or the diagonal, the left bound's offset
    (a row's first visible key less its index), first tile no row's left bound cuts, SOFTCAP's input scale, ALIBI's
    slope and offset).
    SOFTCAP: the scores become tanh(s * scale / softcap) first, and `qk_scale_log2` is softcap * log2(e). ALIBI: then
    less `slope` * |q_pos + `offset` - key| (`bounds`' last two: the head's slope over the scale, the diagonal).
    P_SHIFT: the probabilities and l_i come out 2^P_SHIFT times larger (FP8's P, `_consumer`)."""
    seqlen_k, diag, mask_from, lead, unmask_from, cap_in, slope, offset = bounds
    # tanh through exp2, as the portable kernel (`common.scores_log2`): two MUFU operations a score (ex2, and the
    # reciprocal in div.full). FlashAttention-3's tanh.approx.f32 is one, but its relative error (2^-11) times a
    # softcap of 50 is up to 0.025 in a row's LSE, where this form is exact to fp32 rounding.
    if SOFTCAP:
        x = s * cap_in
        e = gl.exp2(-2.0 * LOG2E_ * gl.abs(x))
        t = (1.0 - e) / (1.0 + e)
        s = gl.where(x >= 0, t, -t)
    if ALIBI:                     # less slope * |the row's own key - the key|, in the units of s
        keys = gl.arange(0, s.shape[1], layout=gl.SliceLayout(0, s_layout)).to(gl.float32)
        own = (q_pos + offset - i * BLOCK_N).to(gl.float32)
        s = s - slope * gl.abs(own[:, None] - keys[None, :])
    if WINDOW:
        masked = (i >= mask_from) | (i < unmask_from)
    else:
        masked = i >= mask_from
    if masked:                    # a tile that crosses the sequence end, the diagonal or the window's left edge
        # One comparison per score: the column against the row's last visible column of this tile.
        cols = gl.arange(0, s.shape[1], layout=gl.SliceLayout(0, s_layout))
        last = gl.full([ROWS], seqlen_k - 1 - i * BLOCK_N, gl.int32, gl.SliceLayout(1, s_layout))
        if CAUSAL:
            last = gl.minimum(last, q_pos + diag - i * BLOCK_N)
        if WINDOW:                # and against its first visible column
            first = q_pos + lead - i * BLOCK_N
            s = gl.where((cols[None, :] <= last[:, None]) & (cols[None, :] >= first[:, None]), s, float("-inf"))
        else:
            s = gl.where(cols[None, :] <= last[:, None], s, float("-inf"))
    row_max = gl.max(s, 1) * qk_scale_log2
    if LAZY:                      # the max moves only when passed by more than LAZY_BY (`_rescale`)
        m_new = gl.where(row_max > m_i + LAZY_BY, row_max, m_i)
    else:
        m_new = gl.maximum(m_i, row_max)
    # A row that has seen no key yet keeps m = -inf; shift it by 0 so exp2 gives 0, not NaN.
    m_shift = gl.where(m_new == float("-inf"), 0.0, m_new)
    p = gl.exp2(s * qk_scale_log2 - (m_shift - P_SHIFT)[:, None])       # x - 0.0 folds away for 16-bit P
    alpha = gl.exp2(m_i - m_shift)
    l_i = l_i * alpha + gl.sum(p, 1)
    return p, m_new, l_i, alpha


# FlashAttention-4's conditional rescale (`LAZY` forms, `_consumer`): a row's running max moves only when a tile's
# scores pass it by more than LAZY_BY (log2 units: probabilities reach 2^LAZY_BY at most; output and LSE are taken
# against the same max), and each warp skips the rescale of its 16 accumulator rows while none of their maxima
# moved. Gluon branches per partition (warpgroup), so the per-warp branch is inline PTX: a vote over the warp's
# factors (`_VOTE`: a thread holds two rows' factors), then the multiplies behind one uniform jump
# (`_rescale_asm`, outputs tied to the accumulator's registers).
LAZY_BY = gl.constexpr(8.0)
_VOTE = gl.constexpr("{ .reg .pred p; setp.neu.f32 p, $2, 0f3F800000; setp.neu.or.f32 p, $3, 0f3F800000, p; "
                     "vote.sync.any.pred p, p, -1; selp.f32 $0, 0f3F800000, 0f00000000, p; mov.b32 $1, $0; }")


@triton.constexpr_function
def _rescale_asm(n):
    """PTX over a thread's n accumulator values: operands $0.. the outputs, then the n inputs (tied to them), the n
    factors and the n warp flags (all equal); the multiplies run unless the first flag is 0."""
    muls = " ".join(f"mul.f32 ${i}, ${i}, ${2 * n + i};" for i in range(n))
    return ("{ .reg .pred p; setp.eq.f32 p, $" + str(3 * n) + ", 0f00000000; @p bra.uni SKIP_${:uid}; " + muls
            + " SKIP_${:uid}: }")


@triton.constexpr_function
def _rescale_constraints(n):
    return ",".join(["=f"] * n + [str(i) for i in range(n)] + ["f"] * (2 * n))


@gluon.jit
def _rescale(acc, alpha, LAZY: gl.constexpr):
    """acc * alpha, one factor a row; LAZY: skipped by each warp none of whose rows' factors differ from 1."""
    a = gl.convert_layout(alpha, gl.SliceLayout(1, acc.type.layout))
    if LAZY:
        moved = gl.inline_asm_elementwise(_VOTE, "=f,=f,f,f", [a], gl.float32, True, 2)
        N: gl.constexpr = ROWS * acc.shape[1] // 128         # accumulator values a thread
        acc = gl.inline_asm_elementwise(_rescale_asm(N), _rescale_constraints(N), [acc, a[:, None], moved[:, None]],
                                        gl.float32, True, N)
    else:
        acc = acc * a[:, None]
    return acc


@gluon.jit
def _take_turn(turn, r, WG: gl.constexpr, PINGPONG: gl.constexpr):
    """Ping-pong: the two consumer warpgroups issue their wgmma rounds alternately (warpgroup 0 first), so
    one's softmax runs while the other's matrix products occupy the tensor cores. Round r of warpgroup 1
    waits for round r of warpgroup 0 and vice versa for round r + 1; returns r + 1."""
    if PINGPONG:
        mbarrier.wait(turn.index(WG), (r & 1) ^ (1 - WG))
    return r + 1


@gluon.jit
def _give_turn(turn, WG: gl.constexpr, PINGPONG: gl.constexpr):
    if PINGPONG:
        mbarrier.arrive(turn.index(1 - WG), count=1)


@gluon.jit
def _skip_tiles(k_ready, k_empty, v_ready, v_empty, start, stop, STAGES: gl.constexpr):
    """Release ring positions start..stop-1 unread. Each waits for its tile to land first: an early release
    would count towards the slot's previous round and let the producer overwrite a tile still being read."""
    for c in range(start, stop):
        slot = c % STAGES
        mbarrier.wait(k_ready.index(slot), (c // STAGES) & 1)
        mbarrier.arrive(k_empty.index(slot), count=1)
        mbarrier.wait(v_ready.index(slot), (c // STAGES) & 1)
        mbarrier.arrive(v_empty.index(slot), count=1)


@gluon.jit
def _wait_v(v_smem, v_ready, c, i, tail, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, CLEAN: gl.constexpr):
    """Wait for the V tile at ring position c (key tile i). CLEAN (a KV cache, or packed sequences): rows at or past
    key `tail` may hold anything, NaN too (a cache slot past the sequence's length, rows past the last packed
    sequence in a longer buffer); their probabilities are 0, but 0 * NaN is NaN in P·V, so a tile that reaches
    past `tail` has those rows zeroed in shared memory first (`zero_rows_from`; every consumer warpgroup zeroes the
    same rows, so whichever writes last, each one's P·V reads the same values). A constexpr guard: a runtime test
    alone leaves the code in every form."""
    slot = c % STAGES
    mbarrier.wait(v_ready.index(slot), (c // STAGES) & 1)
    if CLEAN:
        if (i + 1) * BLOCK_N > tail:
            zero_rows_from(v_smem.index(slot), tail - i * BLOCK_N)


@gluon.jit
def zero_rows_from(v, first):
    """Zero the rows at or past `first` of the shared-memory tile v (rows, a multiple of 64 columns), 64 columns at a
    time, and make the stores visible to the tensor cores; run by every thread of one warpgroup. Rows before `first`
    are written back with the values they hold, so another warpgroup may run it on the same tile meanwhile. Also
    the MLA kernel's, for its TMA-loaded value tiles (`mla_decode_sm90._zero_tail`)."""
    layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    keep = (gl.arange(0, v.shape[0], layout=gl.SliceLayout(1, layout)) < first)[:, None]
    for j in gl.static_range(v.shape[1] // 64):
        part = v.slice(64 * j, 64, dim=1)
        part.store(gl.where(keep, part.load(layout), 0.0).to(v.dtype))
    fence_async_shared()
    gl.thread_barrier()


@gluon.jit
def _scores(q_smem, q0, k_smem, k0, acc, HALF: gl.constexpr, QK_PARTS: gl.constexpr):
    """Issue S = Q·Kᵀ (async) for the Q parts from slot q0 and the K parts from slot k0, one wgmma per column
    part into `acc` (whose values are not read); HALF: over the tile's first ROWS keys only."""
    for j in gl.static_range(QK_PARTS):
        k = k_smem.index(k0 + j)
        if HALF:
            k = k.slice(0, ROWS, dim=0)
        acc = warpgroup_mma(q_smem.index(q0 + j), k.permute((1, 0)), acc, use_acc=j > 0, is_async=True)
    return acc


@gluon.jit
def _pv(v_smem, slot, KEYS: gl.constexpr):
    """P·V's B operand: the first KEYS keys of V slot `slot`, seen as (keys, head_dim_v). An FP8 slot holds V
    transposed, (head_dim_v, keys): wgmma reads 8-bit operands only K-major."""
    v = v_smem.index(slot)
    if v_smem.dtype.primitive_bitwidth == 8:
        if KEYS < v.shape[1]:
            v = v.slice(0, KEYS, dim=1)
        v = v.permute((1, 0))
    elif KEYS < v.shape[0]:
        v = v.slice(0, KEYS, dim=0)
    return v


@triton.constexpr_function
def _p_shift(bits):
    """FP8 (e4m3) P: log2 of the factor its probabilities are scaled by, FlashAttention-3's, so that they lie in
    (0, 256], inside e4m3's normal range (from 2^-6) for all but the ones under 2^-14; 0 for 16-bit P."""
    return 8.0 if bits == 8 else 0.0


@gluon.jit
def _half_tile(q_smem, q0, k_smem, v_smem, k_ready, k_empty, v_ready, v_empty, c, acc, m_i, l_i, p_op,
               HAS_PREV: gl.constexpr, q_pos, bounds, qk_scale_log2, i, tail, BLOCK_N: gl.constexpr,
               STAGES: gl.constexpr, CAUSAL: gl.constexpr, WINDOW: gl.constexpr, SOFTCAP: gl.constexpr,
               ALIBI: gl.constexpr, p_layout: gl.constexpr, QK_PARTS: gl.constexpr, CLEAN: gl.constexpr,
               P_SHIFT: gl.constexpr):
    """The last key tile of a causal item for warpgroup 0 when its rows see only the tile's first ROWS keys
    (the diagonal tile of a 128-row item over 128-key tiles): S and P·V over those keys alone, half the tile's
    work. Ring position c; with HAS_PREV the previous tile's P·V (`p_op` against position c - 1) is issued
    beside S, as in the main loop (without it `p_op` is None). `p_layout`: P's operand layout for P·V; `bounds` as
    `_softmax_tile`'s (this tile, key tile i, is always masked); `tail` and CLEAN as `_wait_v`'s. Returns (acc, m_i,
    l_i) with this tile's P·V done."""
    MMA_K: gl.constexpr = 256 // q_smem.dtype.primitive_bitwidth
    h_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, ROWS, MMA_K])
    slot = c % STAGES
    mbarrier.wait(k_ready.index(slot), (c // STAGES) & 1)
    s_tok = _scores(q_smem, q0, k_smem, QK_PARTS * slot, gl.zeros([ROWS, ROWS], gl.float32, h_layout), True,
                    QK_PARTS)
    if HAS_PREV:
        prev = (c - 1) % STAGES
        o_tok = warpgroup_mma(p_op, _pv(v_smem, prev, BLOCK_N), acc, is_async=True)
        s = warpgroup_mma_wait(1, deps=(s_tok,))
    else:
        s = warpgroup_mma_wait(0, deps=(s_tok,))
    mbarrier.arrive(k_empty.index(slot), count=1)
    # The row vectors' layout follows the score tile's; the rows sit in the same threads either way.
    row_h: gl.constexpr = gl.SliceLayout(1, h_layout)
    row_s: gl.constexpr = m_i.type.layout
    seqlen_k, diag, _, lead, unmask_from, cap_in, slope, offset = bounds
    p, m_h, l_h, alpha = _softmax_tile(s, i, gl.convert_layout(m_i, row_h), gl.convert_layout(l_i, row_h),
                                       gl.convert_layout(q_pos, row_h),
                                       (seqlen_k, diag, i, lead, unmask_from, cap_in, slope, offset), qk_scale_log2,
                                       BLOCK_N, CAUSAL, WINDOW, SOFTCAP, ALIBI, h_layout, False, P_SHIFT)
    m_i = gl.convert_layout(m_h, row_s)
    l_i = gl.convert_layout(l_h, row_s)
    if HAS_PREV:
        acc = warpgroup_mma_wait(0, deps=(o_tok,))
        mbarrier.arrive(v_empty.index(prev), count=1)
    acc = _rescale(acc, alpha, False)
    p_half = gl.convert_layout(p.to(q_smem.dtype), p_layout)
    _wait_v(v_smem, v_ready, c, i, tail, BLOCK_N, STAGES, CLEAN)
    o_tok = warpgroup_mma(p_half, _pv(v_smem, slot, ROWS), acc, is_async=True)
    acc = warpgroup_mma_wait(0, deps=(o_tok,))
    mbarrier.arrive(v_empty.index(slot), count=1)
    return acc, m_i, l_i


@gluon.jit
def _release_q(q_empty, qb, now, Q_BUFS: gl.constexpr):
    """One Q buffer (Q_BUFS = 1): this warpgroup is done with it if `now` (see `q_last` in `_consumer`)."""
    if Q_BUFS == 1:
        if now:
            mbarrier.arrive(q_empty.index(qb), count=1)


@gluon.jit
def _consumer(shared, WG: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DV: gl.constexpr, DV_STORE: gl.constexpr,
              STAGES: gl.constexpr, Q_BUFS: gl.constexpr, CAUSAL: gl.constexpr, PINGPONG: gl.constexpr,
              WGS: gl.constexpr, OFFSETS_64: gl.constexpr, QK_PARTS: gl.constexpr, VARLEN: gl.constexpr,
              WINDOW: gl.constexpr, HAS_SINKS: gl.constexpr, SOFTCAP: gl.constexpr, ALIBI: gl.constexpr,
              CLEAN: gl.constexpr, HEADS: gl.constexpr, TMA_STORE: gl.constexpr, PAIR_TAILS: gl.constexpr):
    """Consumer warpgroup WG of WGS; `shared` holds the arguments common to all of them (one tuple, so that the
    kernel writes them once for two or three partitions). HEADS = 2: the item's rows of query head h + WG.
    DV_STORE: the output's columns, HEAD_DV or fewer for a padded head_dim_v (`padded_dims`)."""
    (q_smem, k_smem, v_smem, items, q_ready, q_empty, k_ready, k_empty, v_ready, v_empty, O, LSE, n_m, n_bh,
     heads_q, seqlen_q, seqlen_k, qk_scale_log2, stride_ob, stride_os, stride_oh, stride_lb, stride_lh, stride_ls,
     turn, o_desc, o_stage, o_free, left, right, SINKS, cap_in, SEQLENS, SLOPES, Q_DESCALE, K_DESCALE, V_DESCALE,
     group) = shared
    dtype: gl.constexpr = q_smem.dtype
    MMA_K: gl.constexpr = 256 // dtype.primitive_bitwidth      # a wgmma's K: 32 bytes of its operands
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, MMA_K])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, HEAD_DV, MMA_K])
    # FP8 (e4m3 q, k, v): P in e4m3 too, scaled by 2^P_SHIFT (`_p_shift`); the descales per (batch, KV head), each
    # (batch, kv heads) fp32 or None (1): q's times k's into the scores' scale, v's into the output's.
    FP8: gl.constexpr = dtype.primitive_bitwidth == 8
    P_SHIFT: gl.constexpr = _p_shift(dtype.primitive_bitwidth)
    gl.static_assert(not (FP8 and CLEAN), "an FP8 V's copy has its rows past the end zeroed already")
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout,
                                                 k_width=32 // dtype.primitive_bitwidth)
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    store_layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    zero_s = gl.zeros([ROWS, BLOCK_N], gl.float32, s_layout)
    # The conditional rescale (`_rescale`) where it measured faster: causal d = 128 over two warpgroups, +3% at 1k,
    # +1..+4% on KV-cache chunks, level at 4k / 16k (`history/tune_prefill_lazy_causal_h100_792bd99.json`); level
    # or worse elsewhere (on every form: `history/tune_prefill_lazy_warp_h100_2078046_*.json`, NOTES.md).
    # Not with FP8's P, whose shift leaves no room for LAZY_BY more.
    LAZY: gl.constexpr = CAUSAL and HEAD_DV == 128 and WGS == 2 and not FP8
    # With paired heads both warpgroups hold the item's rows, so either may need only half of its last tile.
    HALF_DIAG: gl.constexpr = (CAUSAL and (WGS == 2) and (not PINGPONG) and (BLOCK_N == 2 * ROWS)
                               and (WG == 0 or HEADS > 1))
    kv = 0                        # the producer's counters, kept in step
    w = 0
    turns = 0                     # wgmma issue rounds so far (PINGPONG)
    qb = 0
    mbarrier.wait(q_ready.index(0), 0)
    t, item = _read_item(items.index(0), 4)
    while t < n_m * n_bh:
        b, h0, hk, m_start, lo, n_tiles, sq, sk, row_q, row_k, tb, lead = _known_fields(
            item, seqlen_q, seqlen_k, SEQLENS, BLOCK_N, CAUSAL, VARLEN, WINDOW)
        # CLEAN: V rows from this key on are zeroed before P·V (`_wait_v`): a KV cache's past its length; packed
        # sequences' past the last one's end (the buffer may be longer), not past the others' (the next one's keys).
        tail = sk
        if VARLEN and SEQLENS is None:
            tail = gl.where(b == n_bh * HEADS // heads_q - 1, sk, UNBOUNDED_)
        diag = sk - sq            # a row's last visible key less its index (CAUSAL)
        if WINDOW:
            diag += right
        if HEADS > 1:             # this warpgroup's query head and first row
            h = h0 + WG
            m0 = m_start
        else:
            h = h0
            m0 = m_start + WG * ROWS
            if PAIR_TAILS and WG > 0:             # a paired tail: the same rows of the next head
                pair = _paired_tail(m_start, sq, PAIR_TAILS)
                h = gl.where(pair, h0 + WG, h)
                m0 = gl.where(pair, m_start, m0)
        q_pos = m0 + gl.arange(0, ROWS, layout=row_s)
        # With three warpgroups, the key tiles this one's rows need: none past the causal horizon of its last
        # row, none when all its rows lie past the sequence's end (the last 192-row block of a sequence whose
        # length is not a multiple of 192); the item's other tiles are only released (`_skip_tiles`). With two
        # (128 rows, key tiles of 128 or 64) that is rarely a whole tile (the one full run with it there,
        # `history/prefill_h100_1b59d54.json`, had the unmasked d=128 rows 1.5-2.5% below the runs before and
        # after, within noise but not a gain), and ping-pong needs both warpgroups to take the same number of
        # turns: there each runs all of the item's tiles.
        n_mine = n_tiles
        if WGS > 2:
            if m0 >= sq:
                n_mine = 0
            if CAUSAL:
                hi_mine = gl.cdiv(gl.maximum(m0 + ROWS + diag, 0), BLOCK_N)
                if WINDOW:
                    hi_mine = gl.maximum(hi_mine - lo, 0)
                n_mine = gl.minimum(n_mine, hi_mine)
        # Warpgroup 0 of a causal 128-row item over 128-key tiles: when its rows see only the first ROWS keys
        # of its last tile (the diagonal tile), that tile runs at half width (`_half_tile`). Not with ping-pong
        # (both warpgroups must take the same turns) or three warpgroups (whole tiles are trimmed there).
        n_full = n_mine
        half_last = False
        if HALF_DIAG:
            half_last = (n_mine > 0) & (m0 + ROWS + diag <= (lo + n_mine - 1) * BLOCK_N + ROWS)
            n_full = n_mine - half_last.to(gl.int32)
        # One Q buffer: this warpgroup releases it right after its last Q·Kᵀ (the main loop's tile q_last), not
        # after the item's last P·V, so the next item's Q loads under this item's last softmax, P·V and epilogue.
        # -1: at the item's end (no main-loop tile, or a half-width last tile, which reads Q again).
        q_last = n_full - 1
        if HALF_DIAG:
            q_last = gl.where(half_last, -1, q_last)
        # First key tile that needs a mask for some row of this warpgroup; with a left bound, also every tile
        # before the first one that all its rows see from the start.
        mask_from = sk // BLOCK_N
        if CAUSAL:
            mask_from = gl.minimum(mask_from, gl.maximum(m0 + diag + 1, 0) // BLOCK_N)
        unmask_from = 0
        if WINDOW:
            unmask_from = gl.cdiv(gl.maximum(m0 + ROWS - 1 + lead, 0), BLOCK_N)
        scale = qk_scale_log2
        cap = cap_in
        v_scale = 1.0
        if FP8:                   # this item's descales: those of (batch b, KV head hk)
            at = b * (heads_q // group) + hk
            qk = 1.0
            if Q_DESCALE is not None:
                qk = gl.load(Q_DESCALE + at)
            if K_DESCALE is not None:
                qk = qk * gl.load(K_DESCALE + at)
            if SOFTCAP:
                cap = cap_in * qk
            else:
                scale = qk_scale_log2 * qk
            if V_DESCALE is not None:
                v_scale = gl.load(V_DESCALE + at)
        slope = 0.0
        if ALIBI:                 # the head's slope in the units of the raw scores (`_softmax_tile`)
            slope = gl.load(SLOPES + h) * (LOG2E_ / scale)
        bounds = (sk, diag, mask_from, lead, unmask_from, cap, slope, sk - sq)
        acc = gl.zeros([ROWS, HEAD_DV], gl.float32, o_layout)
        m_i = gl.full([ROWS], float("-inf"), gl.float32, row_s)
        l_i = gl.zeros([ROWS], gl.float32, row_s)
        q0 = QK_PARTS * (WGS * qb + WG)         # this warpgroup's Q parts
        if n_full > 0:
            slot = kv % STAGES
            mbarrier.wait(k_ready.index(slot), (kv // STAGES) & 1)
            turns = _take_turn(turn, turns, WG, PINGPONG)
            s_tok = _scores(q_smem, q0, k_smem, QK_PARTS * slot, zero_s, False, QK_PARTS)
            _give_turn(turn, WG, PINGPONG)
            s = warpgroup_mma_wait(0, deps=(s_tok,))
            mbarrier.arrive(k_empty.index(slot), count=1)
            _release_q(q_empty, qb, q_last == 0, Q_BUFS)
            p, m_i, l_i, alpha = _softmax_tile(s, lo, m_i, l_i, q_pos, bounds, scale, BLOCK_N, CAUSAL,
                                               WINDOW, SOFTCAP, ALIBI, s_layout, LAZY, P_SHIFT)
            for i in range(1, n_full):
                # Issue S_i = Q·K_iᵀ and O += P_{i-1}·V_{i-1}; the softmax of S_i runs while P·V is on the
                # tensor cores.
                c = kv + i
                slot = c % STAGES
                prev = (c - 1) % STAGES
                acc = _rescale(acc, alpha, LAZY)
                p_op = gl.convert_layout(p.to(dtype), p_layout)
                mbarrier.wait(k_ready.index(slot), (c // STAGES) & 1)
                _wait_v(v_smem, v_ready, c - 1, lo + i - 1, tail, BLOCK_N, STAGES, CLEAN)
                turns = _take_turn(turn, turns, WG, PINGPONG)
                s_tok = _scores(q_smem, q0, k_smem, QK_PARTS * slot, zero_s, False, QK_PARTS)
                o_tok = warpgroup_mma(p_op, _pv(v_smem, prev, BLOCK_N), acc, is_async=True)
                _give_turn(turn, WG, PINGPONG)
                s = warpgroup_mma_wait(1, deps=(s_tok,))
                mbarrier.arrive(k_empty.index(slot), count=1)
                _release_q(q_empty, qb, q_last == i, Q_BUFS)
                p, m_i, l_i, alpha = _softmax_tile(s, lo + i, m_i, l_i, q_pos, bounds, scale, BLOCK_N,
                                                   CAUSAL, WINDOW, SOFTCAP, ALIBI, s_layout, LAZY, P_SHIFT)
                acc = warpgroup_mma_wait(0, deps=(o_tok,))
                mbarrier.arrive(v_empty.index(prev), count=1)
            c = kv + n_full - 1
            last = c % STAGES
            acc = _rescale(acc, alpha, LAZY)
            p_op = gl.convert_layout(p.to(dtype), p_layout)
            _wait_v(v_smem, v_ready, c, lo + n_full - 1, tail, BLOCK_N, STAGES, CLEAN)
            if half_last:
                acc, m_i, l_i = _half_tile(q_smem, q0, k_smem, v_smem, k_ready, k_empty, v_ready, v_empty, c + 1,
                                           acc, m_i, l_i, p_op, True, q_pos, bounds, scale, lo + n_full, tail,
                                           BLOCK_N, STAGES, CAUSAL, WINDOW, SOFTCAP, ALIBI, p_layout, QK_PARTS, CLEAN,
                                           P_SHIFT)
            else:
                turns = _take_turn(turn, turns, WG, PINGPONG)
                o_tok = warpgroup_mma(p_op, _pv(v_smem, last, BLOCK_N), acc, is_async=True)
                _give_turn(turn, WG, PINGPONG)
                acc = warpgroup_mma_wait(0, deps=(o_tok,))
                mbarrier.arrive(v_empty.index(last), count=1)
        elif half_last:           # the item's only tile, at half width
            acc, m_i, l_i = _half_tile(q_smem, q0, k_smem, v_smem, k_ready, k_empty, v_ready, v_empty, kv, acc,
                                       m_i, l_i, None, False, q_pos, bounds, scale, lo, tail, BLOCK_N,
                                       STAGES, CAUSAL, WINDOW, SOFTCAP, ALIBI, p_layout, QK_PARTS, CLEAN, P_SHIFT)
        _skip_tiles(k_ready, k_empty, v_ready, v_empty, kv + n_mine, kv + n_tiles, STAGES)
        if Q_BUFS > 1:
            mbarrier.arrive(q_empty.index(qb), count=1)
        else:
            _release_q(q_empty, qb, q_last < 0, Q_BUFS)
        kv += n_tiles
        w += 1

        # Epilogue (overlapping the other warpgroup's tiles and the producer's next loads): normalise and
        # write the rows that exist; a row with no visible key gives 0 and LSE -inf. A sink joins the
        # denominator only (the LSE leaves it out).
        # l_i is 2^P_SHIFT times the row's sum (FP8; P_SHIFT = 0 otherwise, and x - 0.0 folds away).
        empty = l_i == 0.0
        lse = gl.where(empty, float("-inf"), (m_i + gl.log2(gl.where(empty, 1.0, l_i)) - P_SHIFT) * LN2)
        denom = l_i
        if HAS_SINKS:
            denom = l_i + gl.exp2(gl.load(SINKS + h) * LOG2E_ - (m_i - P_SHIFT))
        inv_l = gl.convert_layout(v_scale / gl.where(empty, 1.0, denom), row_o)
        out = None
        if not TMA_STORE:
            out = gl.convert_layout((acc * inv_l[:, None]).to(O.dtype.element_ty), store_layout)
        rows = m0 + gl.arange(0, ROWS, layout=gl.SliceLayout(1, store_layout))
        cols = gl.arange(0, HEAD_DV, layout=gl.SliceLayout(0, store_layout))
        # VARLEN: the sequence's rows start at row_q of the packed output (stride_ob and stride_lb are 0).
        if OFFSETS_64:
            # An output or LSE past 2^31 elements: strides under 2^31 arrive as int32 and their products would
            # wrap. The warpgroup's first row in 64 bits, its 64 rows from there in 32.
            r0 = (row_q + m0).to(gl.int64)
            o_ptrs = (O + (b.to(gl.int64) * stride_ob + h.to(gl.int64) * stride_oh + r0 * stride_os)
                      + (rows - m0)[:, None] * stride_os + cols[None, :])
            lse_ptrs = (LSE + (b.to(gl.int64) * stride_lb + h.to(gl.int64) * stride_lh + r0 * stride_ls)
                        + (q_pos - m0) * stride_ls)
        else:
            o_ptrs = O + b * stride_ob + h * stride_oh + (row_q + rows)[:, None] * stride_os + cols[None, :]
            lse_ptrs = LSE + b * stride_lb + h * stride_lh + (row_q + q_pos) * stride_ls
        if TMA_STORE:
            # One staging buffer, the two warpgroups' outputs by turns (warpgroup 0 first each item): wait for the
            # other's store to have read it, write, and store with TMA, which clips the rows past the end.
            mbarrier.wait(o_free.index(WG), ((w - 1) & 1) ^ (1 - WG))
            o_stage.store((acc * inv_l[:, None]).to(O.dtype.element_ty))
            fence_async_shared()
            gl.thread_barrier()
            tma.async_copy_shared_to_global(o_desc, _at(o_desc, b, row_q + m0, h, stride_oh, 0),
                                            o_stage.reshape(o_desc.block_type.shape))
        elif DV_STORE < HEAD_DV:  # a padded head_dim_v: its last columns are zeros (`padded_dims`)
            gl.store(o_ptrs, out, mask=(rows < sq)[:, None] & (cols < DV_STORE)[None, :])
        else:
            gl.store(o_ptrs, out, mask=(rows < sq)[:, None])
        gl.store(lse_ptrs, lse, mask=q_pos < sq)
        if TMA_STORE:
            tma.store_wait(0)     # the buffer read: the other warpgroup's turn
            mbarrier.arrive(o_free.index(1 - WG), count=1)
        qb = w % Q_BUFS
        mbarrier.wait(q_ready.index(qb), (w // Q_BUFS) & 1)
        t, item = _read_item(items.index(qb), 4)


@gluon.jit
def attn_fwd_sm90_kernel(q_desc, k_desc, v_desc, o_desc, O, LSE, COUNTER, CU_Q, CU_K, SINKS, LEFTS, SEQLENS,
                         BLOCK_TABLE, SLOPES, Q_DESCALE, K_DESCALE, V_DESCALE, seqlen_q,
                         seqlen_k,
                         heads_q, group, n_bh, head_chunk,
                         stride_qh, stride_kh, stride_vh,
                         stride_ob, stride_os, stride_oh, stride_lb, stride_lh, stride_ls, qk_scale_log2, cap_in,
                         left, right, stride_bt, page_size,
                         BLOCK_N: gl.constexpr, HEAD_D: gl.constexpr, HEAD_DV: gl.constexpr, DV_STORE: gl.constexpr,
                         STAGES: gl.constexpr, Q_BUFS: gl.constexpr, CAUSAL: gl.constexpr,
                         PINGPONG: gl.constexpr, CONSUMER_REGS: gl.constexpr, WGS: gl.constexpr,
                         OFFSETS_64: gl.constexpr, VARLEN: gl.constexpr, WINDOW: gl.constexpr,
                         HAS_SINKS: gl.constexpr, SOFTCAP: gl.constexpr, KV_CACHE: gl.constexpr,
                         PAGE_ROWS: gl.constexpr, HAS_ALIBI: gl.constexpr, HEADS: gl.constexpr,
                         TMA_STORE: gl.constexpr, TRANSPOSE: gl.constexpr, MIN_ROWS: gl.constexpr = 0,
                         PAIR_TAILS: gl.constexpr = False):
    """Persistent: each program runs work items until none is left (`_next_item`); COUNTER is two zeroed int32
    words (causal or windowed calls, `zeroed_counter`; None otherwise), which the kernel leaves zeroed. OFFSETS_64: O
    or LSE reaches past 2^31 elements (the epilogue's offsets in 64 bits). HEADS: query heads an item (1, or 2 for
    GQA heads paired: ROWS rows of two heads of one KV head; n_bh and head_chunk then count pairs). VARLEN:
    n_bh * HEADS / heads_q packed sequences, CU_Q / CU_K their row offsets (`_work_item`); seqlen_q / seqlen_k the
    longest; with KV_CACHE, SEQLENS gives each one's key count instead (of a paged cache, CU_K None, or of its packed
    keys). SPEC.md's window (left, right): CAUSAL when right >= 0, WINDOW unless it is (-1, 0) or (-1, -1),
    with `left` past every key for -1 (`launch_args`); LEFTS (batch,) int32, or None: one left bound a sequence in
    place of `left`. HAS_SINKS: SINKS (heads_q,) fp32, one logit a head in the denominator. SOFTCAP: scores capped
    as softcap * tanh(score / softcap), `cap_in` = softmax_scale / softcap, `qk_scale_log2` = softcap * log2(e).
    KV_CACHE: SEQLENS (batch,) int32 gives each sequence's key count (its last key row + 1 when CU_K, not None
    here, gives its first: FlashAttention's cache_leftpad), seqlen_k the cache's capacity; the cache is
    contiguous (k/v descriptors over (batch, capacity, columns)) or, with PAGE_ROWS > 0, paged: descriptors over
    (pages, page_size, columns) with boxes of PAGE_ROWS rows, key j of sequence b in page
    BLOCK_TABLE[b * stride_bt + j // page_size]. HAS_ALIBI: SLOPES (heads_q,) fp32; a score less
    slope * |its row's own key (bottom-right aligned) - its key|. FP8 q, k and v (float8e4nv): v_desc is over V
    transposed, (batch, kv heads * head_dim_v, keys) with (1, HEAD_DV, BLOCK_N) boxes, stride_vh = HEAD_DV, and
    Q_DESCALE, K_DESCALE, V_DESCALE are each a contiguous (batch, kv heads) fp32 or None (1); with VARLEN,
    sequence b's keys start at column `transpose.packed_start` of V's copy (`_load_item`). TRANSPOSE (FP8, two
    consumer warpgroups, no VARLEN): v_desc is over V as given, like K's, and the kernel transposes it
    (`_transposer`) instead.
    TMA_STORE (`tma_store`): the output leaves through a staging buffer and `o_desc`, a descriptor over O as
    (batch, seqlen_q, columns) with (1, ROWS, HEAD_DV) boxes; otherwise `o_desc` is None and the output is stored
    through pointers.
    MIN_ROWS > 0 (VARLEN): packed sequences of at most MIN_ROWS query rows are left to another launch
    (`_first_with_rows`), their output rows untouched. PAIR_TAILS (VARLEN, WGS = 2, HEADS = 1, an even GQA group:
    `_plan`): a packed sequence's last row block of at most ROWS rows runs two query heads as one item
    (`_paired_tail`)."""
    # V rows past a sequence may hold NaN (`_wait_v`); an FP8 V's copy has zeros there (`transposed_v`).
    CLEAN: gl.constexpr = KV_CACHE or (VARLEN and q_desc.dtype.primitive_bitwidth != 8)
    DYNAMIC: gl.constexpr = CAUSAL or WINDOW or VARLEN or KV_CACHE      # items of unequal lengths
    n_m = gl.cdiv(seqlen_q, ROWS if HEADS > 1 else WGS * ROWS)
    dtype: gl.constexpr = q_desc.dtype
    D_PART: gl.constexpr = q_desc.block_type.shape[-1]    # Q and K columns per TMA box and slot
    QK_PARTS: gl.constexpr = HEAD_D // D_PART
    q_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([ROWS, D_PART], dtype)
    k_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, D_PART], dtype)
    q_smem = gl.allocate_shared_memory(dtype, [WGS * Q_BUFS * QK_PARTS, ROWS, D_PART], q_layout)
    k_smem = gl.allocate_shared_memory(dtype, [STAGES * QK_PARTS, BLOCK_N, D_PART], k_layout)
    raw_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, HEAD_DV], dtype)
    if dtype.primitive_bitwidth == 8:       # FP8: V transposed (`_pv`); the descales (`_consumer`)
        v_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([HEAD_DV, BLOCK_N], dtype)
        v_smem = gl.allocate_shared_memory(dtype, [STAGES, HEAD_DV, BLOCK_N], v_layout)
    else:
        v_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DV], raw_layout)
    # A buffer's or slot's ready barrier expects one arrival, its empty barrier one from every consumer warpgroup.
    q_ready = bars(Q_BUFS, 1)
    q_empty = bars(Q_BUFS, WGS)
    k_ready = bars(STAGES, 1)
    k_empty = bars(STAGES, WGS)
    v_ready = bars(STAGES, 1)
    v_empty = bars(STAGES, WGS)
    items = gl.allocate_shared_memory(gl.int32, [Q_BUFS, ITEM_WORDS_], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    turn = bars(2, 1)
    if TMA_STORE:                 # the output's staging buffer and its turns (`_consumer`'s epilogue)
        o_stage = gl.allocate_shared_memory(dtype, [ROWS, HEAD_DV],
                                            gl.NVMMASharedLayout.get_default_for([ROWS, HEAD_DV], dtype))
        o_free = bars(2, 1)
    else:                         # unused stand-ins: a tuple holds no None
        o_desc, o_stage, o_free = q_desc, q_smem, turn
    if TRANSPOSE:                 # V as given, staged for `_transposer`: its ring, barriers and end flag
        raw = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DV], raw_layout)
        raw_ready = bars(STAGES, 1)
        raw_empty = bars(STAGES, 1)
        stop = gl.allocate_shared_memory(gl.int32, [STAGES, 1], gl.SwizzledSharedLayout(1, 1, 1, [0]))
        staging = (raw_ready, raw_empty, stop)
    else:                         # V's own ring; `staging` an unused stand-in
        raw, raw_ready, raw_empty = v_smem, v_ready, v_empty
        staging = (v_ready, v_empty, items)

    # The consumers take each item's fields from the producer (`_read_item`), not the schedule's arguments.
    shared = (q_smem, k_smem, v_smem, items, q_ready, q_empty, k_ready, k_empty, v_ready, v_empty, O, LSE, n_m, n_bh,
              heads_q, seqlen_q, seqlen_k, qk_scale_log2, stride_ob, stride_os, stride_oh, stride_lb, stride_lh,
              stride_ls, turn, o_desc, o_stage, o_free, left, right, SINKS, cap_in, SEQLENS, SLOPES, Q_DESCALE,
              K_DESCALE, V_DESCALE, group)
    # The producer's V tiles go to `raw`: V's own ring, or with TRANSPOSE the staging ring.
    producer = (q_desc, k_desc, v_desc, q_smem, k_smem, raw, items, q_ready, q_empty, k_ready, k_empty, raw_ready,
                raw_empty, COUNTER, n_m, n_bh, head_chunk, heads_q, group, seqlen_q, seqlen_k, stride_qh, stride_kh,
                stride_vh, CU_Q, CU_K, left, LEFTS, right, SEQLENS, BLOCK_TABLE, stride_bt, page_size)
    # The tuples above hold no constexpr (a tuple in a variable does not keep them); those go in literally.
    V_COPY: gl.constexpr = dtype.primitive_bitwidth == 8 and not TRANSPOSE
    if WGS == 2 and TRANSPOSE:
        # The transposer is a fourth warpgroup and the default partition, the consumers and the producer workers
        # (16 warps share 512 registers a thread of warpgroups: 2 x 232, the producer's 24, the transposer's 24).
        # With consumer 0 as the default partition, compiled at the function's 128, the consumers needed 224 and
        # still spilled 36 bytes at d = 128 (NOTES.md, fifty-fourth session); this way nothing spills at 232.
        # Gluon takes each partition list as written (no list built from two), hence the consumers written out in
        # both branches.
        gl.warp_specialize([
            (_transposer, (raw, staging, v_smem, v_ready, v_empty, BLOCK_N, HEAD_DV, STAGES)),
            (_consumer, (shared, 0, BLOCK_N, HEAD_DV, DV_STORE, STAGES, Q_BUFS, CAUSAL, PINGPONG, WGS,
                          OFFSETS_64, QK_PARTS, VARLEN, WINDOW, HAS_SINKS, SOFTCAP, HAS_ALIBI, CLEAN, HEADS,
                          TMA_STORE, PAIR_TAILS)),
            (_consumer, (shared, 1, BLOCK_N, HEAD_DV, DV_STORE, STAGES, Q_BUFS, CAUSAL, PINGPONG, WGS,
                          OFFSETS_64, QK_PARTS, VARLEN, WINDOW, HAS_SINKS, SOFTCAP, HAS_ALIBI, CLEAN, HEADS,
                          TMA_STORE, PAIR_TAILS)),
            (_producer, (producer, staging, BLOCK_N, STAGES, Q_BUFS, CAUSAL, WGS, QK_PARTS, VARLEN, WINDOW, PAGE_ROWS,
                          DYNAMIC, HEADS, V_COPY, TRANSPOSE, MIN_ROWS, PAIR_TAILS)),
        ], [4, 4, 1], [CONSUMER_REGS, CONSUMER_REGS, 24])
    elif WGS == 2:
        gl.warp_specialize([
            (_consumer, (shared, 0, BLOCK_N, HEAD_DV, DV_STORE, STAGES, Q_BUFS, CAUSAL, PINGPONG, WGS,
                          OFFSETS_64, QK_PARTS, VARLEN, WINDOW, HAS_SINKS, SOFTCAP, HAS_ALIBI, CLEAN, HEADS,
                          TMA_STORE, PAIR_TAILS)),
            (_consumer, (shared, 1, BLOCK_N, HEAD_DV, DV_STORE, STAGES, Q_BUFS, CAUSAL, PINGPONG, WGS,
                          OFFSETS_64, QK_PARTS, VARLEN, WINDOW, HAS_SINKS, SOFTCAP, HAS_ALIBI, CLEAN, HEADS,
                          TMA_STORE, PAIR_TAILS)),
            (_producer, (producer, staging, BLOCK_N, STAGES, Q_BUFS, CAUSAL, WGS, QK_PARTS, VARLEN, WINDOW, PAGE_ROWS,
                          DYNAMIC, HEADS, V_COPY, TRANSPOSE, MIN_ROWS, PAIR_TAILS)),
        ], [4, 1], [CONSUMER_REGS, REGS_3WG - 2 * CONSUMER_REGS])
    else:
        # Three consumers run as workers, each at CONSUMER_REGS; the producer is the default partition (4 warps,
        # one issuing) with what is left. As the default partition a consumer was compiled into far more spills
        # than the workers (54 against 9 local loads per key tile at 168 and 160 registers).
        gl.static_assert(not TRANSPOSE, "an FP8 V is transposed in the kernel beside two consumer warpgroups only")
        gl.warp_specialize([
            (_producer, (producer, staging, BLOCK_N, STAGES, Q_BUFS, CAUSAL, WGS, QK_PARTS, VARLEN, WINDOW, PAGE_ROWS,
                          DYNAMIC, HEADS, V_COPY, TRANSPOSE, MIN_ROWS, PAIR_TAILS)),
            (_consumer, (shared, 0, BLOCK_N, HEAD_DV, DV_STORE, STAGES, Q_BUFS, CAUSAL, PINGPONG, WGS,
                          OFFSETS_64, QK_PARTS, VARLEN, WINDOW, HAS_SINKS, SOFTCAP, HAS_ALIBI, CLEAN, HEADS,
                          TMA_STORE, PAIR_TAILS)),
            (_consumer, (shared, 1, BLOCK_N, HEAD_DV, DV_STORE, STAGES, Q_BUFS, CAUSAL, PINGPONG, WGS,
                          OFFSETS_64, QK_PARTS, VARLEN, WINDOW, HAS_SINKS, SOFTCAP, HAS_ALIBI, CLEAN, HEADS,
                          TMA_STORE, PAIR_TAILS)),
            (_consumer, (shared, 2, BLOCK_N, HEAD_DV, DV_STORE, STAGES, Q_BUFS, CAUSAL, PINGPONG, WGS,
                          OFFSETS_64, QK_PARTS, VARLEN, WINDOW, HAS_SINKS, SOFTCAP, HAS_ALIBI, CLEAN, HEADS,
                          TMA_STORE, PAIR_TAILS)),
        ], [4, 4, 4], [CONSUMER_REGS, CONSUMER_REGS, CONSUMER_REGS])


def padded_dims(d, dv):
    """The (head_dim_qk, head_dim_v) pair of `HEAD_DIMS` that a call of (d, dv) runs as, or None: its own, or of the
    pairs that widen each dim at most PAD_MAX times, the one with the fewest products (160 runs as (192, 256), 96 as
    (128, 128), (160, 128) as (192, 128)). A padded call's TMA boxes are the padded widths over 4-D views (batch,
    seqlen, heads, head_dim) whose last dimension is the real one (`tma_view`), so TMA fills the columns past it with
    zeros: they add nothing to Q·Kᵀ, and the output columns P·V makes of V's are zeros that are not
    stored (`DV_STORE`)."""
    if (d, dv) in HEAD_DIMS:
        return d, dv
    fits = [p for p in HEAD_DIMS if d <= p[0] <= PAD_MAX * d and dv <= p[1] <= PAD_MAX * dv]
    return min(fits, key=sum, default=None)       # the fewest products


def tma_view(t, padded=False):
    """(shape, strides) of the 3-D TMA view (batch, seqlen, columns) of a (batch, seqlen, heads, dim) tensor, or
    with `padded` (a head dim run padded, `padded_dims`) the 4-D view (batch, seqlen, heads, dim), whose boxes get
    zeros past the head's last column; None when TMA's rules (16-byte aligned base and strides, unit last stride)
    are not met. A head's first column must be 16-byte aligned too: FP8 rows of 136-byte heads (8 NaN columns past
    128 in the tests) crashed the kernel with its boxes starting between (NOTES.md, fifty-first session)."""
    b, s, h, d = t.shape
    sb, ss, sh, sd = t.stride()
    el = t.element_size()
    if (sd != 1 or (el * sb) % 16 or (el * ss) % 16 or t.data_ptr() % 16
            or (h > 1 and (sh < d or (el * sh) % 16))):
        return None
    if padded:                    # one head: its stride is never stepped, but TMA wants it 16-byte aligned
        return [b, s, h, d], [sb, ss, sh if h > 1 else d, 1]
    return [b, s, (h - 1) * sh + d], [sb, ss, 1]


def supported(q, k, v):
    """Whether a plain dense call (the caller has checked the options) can take this path: Hopper, fp16/bf16,
    (head_dim_qk, head_dim_v) in `HEAD_DIMS` (FP8) or run padded to a pair there (`padded_dims`, fp16 / bf16),
    keys present, and q/k/v strides that TMA accepts. Returns the three TMA views (`tma_view`, for
    `attention_forward_sm90`), or None."""
    if not on_hopper(q):
        return None
    if q.dtype not in (torch.float16, torch.bfloat16, torch.float8_e4m3fn) or q.dim() != 4:
        return None
    if q.dtype == torch.float8_e4m3fn and v.dtype != q.dtype:
        return None
    dims = (q.shape[-1], v.shape[-1])
    pad = padded_dims(*dims) if q.dtype != torch.float8_e4m3fn else (dims if dims in FP8_HEAD_DIMS else None)
    if pad is None or k.shape[1] == 0:
        return None
    views = tuple(tma_view(t, pad != dims) for t in (q, k, v))
    return None if None in views else views


# Launch plans (`_Plan`) of automatic calls, by `_plan_key`; False for a call `supported` refuses. A call whose key
# was seen skips `supported` and `_plan`: 20-30 us of an eager call's host time on the device's hosts, where a short
# prefill's kernel runs 100-200 us (NOTES.md, fifty-eighth session). A packed call of new token counts or longest
# lengths takes its plan from one of other lengths where there is one (`_Plan.with_lengths`) and keeps it too.
_PLANS = Plans()


def attention_forward_sm90(q, k, v, out, lse, *, causal, softmax_scale, views=None, pingpong=None, tiles=None,
                           varlen=None, window=None, sinks=None, softcap=0.0, cache=None, alibi_slopes=None,
                           pack=None, descales=None, transpose=None, short_rows=0):
    """Launch the Gluon kernel, or return False, launching nothing, for a call this path does not run (`supported`);
    True when launched. q/k (b, s, h, d), v (b, sk, hk, dv); out (b, sq, hq, dv); lse (b, hq, sq).
    `varlen` = (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k): packed sequences, q/k/v/out
    (total, h, d) and lse (hq, total_q). `window` (left, right) as SPEC.md's, in place of `causal` when given,
    `left` an int or a (batch,) int32 tensor of one bound a sequence (negative: none);
    `sinks` (hq,) fp32 or None; `softcap` > 0 caps the scores. `cache` = (cache_seqlens, block_table or None,
    key starts or None): k/v are a KV cache, contiguous (b, capacity, hk, d) or paged (pages, page_size, hk, d),
    sequence b's keys its rows [starts[b], cache_seqlens[b]) (the kernel's CU_K; from row 0 without). With
    `varlen`, packed queries over a paged cache (k/v as here, cu_seqlens_k None), or packed keys of which sequence b
    uses its first cache_seqlens[b] (FlashAttention's seqused_k).
    `alibi_slopes` (hq,) fp32 or None. FP8 (float8_e4m3fn q, k and v; no cache): `descales` (q, k, v), each None or
    (b, hk) fp32. `views` are `supported`'s result when the caller
    has it (for varlen, of the tensors with a leading axis of 1); `pingpong`, `tiles` and `pack` (GQA heads paired
    in an item, `pack_heads`) override the automatic choices (tuning, tests); so does `transpose` (an FP8 V
    transposed in the kernel, `transpose_in_kernel`, or copied first). Calls with none of these five take a plan
    kept from an earlier call of the same key (`_PLANS`). `short_rows` > 0 (varlen): packed sequences of at most
    that many query rows are left out, their output and LSE rows untouched (the kernel's MIN_ROWS)."""
    automatic = views is None and pingpong is None and tiles is None and pack is None and transpose is None
    key = shared = None
    if automatic:
        key = _plan_key(q, k, v, out, lse, causal, softmax_scale, varlen, window, sinks, softcap, cache,
                        alibi_slopes, descales, short_rows)
    plan = _PLANS.get(key) if automatic else None
    if plan is None:
        if automatic and varlen is not None:      # packed: a plan of other lengths, made this call's
            shared = _plan_key(q, k, v, out, lse, causal, softmax_scale, varlen, window, sinks, softcap, cache,
                               alibi_slopes, descales, short_rows, lengths=False)
            plan = _PLANS.get(shared)
            plan = plan and plan.with_lengths(q, k, v, lse, varlen, cache)     # None, False (refused) or a plan
        if plan is None:
            options = dict(causal=causal, softmax_scale=softmax_scale, varlen=varlen, window=window, sinks=sinks,
                           softcap=softcap, cache=cache, alibi_slopes=alibi_slopes, descales=descales,
                           short_rows=short_rows)
            if views is None:
                views = supported(*_as_batch(q, k, v, varlen, cache))
            plan = views is not None and _plan(q, k, v, out, lse, views=views, pingpong=pingpong, tiles=tiles,
                                               pack=pack, transpose=transpose, **options)
            if shared is not None:
                _PLANS.keep(shared, plan)
        if automatic:
            _PLANS.keep(key, plan)
    if not plan:
        return False
    launch(attn_fwd_sm90_kernel, plan.grid,
           plan.bind(q, k, v, out, lse, varlen, window, sinks, cache, alibi_slopes, descales), plan.meta, plan.fixed)
    return True


def _plan_key(q, k, v, out, lse, causal, softmax_scale, varlen, window, sinks, softcap, cache, alibi_slopes,
              descales, short_rows=0, lengths=True):
    """All that `supported` and `_plan` read of a call: its tensors' shapes, strides, dtypes, device and 16-byte
    alignment (the data's addresses are `_Plan.bind`'s), which optional tensors it has (a block table's shape and
    strides), and its scalar options (`short_rows` among them). Packed sequences with `lengths` False: not their
    token counts nor their longest lengths, which change from batch to batch of a server, but what `_plan` decides
    from them (whether any keys are there, whether the output's offsets need 64 bits, which row bounds of the tile
    and ping-pong choices the longest query length reaches): the key of a plan that `_Plan.with_lengths` makes a
    call's from."""
    left, right = window if window is not None else (-1, 0 if causal else -1)
    seqlens, table, starts = cache or (None, None, None)
    if lengths:
        shapes = (q.shape, k.shape, v.shape, out.shape, lse.shape, lse.stride(),
                  varlen is None or (varlen[0].shape, varlen[2], varlen[3]))
    else:
        longest = varlen[2]
        shapes = (q.shape[1:], k.shape[1:], v.shape[1:], out.shape[1:], lse.shape[0], lse.stride(1),
                  varlen[0].shape, k.shape[0] == 0, offsets_64(out, lse),
                  longest >= WIDE_MIN_ROWS, longest >= WIDE_MIN_ROWS_CAUSAL, longest >= PINGPONG_MIN_ROWS_D128)
    return (*shapes, q.stride(), k.stride(), v.stride(), out.stride(), q.dtype, k.dtype, v.dtype, out.dtype, q.device,
            q.data_ptr() % 16, k.data_ptr() % 16, v.data_ptr() % 16, out.data_ptr() % 16,
            causal, softmax_scale, softcap, None if isinstance(left, torch.Tensor) else left, right,
            sinks is None, alibi_slopes is None, seqlens is None, table is None or (table.shape, table.stride()),
            starts is None,
            descales is None or tuple(t is None for t in descales), short_rows)


def _as_batch(q, k, v, varlen, cache):
    """q, k and v as the kernel's TMA views see them: packed sequences as one batch of all their tokens (q, and
    k / v unless they are a paged cache, which keeps its own shape)."""
    if varlen is None:
        return q, k, v
    if cache is None or cache[1] is None:
        return q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0)
    return q.unsqueeze(0), k, v


def _key_bound(seqlen_k, cache, k):
    """A call's bound on a sequence's keys: a paged cache's capacity (its block table's pages a sequence times `k`'s
    page size), else `seqlen_k` (k's rows a sequence, or a packed call's max_seqlen_k)."""
    table = cache[1] if cache else None
    return seqlen_k if table is None else table.shape[1] * k.shape[1]


def choose_tiles(d, causal, seqlen_q, left=-1, softcap=0.0, paged=False, dv=None):
    """`_PAIR_TILES[d, dv]`, `_TILES[d]`, or `_WIDE_TILES[d]` for a long call. A masked call with a left window bound
    (`left` >= 0) is as long as its window: the 192-row items of a 128-key window at 16k rows (gpt-oss, d = 64) ran
    at 0.70x the 128-row ones (`results/probe_window_h100.json` against `history/probe_window_wide_h100_8fbdafd.json`).
    Not with a softcap: at 160 registers its tanh spilled 1.2 KB a thread (sm_90 compile). A paged cache keeps the
    consumers at PAGED_REGS: the producer's page arithmetic spills at the 24 registers that 240 leave it."""
    rows = seqlen_q if left < 0 else min(seqlen_q, left)
    wide = d in _WIDE_TILES and rows >= (WIDE_MIN_ROWS_CAUSAL if causal else WIDE_MIN_ROWS) and not softcap > 0
    tiles = _PAIR_TILES.get((d, dv)) or (_WIDE_TILES[d] if wide else _TILES[d])
    if paged and tiles[3] > PAGED_REGS:
        tiles = (*tiles[:3], PAGED_REGS, *tiles[4:])
    return tiles


def _two_heads_fit(group, wgs):
    """Whether an item can hold two query heads of one KV head, each consumer warpgroup one head: two consumer
    warpgroups and an even GQA group (the rule both `pack_heads` and the paired tails, `_paired_tail`, rest on)."""
    return wgs == 2 and group % 2 == 0


def pack_heads(group, seqlen_q, wgs, varlen=False):
    """Whether an item takes ROWS rows of two query heads of one KV head (each consumer warpgroup one head) instead
    of 2 * ROWS rows of one head: padded calls (a KV-cache chunk among them) with an even GQA group and two consumer
    warpgroups whose last row block would be at most half full (64 query rows, 192, ...): the same work in fewer
    rows. Packed sequences keep single heads."""
    return _two_heads_fit(group, wgs) and not varlen and 0 < seqlen_q % (2 * _ROWS) <= _ROWS


def _mask_bounds(causal, window):
    """A call's mask as `attention_forward_sm90` takes it (`causal`, or `window` in its place) as (left, lefts,
    right, causal, window): `left` an int (-1 where `lefts`, one left bound a sequence (batch,) int32, read by the
    kernel, is given), `causal` whether there is a right bound (0: causal), `window` whether any bound is narrower
    than causal."""
    left, right = window if window is not None else (-1, 0 if causal else -1)
    lefts = None
    if isinstance(left, torch.Tensor):
        lefts, left = left, -1
    return left, lefts, right, right >= 0, lefts is not None or left >= 0 or right > 0


def pairs_tails(d, dv, group, window, seqlen_q, softcap, paged):
    """Whether the items of a packed call pair two query heads' last row blocks of at most ROWS rows (`_paired_tail`,
    `_plan`'s PAIR_TAILS): an even GQA group on tiles of two consumer warpgroups (`choose_tiles`, as `_plan` picks
    them; `d`, `dv` the call's head dims, `window` its (left, right) as `attention_forward_sm90` takes it). Read by
    `forward.attention_forward` for calls over a KV cache (the short launch's rows)."""
    left, _, _, causal, narrower = _mask_bounds(False, window)
    dims = padded_dims(d, dv)
    return dims is not None and _two_heads_fit(group, choose_tiles(dims[0], causal or narrower, seqlen_q, left,
                                                                   softcap, paged, dims[1])[4])


def page_rows(page_size, block_n):
    """Rows of a paged cache's TMA box: the largest power of two that divides the page, at most a key tile (a page
    size is a multiple of 16)."""
    return min(page_size & -page_size, block_n)


def tma_store(dv, seqlen_q, wgs, varlen, offsets_64, same_dtype):
    """Whether a call's output leaves by TMA store (`TMA_STORE_DIMS`): padded calls (a packed batch's box would
    cross into the next sequence), two consumer warpgroups (the staging buffer's turns), offsets under 2^31 and an
    output of the inputs' dtype; the caller checks TMA's alignment rules (`tma_view`)."""
    return (dv in TMA_STORE_DIMS and seqlen_q < TMA_STORE_MAX_ROWS and wgs == 2 and not varlen and not offsets_64
            and same_dtype)


def transpose_in_kernel(d, wgs, varlen):
    """Whether an FP8 call's V can be transposed in the kernel (`_transposer`) rather than copied first
    (`transposed_v`): padded calls with two consumer warpgroups, head dims in TRANSPOSE_DIMS (the default:
    `transpose_by_default`). Packed sequences keep the copy, whose zeros past each sequence's keys stand in for the
    cleaning of V tiles."""
    return d in TRANSPOSE_DIMS and wgs == 2 and not varlen


def transpose_by_default(d, causal, seqlen_q, seqlen_k, group):
    """Whether a call that can transpose its FP8 V in the kernel (`transpose_in_kernel`) does so by default rather
    than copy it first: causal MHA calls of at most 1024 query and key rows at d = 64 or 128. Against the copy in
    one process (`probe_fp8_prefill.py`, 16k tokens, hidden 2048; history/probe_fp8_inkernel_default_partition_*):
    causal 1k 1.10x (d = 128) and 1.08x (d = 64), causal 2k 0.98x / 1.02x, unmasked 1k 0.99x / 1.02x; d = 128 from
    2k unmasked 0.78-0.91x, causal 4k / 16k 0.91x / 0.83x. The copy's time goes with V's size (29 us there, beside
    a 126 us kernel at d = 128, 1k causal), the transposer's with the kernel's (it slows the loop by ~12% there: its
    shared-memory traffic beside the products), so the copy weighs most in short causal calls and shrinks with the
    GQA group (one V a KV head): MHA only. d = 192 is not measured."""
    return causal and group == 1 and d in (64, 128) and max(seqlen_q, seqlen_k) <= 1024


def transposed_v(v, packed=None):
    """An FP8 V (b, sk, hk, dv) as the kernel reads it (`_pv`): a copy (b, hk, dv, sk rounded up to 16) and its TMA
    view (b, hk * dv, sk), whose keys past sk TMA fills with zeros. `packed` = (cu_seqlens_k, longest): v holds
    packed sequences (b = 1), and each one's keys start at a 16-byte-aligned column of the copy (a TMA box must
    start 16-byte aligned in its innermost dimension, here the keys), `transpose.packed_start`, zeros between them
    and for `transpose.TAIL` columns after the last one, as far as a key tile starting inside a sequence reads (so
    the kernel need not clean V tiles, whatever the buffer holds past cu_seqlens_k[-1])."""
    b, sk, hk, dv = v.shape
    if packed is None:
        pad = -(-sk // 16) * 16
        vt = torch.empty((b, hk, dv, pad), dtype=v.dtype, device=v.device)
        transpose_keys(v.view(torch.uint8), vt.view(torch.uint8))
        return vt, ([b, hk * dv, sk], [hk * dv * pad, pad, 1])
    cu, longest = packed
    pad = packed_start.fn(sk, cu.shape[0] - 1)      # at least the last sequence's end
    vt = torch.empty((1, hk, dv, pad), dtype=v.dtype, device=v.device)       # no memset: see `transpose.TAIL`
    transpose_keys(v.view(torch.uint8), vt.view(torch.uint8), (cu, longest))
    return vt, ([1, hk * dv, pad], [hk * dv * pad, pad, 1])


def launch_args(q, k, v, out, lse, *, causal, softmax_scale, views=None, pingpong=None, tiles=None, varlen=None,
                window=None, sinks=None, softcap=0.0, cache=None, alibi_slopes=None, pack=None, descales=None,
                transpose=None, short_rows=0):
    """(grid, arguments, meta-parameters) of one launch; `benchmarks/profile_host.py` times the launch alone."""
    plan = _plan(q, k, v, out, lse, causal=causal, softmax_scale=softmax_scale, views=views, pingpong=pingpong,
                 tiles=tiles, varlen=varlen, window=window, sinks=sinks, softcap=softcap, cache=cache,
                 alibi_slopes=alibi_slopes, pack=pack, descales=descales, transpose=transpose, short_rows=short_rows)
    return plan.grid, plan.bind(q, k, v, out, lse, varlen, window, sinks, cache, alibi_slopes, descales), plan.meta


# A packed call's scalar arguments that follow its token count and longest lengths (`_Plan.with_lengths`): seqlen_q
# and seqlen_k (the first two of `_Plan.scalars`), and head_chunk and stride_lh (`attn_fwd_sm90_kernel`) at these
# indices.
HEAD_CHUNK, STRIDE_LH = 5, 13


class _Plan:
    """What a launch's arguments are made of, given its tensors' shapes, strides, dtypes and 16-byte alignment and
    its options (`_plan`): the grid, the meta-parameters, the TMA boxes of q, k, v and the output, and the scalar
    arguments. `bind` makes the arguments of one call from its tensors. Packed sequences' plans also keep
    `packed` = (items a row block, rows an item, programs at most, the causal chunk's bytes a key, query heads an
    item's chunk counts, KV heads), from which `with_lengths` makes the plan of a call of other token counts and
    longest lengths."""
    __slots__ = ("grid", "meta", "boxes", "copy_v", "counter", "fp8", "scalars", "fixed", "packed")

    def __init__(self, grid, meta, boxes, copy_v, counter, fp8, scalars, packed, fixed=None):
        self.grid, self.meta, self.boxes, self.copy_v = grid, meta, boxes, copy_v
        self.counter, self.fp8, self.scalars, self.packed = counter, fp8, scalars, packed
        self.fixed = fixed or fixed_classes(scalars, meta)      # `bind` ends with the scalars

    def with_lengths(self, q, k, v, lse, varlen, cache=None):
        """The plan of a packed call whose key without lengths (`_plan_key`) is this plan's: TMA views over its
        tokens, its grid, and the scalars that follow its lengths."""
        _, _, seqlen_q, seqlen_k = varlen
        items, rows, programs, key_bytes, heads, heads_k = self.packed
        q, k, v = _as_batch(q, k, v, varlen, cache)
        seqlen_k = _key_bound(seqlen_k, cache, k)
        bq, bk, bv, bo = self.boxes
        padded = len(bq[1]) == 4                    # a padded call's boxes are 4-D (`tma_view`)
        boxes = ((tma_view(q, padded), *bq[1:]), (tma_view(k, padded), *bk[1:]),
                 bv if self.copy_v else (tma_view(v, padded), *bv[1:]), bo)
        moved = (seqlen_q, seqlen_k, _chunk(key_bytes, heads, seqlen_k, heads_k), lse.stride(0))
        classes, meta_items = self.fixed
        return _Plan((min(items * cdiv(seqlen_q, rows), programs),), self.meta, boxes, self.copy_v, self.counter,
                     self.fp8, _with_moved(self.scalars, moved), self.packed,
                     (_with_moved(classes, tuple(map(_arg_class, moved))), meta_items))

    def bind(self, q, k, v, out, lse, varlen, window, sinks, cache, alibi_slopes, descales):
        """The kernel's arguments for these tensors (those of a call with the plan's key, `_plan_key`): TMA
        descriptors over them in the plan's boxes ((view, box, layout) each, or None), the tensors, the causal
        schedule's counter, the scalars."""
        cu_q = cu_k = lefts = None
        seqlens, table, starts = cache or (None, None, None)
        q, k, v = _as_batch(q, k, v, varlen, cache)
        if varlen is not None:
            cu_q, cu_k = varlen[:2]
        if window is not None and isinstance(window[0], torch.Tensor):
            lefts = window[0]
        if starts is not None:             # a cache's first key rows take packed sequences' place (`_work_item`)
            cu_k = starts
        bq, bk, bv, bo = self.boxes
        if self.copy_v:                    # an FP8 V transposed into a copy first (`transposed_v`)
            vt, view = transposed_v(v, None if varlen is None else (cu_k, varlen[3]))
            v_desc = descriptor(vt, view, bv[1])
        else:
            v_desc = descriptor_in(v, bv)
        scales = (None,) * 3
        if self.fp8 and descales is not None:
            scales = tuple(None if t is None else t.contiguous() for t in descales)
        return (descriptor_in(q, bq), descriptor_in(k, bk), v_desc, None if bo is None else descriptor_in(out, bo),
                out, lse, zeroed_counter(q.device, 2) if self.counter else None, cu_q, cu_k, sinks, lefts, seqlens,
                table, alibi_slopes, *scales, *self.scalars)


def _with_moved(values, moved):
    """A plan's scalars, or their argument classes, with the four of a packed call that follow its lengths (`moved`
    = seqlen_q, seqlen_k, head_chunk, stride_lh) in their places."""
    seqlen_q, seqlen_k, chunk, stride_lh = moved
    return (seqlen_q, seqlen_k, *values[2:HEAD_CHUNK], chunk, *values[HEAD_CHUNK + 1:STRIDE_LH], stride_lh,
            *values[STRIDE_LH + 1:])


def _chunk(key_bytes, heads, seqlen_k, heads_k=None):
    """Query heads (items' heads, `heads` a KV head) whose causal work items share one K/V in L2 at a time: as many
    KV heads as fit in L2_BUDGET at `key_bytes` a key; 1 without a causal mask (`key_bytes` 0). Packed sequences
    (`heads_k` given): a divisor of heads_k KV heads, so that a chunk never spans two sequences and each sequence's
    items are one run of the work order (`_past_empty` skips a left-out sequence's whole run)."""
    if not key_bytes:
        return 1
    kv = max(1, L2_BUDGET // (max(seqlen_k, 1) * key_bytes))
    if heads_k is not None:
        kv = max(n for n in range(1, min(kv, heads_k) + 1) if heads_k % n == 0)
    return kv * heads


def _plan(q, k, v, out, lse, *, causal, softmax_scale, views=None, pingpong=None, tiles=None, varlen=None,
          window=None, sinks=None, softcap=0.0, cache=None, alibi_slopes=None, pack=None, descales=None,
          transpose=None, short_rows=0):
    """`_Plan` of a launch (`launch_args`' arguments, and `attention_forward_sm90`'s `short_rows`)."""
    left, lefts, right, causal, window = _mask_bounds(causal, window)
    masked = causal or window
    table = None if cache is None else cache[1]
    if varlen is None:
        batch, seqlen_q = q.shape[:2]
        seqlen_k = _key_bound(k.shape[1], cache, k)
        o_strides, lse_strides = out.stride()[:3], lse.stride()
    else:                         # one packed batch for TMA; each sequence's rows from cu_seqlens (`_work_item`)
        cu_q, _, seqlen_q, seqlen_k = varlen
        batch = cu_q.shape[0] - 1
        q, k, v = _as_batch(q, k, v, varlen, cache)
        seqlen_k = _key_bound(seqlen_k, cache, k)
        o_strides, lse_strides = (0, *out.stride()[:2]), (0, *lse.stride())
    heads_q, d = q.shape[2:]
    heads_k, dv = k.shape[2], v.shape[3]
    dv_store = dv                 # the output's columns; d and dv from here on are the kernel's (`padded_dims`)
    pair = padded_dims(d, dv)
    if pair is None:
        raise ValueError(f"head dims: no tiles for {(d, dv)} (`padded_dims`)")
    padded = pair != (d, dv)
    d, dv = pair
    block_n, stages, q_bufs, regs, wgs = tiles or choose_tiles(d, masked, seqlen_q, left, softcap, table is not None,
                                                               dv)
    if pingpong is None:
        # tune_prefill_sm90_h100.json: +0.5-7% at d >= 128, mostly a loss at d = 64. Five later runs at d = 128
        # (history/tune_prefill_tmastore_h100_*.json, the pointer-store rows) had it 4-7% behind at 16k without
        # a mask and level with it at 4k: on for d = 256 and causal d = 128 only. Causal d = 128 at 1k was 1.5%
        # faster without it (every set of the thirty-ninth session's probes, every pair average of
        # history/ab_pingpong_d128_h100_6fcb181_{a,b}.json), level at 4k and 16k: on from PINGPONG_MIN_ROWS_D128.
        pingpong = dv == 256 or (d == 128 and causal and seqlen_q >= PINGPONG_MIN_ROWS_D128)
    pingpong = pingpong and wgs == 2              # the hand-off is between two warpgroups

    def box(t, view, rows, width):
        return sm90_box(t, view, [1, rows, 1, width] if padded else [1, rows, width])

    group = heads_q // heads_k
    if pack is None:
        pack = pack_heads(group, seqlen_q, wgs, varlen is not None)
    elif pack and not _two_heads_fit(group, wgs):
        raise ValueError(f"pack: needs two consumer warpgroups and an even GQA group, got {wgs} and {group}")
    heads = 2 if pack else 1      # query heads an item
    vq, vk, vv = views or tuple(tma_view(t, padded) for t in (q, k, v))
    packed = (batch * heads_q // heads, _ROWS if pack else wgs * _ROWS, num_sms(q.device),
              (d + dv) * k.element_size() if causal else 0, group // heads, heads_k)     # `_Plan.packed`
    grid = (min(packed[0] * cdiv(seqlen_q, packed[1]), packed[2]),)
    # Causal or windowed items, and packed sequences' items, differ in length: handed out by an atomic counter
    # (`launch.zeroed_counter`). Unmasked padded items are all alike, so a fixed round-robin balances them as well,
    # with no counter.
    counter = masked or varlen is not None or cache is not None
    part = _QK_PART.get(d, d)
    kv_rows = block_n if table is None else page_rows(k.shape[1], block_n)
    wide_offsets = offsets_64(out, lse)
    stored = tma_store(dv, seqlen_q, wgs, varlen is not None, wide_offsets, out.dtype == q.dtype)
    vo = tma_view(out, padded) if stored else None
    fp8 = q.dtype == torch.float8_e4m3fn
    if transpose is None:
        transpose = (fp8 and transpose_in_kernel(d, wgs, varlen is not None)
                     and transpose_by_default(d, causal, seqlen_q, seqlen_k, group))
    elif transpose and not (fp8 and transpose_in_kernel(d, wgs, varlen is not None)):
        raise ValueError(f"transpose: FP8 padded calls with two consumer warpgroups and head_dim in "
                         f"{TRANSPOSE_DIMS} only")
    if transpose and tiles is None:
        regs = min(regs, TRANSPOSE_REGS)
    if fp8:
        if cache is not None:
            raise ValueError("FP8 inputs: calls without a KV cache only")
        if padded:
            raise ValueError(f"FP8 inputs: head dims in {sorted(FP8_HEAD_DIMS)} only, got {(q.shape[3], dv_store)}")
        if varlen is not None and block_n > TAIL:       # the zeros past the last sequence (`transposed_v`)
            raise ValueError(f"tiles: FP8 packed sequences take key tiles of at most {TAIL}, got {block_n}")
    copy_v = fp8 and not transpose
    if copy_v:                    # the copy's view and box are made with it, in `_Plan.bind`
        bv, stride_vh = (None, [1, dv, block_n]), dv
    else:
        bv, stride_vh = box(v, vv, kv_rows, dv), v.stride(2)
    boxes = (box(q, vq, _ROWS, part), box(k, vk, kv_rows, part), bv, None if vo is None else box(out, vo, _ROWS, dv))
    scalars = (seqlen_q, seqlen_k, heads_q, group, packed[0],
               _chunk(*packed[3:5], seqlen_k, None if varlen is None else heads_k),
               q.stride(2), k.stride(2), stride_vh, *o_strides, *lse_strides,
               softcap * LOG2E if softcap > 0 else softmax_scale * LOG2E, softmax_scale / softcap if softcap > 0 else 1.0,
               min(left, UNBOUNDED) if left >= 0 else UNBOUNDED, min(max(right, 0), UNBOUNDED),
               table.stride(0) if table is not None else 0, k.shape[1] if table is not None else 0)
    meta = dict(BLOCK_N=block_n, HEAD_D=d, HEAD_DV=dv, DV_STORE=dv_store, STAGES=stages, Q_BUFS=q_bufs, CAUSAL=causal,
                PINGPONG=pingpong, CONSUMER_REGS=regs, WGS=wgs, OFFSETS_64=wide_offsets,
                VARLEN=varlen is not None, WINDOW=window, HAS_SINKS=sinks is not None, SOFTCAP=softcap > 0,
                PAIR_TAILS=varlen is not None and heads == 1 and _two_heads_fit(group, wgs),
                KV_CACHE=cache is not None, PAGE_ROWS=kv_rows if table is not None else 0,
                HAS_ALIBI=alibi_slopes is not None, HEADS=heads, TMA_STORE=vo is not None, TRANSPOSE=transpose,
                num_warps=4)
    if short_rows:
        meta["MIN_ROWS"] = short_rows
    return _Plan(grid, meta, boxes, copy_v, counter, fp8, scalars, None if varlen is None else packed)
