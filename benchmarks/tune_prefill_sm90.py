"""Sweep the Gluon (sm_90) prefill kernel's options beside cuDNN SDPA in the same run.

    PYTHONPATH=src python3 benchmarks/tune_prefill_sm90.py [--out tune.json] [--dims 128] [--seqs 1024 4096 16384]

One line per (case, variant): TFLOP/s and the ratio to cuDNN; each variant's output is checked against
cuDNN's before it is timed. Used to fill `forward_sm90._TILES`.
"""
import argparse
import itertools

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from fmha.bench import attention_flops, bench_gpu, save_sweep
from fmha.kernels.forward_sm90 import _TILES, attention_forward_sm90

# head_dim -> [(BLOCK_N, STAGES, Q_BUFS, consumer registers)]
CONFIGS = {64: [(128, 3, 2, 232), (128, 2, 2, 232), (64, 4, 2, 232)],
           128: [(128, 2, 2, 232), (128, 2, 1, 232), (64, 4, 2, 232), (64, 3, 2, 232)],
           256: [(64, 2, 1, 232), (32, 4, 1, 232)]}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=None)
    p.add_argument("--dims", type=int, nargs="*", default=[128])
    p.add_argument("--seqs", type=int, nargs="*", default=[1024, 4096, 16384])
    p.add_argument("--all-configs", action="store_true", help="every entry of CONFIGS, not only the table's")
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
        configs = CONFIGS[d] if args.all_configs else [_TILES[d]]
        for tiles, pingpong in itertools.product(configs, (True, False)):
            def ours():
                attention_forward_sm90(q, k, v, out, lse, causal=causal, softmax_scale=d ** -0.5,
                                       pingpong=pingpong, tiles=tiles)
            try:
                out.fill_(float("nan"))
                ours()
                err = (out.float() - ref).abs().max().item()
                if not err < 0.05:
                    raise RuntimeError(f"disagrees with cuDNN (max abs diff {err})")
                t = bench_gpu(ours)
            except Exception as e:
                print(f"d={d} s={s} causal={causal} tiles={tiles} pingpong={pingpong}: FAILED "
                      f"{type(e).__name__} {str(e).splitlines()[0][:100] if str(e) else ''}", flush=True)
                continue
            row = dict(d=d, s=s, causal=causal, tiles=tiles, pingpong=pingpong, tflops=flops / t / 1e12,
                       cudnn_tflops=flops / t_ref / 1e12, vs_cudnn=t_ref / t, max_err=err)
            rows.append(row)
            print(f"d={d:<3} s={s:<5} {'causal' if causal else 'full  '} tiles={tiles} pp={int(pingpong)}: "
                  f"{row['tflops']:6.1f} TFLOP/s  cudnn {row['cudnn_tflops']:6.1f}  x{row['vs_cudnn']:.3f}  "
                  f"err {err:.1e}", flush=True)
    if args.out:
        save_sweep(args.out, rows)


if __name__ == "__main__":
    main()
