"""V transposed for FP8 prefill on Hopper (`forward_sm90.transposed_v`): wgmma reads 8-bit operands K-major only, so
P·V needs each KV head's values as (head_dim_v, keys). A tile of keys is loaded row by row (head_dim_v contiguous
bytes a key), transposed in registers and shared memory, and stored key-contiguous. Packed sequences: each one's keys
go to its own 16-byte-aligned run of columns (TMA boxes must start 16-byte aligned in their innermost dimension),
from `packed_start`, zeros after them up to the next run, and TAIL columns of zeros after the last run: a key tile
of at most TAIL keys that starts inside a sequence reads no further (the rest of the copy is left as it was
allocated)."""
import triton
import triton.language as tl

from .launch import cdiv, launch

BLOCK_KEYS = 128                  # `benchmarks/probe_transpose.py`: 0.87-0.95 of a copy's GB/s, 64 keys 0.77-0.93
TAIL = 128                        # the longest key tile of the FP8 kernel (`forward_sm90`)


@triton.jit
def packed_start(first, b):
    """The column of V's copy where packed sequence b's keys start, `first` = cu_seqlens[b]: first rounded up to 16,
    plus 16 per sequence before it. Aligned, and past sequence b - 1's last key (its start is at most
    first - len(b - 1) + 15 + 16 (b - 1)), with 1-31 columns between; a closed form, so that no prefix sum over the
    lengths (host launches) is needed. `transpose_kernel` and the Gluon kernel's producer (`forward_sm90._load_item`)
    call it, the host its plain form (`packed_start.fn`)."""
    return (first + 15) // 16 * 16 + 16 * b


@triton.jit
def transpose_kernel(V, VT, CU, keys, heads_k, stride_vb, stride_vs, stride_vh, stride_tb, stride_th,
                     stride_td, columns, DV: tl.constexpr, BLOCK: tl.constexpr, TAIL: tl.constexpr):
    """Program (batch * heads_k + head, key block): V[b, block, head, :] (bytes) into VT[b, head, :, block]. With CU
    (packed sequences, b the sequence): keys CU[b] + block of V's one batch into columns `packed_start` + block of
    VT's, zeros from the sequence's length up to the next one's start, the last sequence's up to TAIL columns past
    that (at most `columns`, the copy's width)."""
    bh = tl.program_id(0)
    b = bh // heads_k
    h = bh % heads_k
    n = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    cols = tl.arange(0, DV)
    if CU is not None:
        first = tl.load(CU + b)
        after = tl.load(CU + b + 1)
        length = after - first
        col0 = packed_start(first, b)
        end = packed_start(after, b + 1)
        if b == tl.num_programs(0) // heads_k - 1:
            end = tl.minimum(end + TAIL, columns)
        width = end - col0
        src = V + first.to(tl.int64) * stride_vs
        dst = VT + col0
        read = n < length
        write = n < width
    else:
        src = V + b.to(tl.int64) * stride_vb
        dst = VT + b.to(tl.int64) * stride_tb
        read = n < keys
        write = read
    src += h.to(tl.int64) * stride_vh + n.to(tl.int64)[:, None] * stride_vs
    tile = tl.load(src + cols[None, :], mask=read[:, None], other=0)
    dst += h.to(tl.int64) * stride_th + cols.to(tl.int64)[:, None] * stride_td
    tl.store(dst + n[None, :], tl.trans(tile), mask=write[None, :])


def transpose_keys(v, vt, packed=None):
    """vt[b, h, :, :keys] = v[b, :, h, :]ᵀ for byte tensors v (b, keys, heads_k, dv) (last dim contiguous) and vt
    (b, heads_k, dv, >= keys) (last dim contiguous); dv a power of two. `packed` = (cu_seqlens, longest): v and vt
    have one batch, sequence s's keys (rows cu_seqlens[s] ..) go to columns packed_start(cu_seqlens[s], s) ..,
    zeros after them up to the next sequence's start, and after the last one for TAIL columns (as far as vt goes);
    `longest` bounds the lengths."""
    b, keys, heads_k, dv = v.shape
    cu, longest = packed or (None, keys)
    programs = b * heads_k if cu is None else (cu.shape[0] - 1) * heads_k
    if programs * longest == 0:
        return
    # a sequence's columns up to the next start: at most its length + 31 (`packed_start`), the last one's + TAIL
    grid = (programs, cdiv(longest if cu is None else longest + 31 + TAIL, BLOCK_KEYS))
    launch(transpose_kernel, grid, (v, vt, cu, keys, heads_k, v.stride(0), v.stride(1), v.stride(2),
                                    vt.stride(0), vt.stride(1), vt.stride(2), vt.shape[3]),
           dict(DV=dv, BLOCK=BLOCK_KEYS, TAIL=TAIL, num_warps=4))
