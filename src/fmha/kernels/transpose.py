"""V transposed for FP8 prefill on Hopper (`forward_sm90.transposed_v`): wgmma reads 8-bit operands K-major only, so
P·V needs each KV head's values as (head_dim_v, keys). A tile of keys is loaded row by row (head_dim_v contiguous
bytes a key), transposed in registers and shared memory, and stored key-contiguous."""
import triton
import triton.language as tl

from .launch import launch

BLOCK_KEYS = 64


@triton.jit
def transpose_kernel(V, VT, keys, heads_k, stride_vb, stride_vs, stride_vh, stride_tb, stride_th, stride_td,
                     DV: tl.constexpr, BLOCK: tl.constexpr):
    """Program (batch * heads_k + head, key block): V[b, block, head, :] (bytes) into VT[b, head, :, block]."""
    bh = tl.program_id(0)
    b = bh // heads_k
    h = bh % heads_k
    n = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    cols = tl.arange(0, DV)
    ok = n < keys
    src = V + b.to(tl.int64) * stride_vb + h.to(tl.int64) * stride_vh + n.to(tl.int64)[:, None] * stride_vs
    tile = tl.load(src + cols[None, :], mask=ok[:, None])
    dst = VT + b.to(tl.int64) * stride_tb + h.to(tl.int64) * stride_th + cols.to(tl.int64)[:, None] * stride_td
    tl.store(dst + n[None, :], tl.trans(tile), mask=ok[None, :])


def transpose_keys(v, vt):
    """vt[b, h, :, :keys] = v[b, :, h, :]ᵀ for byte tensors v (b, keys, heads_k, dv) (last dim contiguous) and vt
    (b, heads_k, dv, >= keys) (last dim contiguous); dv a power of two."""
    b, keys, heads_k, dv = v.shape
    if b * heads_k * keys == 0:
        return
    grid = (b * heads_k, triton.cdiv(keys, BLOCK_KEYS))
    launch(transpose_kernel, grid, (v, vt, keys, heads_k, v.stride(0), v.stride(1), v.stride(2), vt.stride(0),
                                    vt.stride(1), vt.stride(2)), dict(DV=dv, BLOCK=BLOCK_KEYS, num_warps=4))
