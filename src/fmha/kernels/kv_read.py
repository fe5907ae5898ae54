"""A pure read of a decode KV cache: the yardstick `fmha bench decode` holds the decode kernel against.

Each program walks one KV head's slice of a run of key rows (the decode kernel's order: a paged cache through its
block table) and XOR-folds what it loads, so no load can be dropped and the XOR of all programs' outputs is the
XOR of every word of K and V (`xor_fold`), whatever the layout: the read can be checked. No attention math, so
its rate is what reading these bytes in this order costs on this GPU, pages scattered or not
(`benchmarks/probe_readbw.py` compares orders and shapes: 8 warps and 128 keys a step read best).
"""
import torch
import triton
import triton.language as tl


@triton.jit
def _xor(a, b):
    return a ^ b


@triton.jit
def kv_read_kernel(K, V, OUT, TABLE, keys, page, table_stride,
                   HEADS: tl.constexpr, ROW: tl.constexpr, COLS: tl.constexpr, BN: tl.constexpr,
                   PAGED: tl.constexpr, WHOLE_ROW: tl.constexpr, SPLITS: tl.constexpr):
    # K, V viewed as int32: a key row is ROW words (heads * d 16-bit values), a head's slice COLS words.
    pid = tl.program_id(0)
    b = pid // (HEADS * SPLITS)
    if WHOLE_ROW:
        # programs (sequence, HEADS-th of its keys), each reading whole key rows
        chunk = keys // HEADS
        k_lo = (pid % HEADS) * chunk
        col0 = 0
    else:
        # programs (sequence, head, split): a head's keys in SPLITS consecutive runs
        chunk = keys // SPLITS
        k_lo = (pid % SPLITS) * chunk
        col0 = (pid // SPLITS % HEADS) * COLS
    offs_n = tl.arange(0, BN)
    offs_c = tl.arange(0, COLS)
    acc = tl.zeros([BN, COLS], dtype=tl.int32)
    for n in range(k_lo, k_lo + chunk, BN):
        key = n + offs_n
        if PAGED:
            pg = tl.load(TABLE + b * table_stride + key // page).to(tl.int64)
            row = pg * page + key % page
        else:
            row = b.to(tl.int64) * keys + key
        ptrs = row[:, None] * ROW + col0 + offs_c[None, :]
        acc = acc ^ tl.load(K + ptrs) ^ tl.load(V + ptrs)
    tl.store(OUT + pid, tl.reduce(tl.reduce(acc, 1, _xor), 0, _xor))


def kv_read(k_cache, v_cache, block_table, keys, *, whole_row=False, warps=8, block_n=None, splits=1):
    """A callable that reads the first `keys` keys of every sequence of a full cache once: k/v contiguous
    `(batch, keys, heads, d)` or paged `(pages, page_size, heads, d)` with `block_table`. `keys` must be a
    multiple of block_n * splits (whole rows: of heads * block_n). The callable returns the programs' XOR folds."""
    heads, d = k_cache.shape[2], k_cache.shape[3]
    batch = block_table.shape[0] if block_table is not None else k_cache.shape[0]
    ki, vi = k_cache.view(torch.int32), v_cache.view(torch.int32)
    row, cols = heads * d * k_cache.element_size() // 4, d * k_cache.element_size() // 4
    page = k_cache.shape[1] if block_table is not None else 1
    if whole_row:
        block_n, cols, splits = block_n or 16, row, 1
    else:
        block_n = block_n or 128
    out = torch.empty(batch * heads * splits, dtype=torch.int32, device=k_cache.device)
    table = block_table if block_table is not None else out
    table_stride = block_table.stride(0) if block_table is not None else 0

    def call():
        kv_read_kernel[(batch * heads * splits,)](ki, vi, out, table, keys, page, table_stride, HEADS=heads, ROW=row,
                                                  COLS=cols, BN=block_n, PAGED=block_table is not None,
                                                  WHOLE_ROW=whole_row, SPLITS=splits, num_warps=warps)
        return out
    return call


def xor_fold(t):
    """XOR of all 32-bit words of t (a kv_read output, or a whole cache for the expected value)."""
    x = t.reshape(-1).view(torch.int32).to(torch.int64)
    while x.numel() > 1:
        if x.numel() % 2:
            x = torch.cat([x, x.new_zeros(1)])
        x = x[0::2] ^ x[1::2]
    return int(x.item())
