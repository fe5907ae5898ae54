"""Sweep the forward kernel's tile configs on the GPU, beside cuDNN SDPA in the same run.

    PYTHONPATH=src python3 benchmarks/tune_prefill.py [--out tune.json]

Prints one line per (case, config): TFLOP/s and the ratio to cuDNN. Used to fill `_GPU_TILES`.
"""
import argparse
import itertools

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from fmha.bench import attention_flops, bench_gpu, save_sweep
from fmha.kernels.forward import attention_forward

CONFIGS = {
    64: [(128, 128, 4, 3), (128, 128, 8, 3), (128, 64, 4, 4), (64, 128, 4, 3), (128, 128, 4, 4)],
    128: [(128, 128, 8, 3), (128, 64, 4, 3), (128, 128, 4, 3), (128, 64, 8, 4), (128, 128, 8, 2),
          (64, 128, 4, 3), (128, 256, 8, 2)],
    256: [(128, 64, 8, 2), (64, 64, 4, 2), (128, 32, 8, 3), (64, 128, 8, 2), (128, 64, 8, 3)],
}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=None)
    p.add_argument("--dims", type=int, nargs="*", default=[64, 128, 256])
    p.add_argument("--seqs", type=int, nargs="*", default=[4096, 16384])
    args = p.parse_args()
    rows = []
    for d, s, causal in itertools.product(args.dims, args.seqs, (False, True)):
        b, h = 16384 // s, 2048 // d
        q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        flops = attention_flops(b, s, s, h, d, d, causal=causal)
        qt, kt, vt = (t.transpose(1, 2).contiguous() for t in (q, k, v))

        def cudnn():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
        t_ref = bench_gpu(cudnn)
        ref = cudnn().transpose(1, 2).float()
        out = torch.empty_like(q)
        lse = torch.empty(b, h, s, device="cuda")
        for tiles, tma in itertools.product(CONFIGS[d], (True, False)):
            def ours():
                attention_forward(q, k, v, out, lse, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=s,
                                  max_seqlen_k=s, softmax_scale=None, window=(-1, 0 if causal else -1),
                                  softcap=0.0, alibi_slopes=None, sinks=None, use_tma=tma, tiles=tiles)
            try:
                ours()
                err = (out.float() - ref).abs().max().item()
                t = bench_gpu(ours)
            except Exception as e:
                print(f"d={d} s={s} causal={causal} tiles={tiles} tma={tma}: FAILED {type(e).__name__} "
                      f"{str(e).splitlines()[0][:100] if str(e) else ''}", flush=True)
                continue
            row = dict(d=d, s=s, causal=causal, tiles=tiles, tma=tma, tflops=flops / t / 1e12,
                       cudnn_tflops=flops / t_ref / 1e12, vs_cudnn=t_ref / t, max_err=err)
            rows.append(row)
            print(f"d={d:<3} s={s:<5} {'causal' if causal else 'full  '} tiles={tiles} tma={int(tma)}: "
                  f"{row['tflops']:6.1f} TFLOP/s  cudnn {row['cudnn_tflops']:6.1f}  x{row['vs_cudnn']:.3f}  "
                  f"err {err:.1e}", flush=True)
    if args.out:
        save_sweep(args.out, rows)


if __name__ == "__main__":
    main()
