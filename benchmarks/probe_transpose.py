"""The FP8 prefill's transposition of V (`kernels/transpose.py`) against a plain copy of the same bytes, per tile.

    PYTHONPATH=src python3 benchmarks/probe_transpose.py [--out F.json]

For `fmha bench prefill`'s 16k tokens (16 x 1k) at d = 64 / 128 / 256 (32 / 16 / 8 KV heads): `transpose_kernel`
with BLOCK keys a program and num_warps warps, each result checked against torch's permute, as GB/s of bytes
read and written, beside `clone()` of the same tensor (the copy bandwidth of this size) in the same process.
"""
import argparse

import torch
import triton

from fmha.bench import bench_gpu, save_sweep
from fmha.kernels import transpose as T
from fmha.kernels.launch import launch


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=None)
    a = p.parse_args()
    rows = []
    for hk, dv in ((16, 128), (32, 64), (8, 256)):
        b, s = 16, 1024
        v = (torch.randn(b, s, hk, dv, device="cuda") * 4).to(torch.float8_e4m3fn).view(torch.uint8)
        want = v.permute(0, 2, 3, 1).contiguous()
        nbytes = 2 * v.numel()
        row = dict(hk=hk, dv=dv, copy_gbps=nbytes / bench_gpu(lambda: v.clone()) / 1e9)
        for block in (32, 64, 128, 256):
            for warps in (2, 4, 8):
                vt = torch.empty(b, hk, dv, s, dtype=torch.uint8, device="cuda")
                grid = (b * hk, triton.cdiv(s, block))
                args = (v, vt, None, s, hk, v.stride(0), v.stride(1), v.stride(2), vt.stride(0), vt.stride(1),
                        vt.stride(2), s)
                meta = dict(DV=dv, BLOCK=block, TAIL=T.TAIL, num_warps=warps)
                launch(T.transpose_kernel, grid, args, meta)
                if not torch.equal(vt, want):
                    raise RuntimeError(f"BLOCK={block} num_warps={warps}: the transposition is wrong")
                t = bench_gpu(lambda: launch(T.transpose_kernel, grid, args, meta))
                row[f"b{block}w{warps}"] = nbytes / t / 1e9
        print({k: round(x, 1) if isinstance(x, float) else x for k, x in row.items()}, flush=True)
        rows.append(row)
    if a.out:
        save_sweep(a.out, rows)


if __name__ == "__main__":
    main()
