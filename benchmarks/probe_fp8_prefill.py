"""FP8 (e4m3) prefill on the Gluon kernel: its tile configs and ping-pong, and what V's transposition costs.

For `fmha bench prefill`'s shapes (16k tokens, hidden 2048), in one process: the Gluon kernel on FP8 q, k, v with the
launcher's choices, with ping-pong flipped, and with each `--tiles` config; the transposition of V alone
(`forward_sm90.transposed_v`, which FP8 calls without the in-kernel transposition run first); V's other form
where the kernel can transpose it (`fp8-in-kernel` or `fp8-copy`, forced by `transpose`); and our bf16 path on the
same values. TFLOP/s, the
median of `--rounds` interleaved timings.

    PYTHONPATH=src python3 benchmarks/probe_fp8_prefill.py [--dims 64 128 256] [--seqs 1024 4096 16384]
        [--tiles 128,3,2,240,2 ...] [--rounds 3] [--out probe.json]
"""
import argparse
import statistics

import torch

import fmha
from fmha.bench import attention_flops, bench_gpu, interleaved_times, save_sweep
from fmha.kernels import forward_sm90


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dims", type=int, nargs="*", default=[64, 128, 256])
    p.add_argument("--seqs", type=int, nargs="*", default=[1024, 4096, 16384])
    p.add_argument("--tiles", nargs="*", default=[], help="BLOCK_N,STAGES,Q_BUFS,REGS,WGS configs to time too")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    rows = []
    for d in args.dims:
        for s in args.seqs:
            for causal in (False, True):
                b, h = 16384 // s, 2048 // d
                torch.manual_seed(0)
                q8, k8, v8 = (torch.randn(b, s, h, d, device="cuda").to(torch.float8_e4m3fn) for _ in range(3))
                q, k, v = (t.to(torch.bfloat16) for t in (q8, k8, v8))
                out = torch.empty(b, s, h, d, device="cuda", dtype=torch.bfloat16)
                lse = torch.empty(b, h, s, device="cuda")
                default = forward_sm90.choose_tiles(d, causal, s)
                pingpong = d == 256 or (d == 128 and causal and s >= forward_sm90.PINGPONG_MIN_ROWS_D128)

                def gluon(tiles=None, pp=None, transpose=None):
                    return lambda: forward_sm90.attention_forward_sm90(q8, k8, v8, out, lse, causal=causal,
                                                                       softmax_scale=d ** -0.5, tiles=tiles,
                                                                       pingpong=pp, transpose=transpose)
                impls = {"fp8": gluon(), f"fp8-pingpong-{'off' if pingpong else 'on'}": gluon(pp=not pingpong)}
                if forward_sm90.transpose_in_kernel(d, default[4], False):
                    # V's other form beside the launcher's: transposed in the kernel, or copied first
                    in_kernel = forward_sm90.transpose_by_default(d, causal, s, s, 1)
                    impls["fp8-copy" if in_kernel else "fp8-in-kernel"] = gluon(transpose=not in_kernel)
                for t in args.tiles:
                    tiles = tuple(int(x) for x in t.split(","))
                    if tiles != default:
                        impls[f"fp8-{t}"] = gluon(tiles=tiles)
                impls["transpose-v"] = lambda: forward_sm90.transposed_v(v8)
                impls["bf16"] = lambda: fmha.attention(q, k, v, causal=causal)
                ref = fmha.attention(q, k, v, causal=causal).float()
                row = dict(d=d, s=s, b=b, h=h, causal=causal, tiles=list(default), pingpong=pingpong)
                for name, fn in impls.items():
                    if name.startswith("fp8"):
                        fn()
                        err = (out.float() - ref).abs().max().item()
                        row[f"{name}_err"] = err
                        if err > 0.05 + 2.0 ** -3 * v.abs().max().item():
                            raise SystemExit(f"{name} d={d} s={s} causal={causal}: max abs err {err}")
                times = interleaved_times(impls, args.rounds, bench_gpu)
                flops = attention_flops(b, s, s, h, d, d, causal=causal)
                for name, ts in times.items():
                    t = statistics.median(ts)
                    row[f"{name}_us"] = t * 1e6
                    if name != "transpose-v":
                        row[f"{name}_tflops"] = flops / t / 1e12
                rows.append(row)
                cells = "  ".join(f"{n} {row[f'{n}_tflops']:6.1f}" for n in impls if f"{n}_tflops" in row)
                print(f"d={d} s={s} {'causal' if causal else 'full  '} | {cells} | transpose-v "
                      f"{row['transpose-v_us']:.1f} us of fp8's {row['fp8_us']:.1f}", flush=True)
                del q8, k8, v8, q, k, v, out, lse, ref
                torch.cuda.empty_cache()
    if args.out:
        save_sweep(args.out, rows)


if __name__ == "__main__":
    main()
