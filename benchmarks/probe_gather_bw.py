"""How fast can the sparse prefill's key rows be gathered at all? A ceiling for `flash_mla_sparse_fwd`.

A gather-only Gluon kernel (no attention math) over `fmha bench sparse`'s prefill inputs (s_q 4096, s_kv 32768,
topk 2048, d_qk 576 or 512, bf16): one program per (query token, 64-row head block), as the attention kernels
launch, each walking its token's 2048 index entries in tiles of 64 keys and copying every row (1152 / 1024 bytes)
into a ring of STAGES tile slots in shared memory with 16-byte cp.async (8 threads a 128-byte piece of a row, as
`mla_decode_sm90._gather_rows` does), each thread arriving on the slot's barrier; a slot is reused once its last
tile has landed. Nothing is computed, so the time is the memory system's (HBM, then L2: the 38 MB of kv fits the
50 MB L2) to shared memory, at the attention kernel's occupancy (one program an SM, 144-216 KB of slots), timed as
`fmha bench sparse` times the prefill (`bench_gpu`: L2 flushed before each call).

Printed per row: TB/s of rows moved, and the attention TFLOP/s the same time would be (FlashMLA's count,
2 * h * topk * (d_qk + 512) a token): what a kernel that hid all of its math behind these loads could reach.
Compare FlashMLA's SPEC figures (569 / 529 / 578) and ours (`fmha bench sparse`).

    PYTHONPATH=src python3 benchmarks/probe_gather_bw.py [--out probe.json]
"""
import argparse

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import mbarrier

from fmha.bench import SPARSE_PREFILL_CASES, bench_gpu, save_sweep, sparse_prefill_inputs
from fmha.kernels.mla_decode_sm90 import BLOCK_N

RING_BYTES = 220 << 10            # the slots, within an H100 SM's 227 KB of shared memory


@gluon.jit
def gather_kernel(KV, IDX, topk, stride_kv, stride_idx, blocks, CHUNKS: gl.constexpr, STAGES: gl.constexpr,
                  WARPS: gl.constexpr):
    """Program p gathers the rows of token p // blocks' index row into its ring, tile after tile."""
    tok = gl.program_id(0) // blocks
    layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [WARPS, 1], [1, 0])
    rows_layout: gl.constexpr = gl.SliceLayout(1, layout)
    smem_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, 64], gl.bfloat16)
    ring = gl.allocate_shared_memory(gl.bfloat16, [STAGES * CHUNKS, BLOCK_N, 64], smem_layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=32 * WARPS)
    cols = gl.arange(0, 64, layout=gl.SliceLayout(0, layout))
    n_tiles = topk // BLOCK_N
    for j in range(n_tiles):
        slot = j % STAGES
        if j >= STAGES:               # the tile this slot held has landed: reuse it
            mbarrier.wait(ready.index(slot), ((j // STAGES) - 1) & 1)
        k = j * BLOCK_N + gl.arange(0, BLOCK_N, layout=rows_layout)
        idx = gl.load(IDX + tok.to(gl.int64) * stride_idx + k)
        row = KV + idx.to(gl.int64) * stride_kv
        for c in gl.static_range(CHUNKS):
            async_copy.async_copy_global_to_shared(ring.index(slot * CHUNKS + c),
                                                   row[:, None] + (c * 64 + cols)[None, :])
        async_copy.mbarrier_arrive(ready.index(slot), increment_count=False)
    for i in gl.static_range(STAGES):     # every tile landed before the program ends
        j = n_tiles - STAGES + i
        mbarrier.wait(ready.index(j % STAGES), (j // STAGES) & 1)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=None)
    args = p.parse_args()
    rows = []
    for case in SPARSE_PREFILL_CASES:
        name, sq, skv, hq, d, topk = case
        q, kv, indices = sparse_prefill_inputs(case, torch.Generator(device="cuda").manual_seed(0))
        idx = indices[:, 0]
        blocks = hq // 64
        row = dict(case=name, sq=sq, skv=skv, hq=hq, d=d, topk=topk)
        for stages, warps in ((2, 4), (2, 8), (3, 4)):
            if stages * BLOCK_N.value * d * 2 > RING_BYTES:
                continue

            def run():
                gather_kernel[(sq * blocks,)](kv, idx, topk, kv.stride(0), idx.stride(0), blocks, CHUNKS=d // 64,
                                              STAGES=stages, WARPS=warps, num_warps=warps)
            t = bench_gpu(run)
            moved = sq * blocks * topk * d * 2
            row[f"s{stages}w{warps}_tbps"] = moved / t / 1e12
            row[f"s{stages}w{warps}_tflops"] = 2 * sq * hq * topk * (d + 512) / t / 1e12
            print(f"{name} h_q={hq} d={d} stages={stages} warps={warps}: {moved / t / 1e12:.2f} TB/s, "
                  f"{row[f's{stages}w{warps}_tflops']:.1f} TFLOP/s of attention", flush=True)
        rows.append(row)
    if args.out:
        save_sweep(args.out, rows)


if __name__ == "__main__":
    main()
