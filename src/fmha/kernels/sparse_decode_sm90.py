"""Hopper (sm_90) token-sparse decode over DeepSeek's FP8 caches (V3.2's and V4's "model1"), FlashMLA's structure: a
loading warpgroup that dequantises, a warpgroup that scores, and one that only multiplies P by the right half of V.

`mla_decode.mla_decode_forward` sends it the FP8 sparse decode calls that `supported` accepts (one query token a
"batch", planned whole, heads in 64-row blocks, with or without V4's second source; the rest stay with
`mla_decode_sm90`, whose two consumer warpgroups each dequantise the tile they score). One program owns 64 query rows
(heads) of one query token and walks its valid keys (the first min(topk, topk_length) entries of its index row, then
those of its second source's) in tiles of 64:
- the loading warpgroup (the default partition) reads each key's row (V3.2: 656 bytes; model1: a 576-byte value row
  and 8 scale bytes elsewhere in its page) with 16-byte global loads, a tile ahead: as it converts a tile's chunk, it
  loads the same chunk of the next tile into the registers just freed. It turns the e4m3 values into bf16 with their
  scales (V3.2 fp32 `_E4M3_SCALED_TO_BF16`, model1 UE8M0 by bits) and stores the tile into one of two slots (72 / 64
  KB) in the tensor cores' layout, then arrives on the slot's barrier;
- warpgroup 0 computes every tile's scores Q·Kᵀ (576 / 512 columns), the online softmax, and O_L += P·V_L (value
  columns 0-255) with P from registers; it publishes P (bf16) and the rows' rescale factors in shared memory for
- warpgroup 1, which only rescales O_R and adds P·V_R (columns 256-511) from that shared P. Needing no score tile and
  no softmax, it runs at WG1_REGS registers, and what it leaves goes to the loader.
Both release a slot once their product on it is done (its empty barrier counts two). With heads in pairs of 64-row
blocks (h_q = 128) a token's two programs run as a 2-CTA cluster (`CLUSTER`, FlashMLA's scheme): each loader reads
and converts half of every tile's rows and copies them into the other CTA's slot as well (V3.2 +15%, V4 +11%;
thirty-second session). Outputs leave through the Q buffer by TMA store. Against `mla_decode_sm90` on `fmha bench
sparse`'s rows: V3.2 +12%, V4 +23-31% before the clusters (NOTES.md, thirtieth and thirty-first sessions).
"""
from __future__ import annotations

import os

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_init, warpgroup_mma_wait)

from . import mla_decode_sm90
from .mla_decode_sm90 import (BLOCK_N, DT, HALF, LN2, LOG2E, MODEL1, MODEL1_NOPE, O_LAYOUT, P_LAYOUT, ROWS,
                              S_LAYOUT, STAGES, V32, _E4M3_TO_BF16, _gather_bases, _signal, ue8m0_multipliers)
from .cluster_sm90 import THREADS, cluster_free, cluster_sync
from .launch import launch
from .sm90 import descriptor, launch_pairs

# The loader's view of a tile: its bytes as 32-bit words (carried from one loop iteration to the next as 32-bit
# registers; bytes would take one register each), 16 bytes a load, 8 rows a warp (4 threads a row of 64 bytes).
LD = gl.constexpr(gl.BlockedLayout([1, 4], [8, 4], [4, 1], [1, 0]))
LD_ROWS = gl.constexpr(gl.SliceLayout(1, LD.value))
WG0_REGS = 216
WG1_REGS = 168


@gluon.jit
def _source(sources, j, EXTRA: gl.constexpr):
    """(source, its first key) of the token's tile j: the main source's first n_main tiles, then (EXTRA) the second
    source's. A source is (cache, scale rows (model1), index row, valid length, cache keys, page size, page stride,
    slot stride), picked field by field (no branch), so the code that reads a source exists once."""
    main, extra, n_main = sources
    if EXTRA:
        x = j >= n_main
        src = (gl.where(x, extra[0], main[0]), gl.where(x, extra[1], main[1]), gl.where(x, extra[2], main[2]),
               gl.where(x, extra[3], main[3]), gl.where(x, extra[4], main[4]), gl.where(x, extra[5], main[5]),
               gl.where(x, extra[6], main[6]), gl.where(x, extra[7], main[7]))
        return src, gl.where(x, j - n_main, j) * BLOCK_N
    return main, j * BLOCK_N


@gluon.jit
def _tile_index(sources, j, layout: gl.constexpr, EXTRA: gl.constexpr, N: gl.constexpr = BLOCK_N, first=0):
    """The flat positions of keys first .. first + N - 1 of the token's tile j (-1 past its source's valid length),
    in `layout`."""
    src, n = _source(sources, j, EXTRA)
    k = n + first + gl.arange(0, N, layout=layout)
    return gl.load(src[2] + k, mask=k < src[3], other=-1)


@gluon.jit
def _tile_rows(sources, j, idx, FP8: gl.constexpr, EXTRA: gl.constexpr, SHIFTED: gl.constexpr):
    """(value row addresses, scale row addresses, exists) of the keys of tile j at flat positions idx (`_tile_index`):
    position p is slot p % page_size of page p // page_size (SHIFTED: every source's page size is a power of two,
    passed as its log2); entries that are negative or past the cache do not exist (slot 0 of page 0 is named
    instead, and never read). V3.2's scales sit in the value row (byte 512), model1's in the page's scale rows
    (8 bytes a slot)."""
    src, n = _source(sources, j, EXTRA)
    CACHE, SCALES, idx_row, limit, bound, page_size, stride_page, stride_slot = src
    ok = (idx >= 0) & (idx < bound)
    token = gl.where(ok, idx, 0)
    if SHIFTED:
        page = token >> page_size
        slot = (token & ((1 << page_size) - 1)).to(gl.int64)
    else:
        page = (token.to(gl.uint32) // page_size.to(gl.uint32)).to(gl.int32)       # page_size 1: folded away
        slot = (token - page * page_size).to(gl.int64)
    rows = CACHE + page.to(gl.int64) * stride_page + slot * stride_slot
    if FP8 == MODEL1:
        scales = SCALES + page.to(gl.int64) * stride_page + slot * 8
    else:
        scales = rows + 512
    return rows, scales, ok


@gluon.jit
def _chunk(rows, ok, G: gl.constexpr):
    """64-column chunk G of the tile's e4m3 bytes, (BLOCK_N, 16) words."""
    cols = gl.arange(0, 16, layout=gl.SliceLayout(0, LD))
    p = (rows + G * 64).to(gl.pointer_type(gl.int32))
    return gl.load(p[:, None] + cols[None, :], mask=ok[:, None], other=0)


@gluon.jit
def _scales_rope(rows, scales, ok, FP8: gl.constexpr):
    """The tile's scales (V3.2 four fp32, one per 128 columns; model1 eight UE8M0 bytes as two words, one per 64
    columns) and RoPE values ((BLOCK_N, 32) words of bf16 pairs)."""
    cols = gl.arange(0, 32, layout=gl.SliceLayout(0, LD))
    if FP8 == MODEL1:
        sp = scales.to(gl.pointer_type(gl.int32))
        sc = (gl.load(sp, mask=ok, other=0), gl.load(sp + 1, mask=ok, other=0))
        rp = (rows + MODEL1_NOPE).to(gl.pointer_type(gl.int32))
    else:
        sp = scales.to(gl.pointer_type(gl.float32))
        sc = (gl.load(sp, mask=ok, other=0.0), gl.load(sp + 1, mask=ok, other=0.0),
              gl.load(sp + 2, mask=ok, other=0.0), gl.load(sp + 3, mask=ok, other=0.0))
        rp = (rows + 528).to(gl.pointer_type(gl.int32))
    return sc, gl.load(rp[:, None] + cols[None, :], mask=ok[:, None], other=0)


# Four e4m3 bytes ($2) times an fp32 scale ($3) into four bf16 ($0, $1): exact widening to f16 and f32, one fp32
# multiply and one rounding to bf16 each, as `x.to(float32) * scale` then `.to(bfloat16)` computes, without the byte
# shuffles Triton's own conversion makes.
_E4M3_SCALED_TO_BF16 = gl.constexpr(
    "{ .reg .b16 lo, hi, h0, h1, h2, h3;\n"
    ".reg .b32 p, q;\n"
    ".reg .f32 f0, f1, f2, f3;\n"
    "mov.b32 {lo, hi}, $2;\n"
    "cvt.rn.f16x2.e4m3x2 p, lo;\n"
    "cvt.rn.f16x2.e4m3x2 q, hi;\n"
    "mov.b32 {h0, h1}, p;\n"
    "mov.b32 {h2, h3}, q;\n"
    "cvt.f32.f16 f0, h0;\n"
    "cvt.f32.f16 f1, h1;\n"
    "cvt.f32.f16 f2, h2;\n"
    "cvt.f32.f16 f3, h3;\n"
    "mul.f32 f0, f0, $3;\n"
    "mul.f32 f1, f1, $3;\n"
    "mul.f32 f2, f2, $3;\n"
    "mul.f32 f3, f3, $3;\n"
    "cvt.rn.bf16x2.f32 $0, f1, f0;\n"
    "cvt.rn.bf16x2.f32 $1, f3, f2; }")


# `mla_decode_sm90._E4M3_TO_BF16` with its operands one word each (the word of bytes, then the two multipliers).
_E4M3_TO_BF16_WORDS = gl.constexpr(_E4M3_TO_BF16.value.replace("$7", "$4"))


@gluon.jit
def _put(x, sc, G: gl.constexpr, dst, FP8: gl.constexpr):
    """Chunk G of the tile (x, `_chunk`'s words), dequantised, into dst ((BLOCK_N, 32) words of a value slot):
    V3.2 with fp32 scale G // 2 (`_E4M3_SCALED_TO_BF16`), model1 with UE8M0 byte G (`_E4M3_TO_BF16_WORDS`). A
    word of four e4m3 values becomes two words of bf16 pairs, joined in column order."""
    if FP8 == MODEL1:
        m1, m2 = ue8m0_multipliers((sc[G // 4] >> (8 * (G % 4))) & 255)
        lo, hi = gl.inline_asm_elementwise(_E4M3_TO_BF16_WORDS, "=r,=r,r,r,r",
                                           [x, m1[:, None] + gl.zeros_like(x), m2[:, None] + gl.zeros_like(x)],
                                           (gl.int32, gl.int32), True, 1)
    else:
        bits = sc[G // 2].to(gl.int32, bitcast=True)[:, None] + gl.zeros_like(x)
        lo, hi = gl.inline_asm_elementwise(_E4M3_SCALED_TO_BF16, "=r,=r,r,r", [x, bits], (gl.int32, gl.int32), True,
                                           1)
    dst.store(gl.join(lo, hi).reshape([x.shape[0], 32]))


@gluon.jit
def _put_and_fetch(x, sc, G: gl.constexpr, k_words, slot, rank, rows, ok, FP8: gl.constexpr):
    """Store chunk G of this tile, then load chunk G of the next (at rows) into the registers it leaves."""
    _put(x, sc, G, _piece(k_words, slot, G, rank), FP8)
    return _chunk(rows, ok, G)


@gluon.jit
def _piece(k_words, slot, G: gl.constexpr, rank):
    """The words of the value slots (`_loader`'s k_words) that hold this CTA's rows of 64-column chunk G of ring slot
    `slot`: a (64, 256) half is four chunks of 64 rows, 8 KB each in the 128-byte swizzle, a chunk's rows in order.
    k_words is (2 STAGES, 64, 128) when this CTA stores every row, (2 STAGES x 4 x 2, 32, 32) when it stores rows
    32 rank .. 32 rank + 31 (CLUSTER)."""
    if k_words.shape[1] == BLOCK_N:
        piece = k_words.index(2 * slot + G // 4).slice((G % 4) * 32, 32, dim=1)
    else:
        piece = k_words.index(((2 * slot + G // 4) * 4 + G % 4) * 2 + rank)
    return piece


# 2-CTA clusters (CLUSTER, heads in pairs of 64-row blocks): the two programs of a query token read the same keys, so
# each loads and converts half of every tile's rows (32 rank .. 32 rank + 31) and copies them into the other CTA's
# slot too: FlashMLA's h_q = 128 scheme, in inline PTX (`cluster_sm90`) addressing the allocations at the constexpr
# SMEM = (k_lat, k_rope, k_ready, peer_free) offsets (`sm90.launch_pairs`). A slot is written in both CTAs by both
# loaders: before writing it, each loader waits until its own consumers are done with it (k_empty) and so are the
# other CTA's, which that CTA's loader reports on this one's peer_free (`cluster_free`).
PIECE_BYTES = gl.constexpr(BLOCK_N // 2 * 64 * 2)       # 32 rows of a 64-column bf16 chunk, contiguous: 4 KB
_PEER_COPY = (                      # if $1: copy at shared offset $2 into the same place in CTA $4, on its barrier $3
    "{ .reg .pred p; .reg .b32 s, d, b;\n"
    "setp.ne.u32 p, $1, 0;\n"
    "SYNC"
    "mov.u32 s, global_smem;\n"
    "add.u32 b, s, $3;\n"
    "add.u32 s, s, $2;\n"
    "mapa.shared::cluster.u32 d, s, $4;\n"
    "mapa.shared::cluster.u32 b, b, $4;\n"
    "@p cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes [d], [s], BYTES, [b];\n"
    "mov.u32 $0, 0; }")
# The byte count an immediate; a warp's own 1 KB after a warp barrier, a whole 4 KB piece after the loader's.
_PEER_COPY_1K = gl.constexpr(_PEER_COPY.replace("SYNC", "bar.warp.sync -1;\n").replace("BYTES", "1024"))
_PEER_COPY_4K = gl.constexpr(_PEER_COPY.replace("SYNC", "").replace("BYTES", "4096"))


@gluon.jit
def _send(SMEM: gl.constexpr, slot, rank, FP8: gl.constexpr):
    """This CTA's 32 rows of the tile in `slot` (stored and fenced for the async proxy by every loader thread),
    copied into the other CTA's slot, completing on its k_ready: 4 KB pieces (value chunk g at 8 KB x (8 slot + g),
    `_piece`; V3.2's RoPE chunk), by the warps' lane 0s. V3.2: warp w copies its own 8 rows (1 KB) of each of the 9
    pieces; model1: warp w copies pieces w and w + 4 whole. (The other cut measured 353 / 354 TFLOP/s against 400 /
    396 for V3.2, 327 / 332 against 410 / 413 for model1 at h_q = 128: NOTES.md, thirty-second session.)"""
    tid = gl.arange(0, 128, layout=THREADS)
    lead = tid % 32 == 0
    warp = tid // 32
    bar = SMEM[2] + slot * 8 + tid * 0
    peer = 1 - rank + tid * 0
    own = rank * PIECE_BYTES
    if FP8 == V32:
        for g in gl.static_range(9):
            if g < 8:
                at = SMEM[0] + ((2 * slot + g // 4) * 4 + g % 4) * (2 * PIECE_BYTES) + own
            else:                     # the RoPE chunk
                at = SMEM[1] + slot * (2 * PIECE_BYTES) + own
            gl.inline_asm_elementwise(_PEER_COPY_1K, "=r,r,r,r,r",
                                      [lead.to(gl.int32), at + warp * (PIECE_BYTES // 4), bar, peer], gl.int32, False,
                                      1)
        gl.thread_barrier()           # the arrive that follows after every warp's copies are out
    else:
        for i in gl.static_range(2):
            g = warp + 4 * i
            at = SMEM[0] + (2 * slot + g // 4) * (8 * PIECE_BYTES) + (g % 4) * (2 * PIECE_BYTES) + own
            gl.inline_asm_elementwise(_PEER_COPY_4K, "=r,r,r,r,r", [lead.to(gl.int32), at, bar, peer], gl.int32, False,
                                      1)


@gluon.jit
def _loader(q_lat_desc, q_rope_desc, q_lat, q_rope, k_lat, k_rope, q_ready, k_ready, k_empty, peer_free, sources,
            n_tiles, tok, row0, FP8: gl.constexpr, EXTRA: gl.constexpr, SHIFTED: gl.constexpr, CLUSTER: gl.constexpr,
            SMEM: gl.constexpr):
    # CLUSTER: this CTA loads, converts and stores rows 32 rank .. 32 rank + 31 of every tile, and copies them into
    # the other CTA's slot as well.
    H: gl.constexpr = 2 if CLUSTER else 1
    N: gl.constexpr = BLOCK_N // H
    rank = 0
    if CLUSTER:
        rank = gl.program_id(0) % 2
        cluster_sync()
    if FP8 == V32:
        mbarrier.expect(q_ready, 2 * q_lat_desc.block_type.nbytes + q_rope_desc.block_type.nbytes)
    else:
        mbarrier.expect(q_ready, 2 * q_lat_desc.block_type.nbytes)
    for h in gl.static_range(2):
        tma.async_copy_global_to_shared(q_lat_desc, [tok, row0, h * HALF], q_ready,
                                        q_lat.index(h).reshape(q_lat_desc.block_type.shape))
    if FP8 == V32:
        tma.async_copy_global_to_shared(q_rope_desc, [tok, row0, 0], q_ready,
                                        q_rope.reshape(q_rope_desc.block_type.shape))
    # The slots as (N, 32) pieces of 32-bit words (the same bytes and swizzle): the loader stores bf16 pairs.
    if CLUSTER:
        words: gl.constexpr = gl.NVMMASharedLayout.get_default_for([N, 32], gl.int32)
        k_words = k_lat._reinterpret(gl.int32, [2 * STAGES * 4 * 2, N, 32], words)
    else:
        words: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, HALF // 2], gl.int32)
        k_words = k_lat._reinterpret(gl.int32, [2 * STAGES, BLOCK_N, HALF // 2], words)
    r_words = k_rope._reinterpret(gl.int32, [STAGES * H, N, DT // 2], words)
    CHUNKS: gl.constexpr = 7 if FP8 == MODEL1 else 8
    rows, scales, ok = _tile_rows(sources, 0, _tile_index(sources, 0, LD_ROWS, EXTRA, N, rank * N), FP8, EXTRA,
                                  SHIFTED)
    xs = ()
    for g in gl.static_range(CHUNKS):
        xs = xs + (_chunk(rows, ok, g),)
    sc, rope = _scales_rope(rows, scales, ok, FP8)
    idx = _tile_index(sources, 1, LD_ROWS, EXTRA, N, rank * N)
    for j in range(n_tiles):
        slot = j % STAGES
        # Tile j's bytes arrived during tile j - 1's conversion; tile j + 1's addresses come from its index row, read
        # a tile ago, and tile j + 2's index row goes out now. As each chunk of tile j is converted and stored, the
        # same chunk of tile j + 1 is loaded into the registers it leaves: a tile's loads are in flight for a whole
        # tile's time at no extra registers (V3.2 +3%; an L2 prefetch of tile j + 2 on top lost 3-13%, loads
        # that skip L1 or ask L2 for 256-byte blocks 10-30%: NOTES.md, thirty-first session).
        rows, scales, ok = _tile_rows(sources, j + 1, idx, FP8, EXTRA, SHIFTED)
        idx = _tile_index(sources, j + 2, LD_ROWS, EXTRA, N, rank * N)
        if CLUSTER:                   # the slot is free here: tell the other CTA, then wait until it is free there
            phase = ((j // STAGES) & 1) ^ 1
            mbarrier.wait(k_empty.index(slot), phase)
            cluster_free(SMEM[3], peer_free, slot, rank, j >= STAGES, phase)
        else:
            mbarrier.wait(k_empty.index(slot), ((j // STAGES) & 1) ^ 1)
        if FP8 == MODEL1:             # the RoPE values close the value row: columns 448-511, half R's last 64
            _piece(k_words, slot, 7, rank).store(rope)
        else:
            r_words.index(slot * H + rank).store(rope)
        nxt = ()
        for g in gl.static_range(CHUNKS):
            nxt = nxt + (_put_and_fetch(xs[g], sc, g, k_words, slot, rank, rows, ok, FP8),)
        xs = nxt
        sc, rope = _scales_rope(rows, scales, ok, FP8)
        fence_async_shared()
        if CLUSTER:                   # the other CTA's 32 rows, copied to this one, complete the barrier
            gl.thread_barrier()
            _send(SMEM, slot, rank, FP8)
            mbarrier.expect(k_ready.index(slot), (9 if FP8 == V32 else 8) * PIECE_BYTES)
        else:
            _signal(k_ready.index(slot))
    if CLUSTER:
        cluster_sync()


@gluon.jit
def _scorer(q_lat, q_rope, k_lat, k_rope, p_smem, rows_smem, q_ready, k_ready, k_empty, p_ready, p_free, done,
            o_desc, sources, lse_out, SINKS, n_tiles, tok, row0, qk_scale_log2, FP8: gl.constexpr,
            EXTRA: gl.constexpr, HAS_SINKS: gl.constexpr, CLUSTER: gl.constexpr):
    """Warpgroup 0: every tile's scores and softmax, O_L."""
    if CLUSTER:
        cluster_sync()
    s_layout: gl.constexpr = S_LAYOUT
    o_layout: gl.constexpr = O_LAYOUT
    p_layout: gl.constexpr = P_LAYOUT
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    col_s: gl.constexpr = gl.SliceLayout(0, s_layout)
    dtype: gl.constexpr = q_lat.dtype
    acc = gl.zeros([ROWS, HALF], gl.float32, o_layout)
    l_i = gl.zeros([ROWS], gl.float32, row_s)
    m_i = gl.full([ROWS], float("-inf"), gl.float32, row_s)
    mbarrier.wait(q_ready, 0)
    for j in range(n_tiles):
        slot = j % STAGES
        idx = _tile_index(sources, j, col_s, EXTRA)
        key_ok = (idx >= 0) & (idx < _source(sources, j, EXTRA)[0][4])
        mbarrier.wait(k_ready.index(slot), (j // STAGES) & 1)
        s = warpgroup_mma_init(gl.zeros([ROWS, BLOCK_N], gl.float32, s_layout))
        s = warpgroup_mma(q_lat.index(0), k_lat.index(2 * slot).permute((1, 0)), s, is_async=True)
        s = warpgroup_mma(q_lat.index(1), k_lat.index(2 * slot + 1).permute((1, 0)), s, is_async=True)
        if FP8 == V32:
            s = warpgroup_mma(q_rope, k_rope.index(slot).permute((1, 0)), s, is_async=True)
        s = warpgroup_mma_wait(0, deps=(s,))
        s = gl.where(key_ok[None, :], s * qk_scale_log2, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(s, 1))
        m_shift = gl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = gl.exp2(m_i - m_shift)
        p = gl.exp2(s - m_shift[:, None])
        l_i = l_i * alpha + gl.sum(p, 1)
        m_i = m_new
        pb = p.to(dtype)
        if j > 0:
            mbarrier.wait(p_free, (j - 1) & 1)
        p_smem.store(pb)
        rows_smem.index(0).store(alpha)
        fence_async_shared()
        _signal(p_ready)
        acc = acc * gl.convert_layout(alpha, row_o)[:, None]
        o_tok = warpgroup_mma(gl.convert_layout(pb, p_layout), k_lat.index(2 * slot), acc, is_async=True)
        acc = warpgroup_mma_wait(0, deps=(o_tok,))
        _signal(k_empty.index(slot))
    empty = l_i == 0.0
    lse = gl.where(empty, float("inf"), (m_i + gl.log2(gl.where(empty, 1.0, l_i))) * LN2)
    inv = gl.where(empty, 0.0, 1.0 / gl.where(empty, 1.0, l_i))
    heads = row0 + gl.arange(0, ROWS, layout=row_s)
    if HAS_SINKS:
        sink = gl.load(SINKS + heads)
        inv = inv * gl.where(empty, 1.0, 1.0 / (1.0 + gl.exp2((sink - gl.where(empty, 0.0, lse)) * LOG2E)))
    rows_smem.index(1).store(inv)
    _signal(done)
    out = acc * gl.convert_layout(inv, row_o)[:, None]
    q_lat.index(0).store(out.to(dtype))
    fence_async_shared()
    gl.thread_barrier()
    tma.async_copy_shared_to_global(o_desc, [tok, row0, 0], q_lat.index(0).reshape(o_desc.block_type.shape))
    LSE, h_q, seq_tokens, stride_lb, stride_lh, stride_ls = lse_out
    gl.store(LSE + (tok // seq_tokens).to(gl.int64) * stride_lb + heads * stride_lh + (tok % seq_tokens) * stride_ls,
             lse)
    tma.store_wait(0)
    if CLUSTER:
        cluster_sync()


@gluon.jit
def _right(q_lat, k_lat, p_smem, rows_smem, k_ready, k_empty, p_ready, p_free, done, o_desc, n_tiles, tok, row0,
           CLUSTER: gl.constexpr):
    """Warpgroup 1: O_R += P·V_R from the shared P, nothing else."""
    if CLUSTER:
        cluster_sync()
    o_layout: gl.constexpr = O_LAYOUT
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    acc = gl.zeros([ROWS, HALF], gl.float32, o_layout)
    for j in range(n_tiles):
        slot = j % STAGES
        mbarrier.wait(p_ready, j & 1)
        mbarrier.wait(k_ready.index(slot), (j // STAGES) & 1)
        alpha = rows_smem.index(0).load(row_o)
        acc = acc * alpha[:, None]
        o_tok = warpgroup_mma(p_smem, k_lat.index(2 * slot + 1), acc, is_async=True)
        acc = warpgroup_mma_wait(0, deps=(o_tok,))
        _signal(p_free)
        _signal(k_empty.index(slot))
    mbarrier.wait(done, 0)
    out = acc * rows_smem.index(1).load(row_o)[:, None]
    q_lat.index(1).store(out.to(q_lat.dtype))
    fence_async_shared()
    gl.thread_barrier()
    tma.async_copy_shared_to_global(o_desc, [tok, row0, HALF], q_lat.index(1).reshape(o_desc.block_type.shape))
    tma.store_wait(0)
    if CLUSTER:
        cluster_sync()


@gluon.jit
def sparse_decode_kernel(q_lat_desc, q_rope_desc, o_desc, CACHE, SCALES, IDX, VALID_LENS, topk, stride_idx, bound,
                         page_size, stride_page, stride_slot, X_CACHE, X_SCALES, X_IDX, X_VALID_LENS, x_topk,
                         x_stride_idx, x_bound, x_page_size, x_stride_page, x_stride_slot, LSE, SINKS, h_q,
                         seq_tokens, stride_lb, stride_lh, stride_ls, qk_scale_log2, FP8: gl.constexpr,
                         EXTRA: gl.constexpr, SHIFTED: gl.constexpr, HAS_SINKS: gl.constexpr, WG0_REGS: gl.constexpr,
                         WG1_REGS: gl.constexpr, CLUSTER: gl.constexpr = False, SMEM: gl.constexpr = None):
    """Grid: query tokens x 64-row blocks of their heads (row blocks fastest, so a token's programs run together).
    Token t's keys are the first min(topk, VALID_LENS[t // seq_tokens]) entries of its index row, then (EXTRA) the
    first min(x_topk, X_VALID_LENS[t // seq_tokens]) of its second source's. CLUSTER: launched as clusters of two
    CTAs, a token's two row blocks (h_q = 128)."""
    blocks = h_q // ROWS
    tok = gl.program_id(0) // blocks
    row0 = (gl.program_id(0) % blocks) * ROWS
    seq = tok // seq_tokens
    main = (CACHE, SCALES, IDX + tok.to(gl.int64) * stride_idx, gl.minimum(gl.load(VALID_LENS + seq), topk), bound,
            page_size, stride_page, stride_slot)
    n_main = gl.cdiv(main[3], BLOCK_N)
    n_tiles = n_main
    extra = main
    if EXTRA:
        extra = (X_CACHE, X_SCALES, X_IDX + tok.to(gl.int64) * x_stride_idx,
                 gl.minimum(gl.load(X_VALID_LENS + seq), x_topk), x_bound, x_page_size, x_stride_page, x_stride_slot)
        n_tiles += gl.cdiv(extra[3], BLOCK_N)
    sources = (main, extra, n_main)
    lse_out = (LSE, h_q, seq_tokens, stride_lb, stride_lh, stride_ls)
    dtype: gl.constexpr = q_lat_desc.dtype
    half_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([ROWS, HALF], dtype)
    rope_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([ROWS, DT], dtype)
    q_lat = gl.allocate_shared_memory(dtype, [2, ROWS, HALF], half_layout)
    k_lat = gl.allocate_shared_memory(dtype, [2 * STAGES, BLOCK_N, HALF], half_layout)
    if FP8 == V32:
        q_rope = gl.allocate_shared_memory(dtype, [ROWS, DT], rope_layout)
        k_rope = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, DT], rope_layout)
    else:                             # model1's RoPE values are the value rows' last 64 columns: no buffers of their own
        q_rope = q_lat
        k_rope = k_lat
    p_smem = gl.allocate_shared_memory(dtype, [ROWS, BLOCK_N], rope_layout)
    rows_smem = gl.allocate_shared_memory(gl.float32, [2, ROWS], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    q_ready = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout()).index(0)
    k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    p_ready = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout()).index(0)
    p_free = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout()).index(0)
    done = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout()).index(0)
    mbarrier.init(q_ready, count=1)
    mbarrier.init(p_ready, count=1)
    mbarrier.init(p_free, count=1)
    mbarrier.init(done, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(k_empty.index(i), count=2)
    peer_free = k_empty
    if CLUSTER:
        peer_free = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(STAGES):
            mbarrier.init(peer_free.index(i), count=1)
    gl.warp_specialize([
        (_loader, (q_lat_desc, q_rope_desc, q_lat, q_rope, k_lat, k_rope, q_ready, k_ready, k_empty, peer_free, sources,
                   n_tiles, tok, row0, FP8, EXTRA, SHIFTED, CLUSTER, SMEM)),
        (_scorer, (q_lat, q_rope, k_lat, k_rope, p_smem, rows_smem, q_ready, k_ready, k_empty, p_ready, p_free, done,
                   o_desc, sources, lse_out, SINKS, n_tiles, tok, row0, qk_scale_log2, FP8, EXTRA, HAS_SINKS,
                   CLUSTER)),
        (_right, (q_lat, k_lat, p_smem, rows_smem, k_ready, k_empty, p_ready, p_free, done, o_desc, n_tiles, tok,
                  row0, CLUSTER)),
    ], [4, 4], [WG0_REGS, WG1_REGS])


def supported(q_lat, q_rope, cache, out, *, sparse, fp8_layout, extra, max_logits, whole, causal):
    """The TMA views (q latent, q RoPE or True, out) when this kernel runs the call, else None: an FP8 (V3.2 or
    model1) token-sparse decode (`mla_decode.mla_decode_forward`'s arguments: one query token a batch, s_q = 1),
    with or without a second source, run whole (no split pieces), whose heads come in 64-row blocks, on a Hopper
    GPU whose `mla_decode_sm90` path accepts it (bf16, 16-byte aligned rows)."""
    if not (sparse and fp8_layout in ("v32", "model1") and max_logits is None and whole and not causal):
        return None
    if q_lat.shape[1] != 1 or q_lat.shape[2] % ROWS.value:
        return None
    views = mla_decode_sm90.supported(q_lat, q_rope, cache, cache if q_rope is not None else None, out,
                                      sparse=True, fp8_layout=fp8_layout, extra=extra)
    return None if views is None else (views[0], views[1], views[4])


def _source_args(cache, table, valid_lens, fp8_layout):
    """A source's kernel arguments: (cache, scale rows, index table, valid lengths, topk, table row stride, keys in
    the cache, page size, page stride, slot stride), the cache's pages viewed as one key each where they follow each
    other (V3.2)."""
    if fp8_layout == "v32":
        cache = mla_decode_sm90._one_key_pages(cache, None)[0]
    base, scales, strides = _gather_bases(cache, None, fp8_layout)
    return (base, scales, table, valid_lens, table.shape[-1], table.stride(0), cache.shape[0] * cache.shape[1],
            cache.shape[1], strides[0], strides[1])


def sparse_decode_forward_sm90(views, q_lat, q_rope, cache, indices, valid_lens, out, lse, *, softmax_scale, sinks,
                               fp8_layout, extra=None):
    """q_lat (tokens, 1, h_q, 512) bf16, q_rope (tokens, 1, h_q, 64) bf16 (V3.2) or None (model1: its 512 columns
    end in the RoPE part), `cache` the packed rows ((pages, page_size, 1, 656) uint8 V3.2, (..., 584) model1),
    `indices` (tokens, topk) int32 flat positions (negative or past the cache: none), `valid_lens` (batch,) int32
    (token t's keys are its first min(topk, valid_lens[t // s_q]) entries), `extra` = (x_cache, x_rope, x_indices,
    x_valid_lens, main_span) a second source read the same way (main_span unused), out like q_lat, lse
    (batch, h_q, s_q) fp32, sinks (h_q,) fp32 or None; `views` from `supported`."""
    tokens, _, h_q, _ = q_lat.shape
    vq, vr, vo = views
    rows = ROWS.value
    main = _source_args(cache, indices, valid_lens, fp8_layout)
    second = main if extra is None else _source_args(extra[0], extra[2], extra[3], fp8_layout)
    # Pages of a power of two keys (one-key pages fold away anyway): shifts and masks, not divisions (V4 +1%).
    shifted = all(mla_decode_sm90._pow2(src[7]) and src[7] > 1 for src in (main, second))
    if shifted:
        main, second = ((*src[:7], src[7].bit_length() - 1, *src[8:]) for src in (main, second))
    descs = (descriptor(q_lat, vq, [1, rows, HALF.value]),
             descriptor(q_rope, vr, [1, rows, DT.value]) if q_rope is not None else None,
             descriptor(out, vo, [1, rows, HALF.value]))
    grid = (tokens * (h_q // rows),)
    args = (*descs, *main, *second, lse, sinks if sinks is not None else lse, h_q, tokens // lse.shape[0],
            *lse.stride(), softmax_scale * LOG2E.value)
    kw = dict(FP8={"v32": V32.value, "model1": MODEL1.value}[fp8_layout], EXTRA=extra is not None, SHIFTED=shifted,
              HAS_SINKS=sinks is not None, WG0_REGS=WG0_REGS, WG1_REGS=WG1_REGS, num_warps=4)
    if (h_q // rows) % 2 == 0 and clusters_enabled():
        launch_pairs(sparse_decode_kernel, _cluster_buffers, grid, args, kw)
    else:
        launch(sparse_decode_kernel, grid, args, kw)


def _cluster_buffers(constexprs):
    """The allocations SMEM locates: k_lat, k_rope (model1 has none: its RoPE values are in k_lat), k_ready,
    peer_free."""
    return ("k_lat", "k_rope" if constexprs["FP8"] == V32.value else "k_lat", "k_ready", "peer_free")


def clusters_enabled() -> bool:
    """A token's two 64-row blocks run as a 2-CTA cluster sharing the loads, unless FMHA_SPARSE_CLUSTER=0."""
    return os.environ.get("FMHA_SPARSE_CLUSTER", "1") != "0"
