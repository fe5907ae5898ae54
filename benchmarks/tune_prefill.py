"""Sweep a prefill kernel's tile configs on the GPU, beside cuDNN SDPA in the same run.

    PYTHONPATH=src python3 benchmarks/tune_prefill.py [--kernel triton|gluon] [--out tune.json]
        [--dims 64 128 256] [--seqs 4096 16384] [--all-configs] [--tiles 128,4,2,232,2 ...] [--pingpong on|off]
        [--versions A.py B.py] [--reverse] [--rounds N]

Prints one line per (case, variant): TFLOP/s and the ratio to cuDNN; each variant's output is checked against
cuDNN's before it is timed. `--kernel triton` sweeps `forward.py` (tiles × TMA on/off; fills `_GPU_TILES`),
`--kernel gluon` the Hopper kernel of `forward_sm90.py` (tiles × ping-pong on/off; fills `_TILES` and
`_WIDE_TILES`; without `--all-configs` only those tables' own tiles; `--pingpong` keeps one setting of it, which
three consumer warpgroups ignore; `--tiles` sweeps the named configs instead, in the table or not). `--versions`
times other copies of `forward_sm90.py` (e.g. one taken from an earlier commit with
`git show REV:src/fmha/kernels/forward_sm90.py > /tmp/base.py`) beside the package's own, each with its own tables,
in the same process, each variant timed twice (A B .. B A) and averaged (`--rounds N`: N alternating passes and their
median); `--reverse` starts with the last version.
Each row also carries SDPA's FlashAttention-2 backend (`vs_fa2`).
"""
import argparse
import itertools
import os
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from fmha.bench import PREFILL_VALUE_DIMS, attention_flops, bench_gpu, load_module_copy, save_sweep
from fmha.kernels.forward import attention_forward

# head_dim -> [(BLOCK_M, BLOCK_N, num_warps, num_stages)]
TRITON_CONFIGS = {
    64: [(128, 128, 4, 3), (128, 128, 8, 3), (128, 64, 4, 4), (64, 128, 4, 3), (128, 128, 4, 4)],
    128: [(128, 128, 8, 3), (128, 64, 4, 3), (128, 128, 4, 3), (128, 64, 8, 4), (128, 128, 8, 2),
          (64, 128, 4, 3), (128, 256, 8, 2)],
    256: [(128, 64, 8, 2), (64, 64, 4, 2), (128, 32, 8, 3), (64, 128, 8, 2), (128, 64, 8, 3)],
}
# head_dim -> [(BLOCK_N, STAGES, Q_BUFS, consumer registers, consumer warpgroups)]
GLUON_CONFIGS = {64: [(128, 3, 2, 232, 2), (128, 4, 2, 232, 2), (128, 2, 2, 232, 2), (64, 4, 2, 232, 2),
                      (128, 3, 2, 160, 3), (128, 2, 2, 160, 3)],
                 128: [(128, 2, 2, 240, 2), (128, 2, 2, 232, 2), (128, 2, 1, 232, 2), (64, 4, 2, 232, 2),
                       (64, 3, 2, 232, 2)],
                 256: [(64, 2, 1, 232, 2), (32, 4, 1, 232, 2)],
                 192: [(128, 2, 1, 232, 2), (64, 2, 2, 232, 2), (64, 3, 1, 232, 2)]}


def variants(kernel, d, all_configs, pingpongs=(True, False), module=None, keep=None):
    """(label, launcher) pairs; a launcher takes (q, k, v, out, lse, causal). `module`: the Gluon kernel's module
    (default: the package's `forward_sm90`); `keep`: if given, these Gluon tile configs instead."""
    if kernel == "triton":
        for tiles, tma in itertools.product(TRITON_CONFIGS[d], (True, False)):
            def run(q, k, v, out, lse, causal, tiles=tiles, tma=tma):
                s = q.shape[1]
                attention_forward(q, k, v, out, lse, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=s,
                                  max_seqlen_k=s, softmax_scale=None, window=(-1, 0 if causal else -1),
                                  softcap=0.0, alibi_slopes=None, sinks=None, use_tma=tma, tiles=tiles)
            yield dict(tiles=tiles, tma=tma), run
        return
    if module is None:
        from fmha.kernels import forward_sm90 as module
    configs = GLUON_CONFIGS[d] if all_configs else [module._TILES[d]] + (
        [module._WIDE_TILES[d]] if d in module._WIDE_TILES else [])
    if keep is not None:          # the named configs, in the table or not
        configs = keep
    for tiles, pingpong in itertools.product(configs, pingpongs):
        def run(q, k, v, out, lse, causal, tiles=tiles, pingpong=pingpong):
            module.attention_forward_sm90(q, k, v, out, lse, causal=causal, softmax_scale=d ** -0.5,
                                          pingpong=pingpong, tiles=tiles)
        yield dict(tiles=tiles, pingpong=pingpong), run


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--kernel", choices=("triton", "gluon"), default="triton")
    p.add_argument("--out", default=None)
    p.add_argument("--dims", type=int, nargs="*", default=[64, 128, 256])
    p.add_argument("--seqs", type=int, nargs="*", default=[4096, 16384])
    p.add_argument("--all-configs", action="store_true")
    p.add_argument("--pingpong", choices=("on", "off"), default=None)
    p.add_argument("--versions", nargs="*", default=[], help="other copies of forward_sm90.py to time (gluon)")
    p.add_argument("--tiles", nargs="*", default=None, help="gluon: only these configs, e.g. 128,4,2,232,2")
    p.add_argument("--rounds", type=int, default=None,
                   help="timings a variant, in alternating order, median kept (default: 2 with --versions, else 1)")
    p.add_argument("--reverse", action="store_true",
                   help="time the versions in reverse order, the package's last (to separate order from version)")
    args = p.parse_args()
    keep = None if args.tiles is None else [tuple(int(x) for x in t.split(",")) for t in args.tiles]
    versions = [("package", None)] + [(os.path.basename(v), load_module_copy(v)) for v in args.versions]
    pingpongs = (True, False) if args.pingpong is None else (args.pingpong == "on",)
    rows = []
    for d, s, causal in itertools.product(args.dims, args.seqs, (False, True)):
        b, h = 16384 // s, 2048 // d
        dv = PREFILL_VALUE_DIMS.get(d, d)
        q, k, v = (torch.randn(b, s, h, dim, device="cuda", dtype=torch.bfloat16) for dim in (d, d, dv))
        flops = attention_flops(b, s, s, h, d, dv, causal=causal)
        qt, kt, vt = (t.transpose(1, 2).contiguous() for t in (q, k, v))

        def sdpa(backend):
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
        t_ref = bench_gpu(lambda: sdpa(SDPBackend.CUDNN_ATTENTION))
        t_fa2 = bench_gpu(lambda: sdpa(SDPBackend.FLASH_ATTENTION)) if dv == d else float("nan")   # FA2: dv == d
        ref = sdpa(SDPBackend.CUDNN_ATTENTION).transpose(1, 2).float()
        out = q.new_empty((b, s, h, dv))
        lse = torch.empty(b, h, s, device="cuda")
        runs = [(version, label, run) for version, module in (versions[::-1] if args.reverse else versions)
                for label, run in variants(args.kernel, d, args.all_configs, pingpongs, module, keep)]
        checked = []              # (case, label, run, max error) of the variants that compile and agree
        for version, label, run in runs:
            if len(versions) > 1:
                label = dict(version=version, **label)
            case = f"d={d:<3} s={s:<5} {'causal' if causal else 'full  '} {label}"
            try:
                out.fill_(float("nan"))
                run(q, k, v, out, lse, causal)
                err = (out.float() - ref).abs().max().item()
                if not err < 0.05:
                    raise RuntimeError(f"disagrees with cuDNN (max abs diff {err})")
            except Exception as e:
                print(f"{case}: FAILED {type(e).__name__} {str(e).splitlines()[0][:100] if str(e) else ''}",
                      flush=True)
                continue
            checked.append((case, label, run, err))
        # With several versions each variant is timed in `rounds` passes, alternately in the order A B .. and
        # .. B A, and the median kept (of two, their mean): of two back-to-back timings the second can read several
        # percent low, whichever kernel it is (A/A runs in benchmarks/NOTES.md, fourteenth session), and one timing
        # can stall (fiftieth session), which a median of three or more drops.
        rounds = args.rounds or (2 if len(versions) > 1 else 1)
        order = [c for i in range(rounds) for c in (checked if i % 2 == 0 else checked[::-1])]
        times = {}
        for case, label, run, err in order:
            times.setdefault(case, []).append(bench_gpu(lambda: run(q, k, v, out, lse, causal)))
        for case, label, run, err in checked:
            t = statistics.median(times[case])
            row = dict(kernel=args.kernel, d=d, s=s, causal=causal, **label, tflops=flops / t / 1e12,
                       cudnn_tflops=flops / t_ref / 1e12, vs_cudnn=t_ref / t, fa2_tflops=flops / t_fa2 / 1e12,
                       vs_fa2=t_fa2 / t, max_err=err, tflops_each=[flops / x / 1e12 for x in times[case]])
            rows.append(row)
            each = "  (" + " / ".join(f"{x:.1f}" for x in row["tflops_each"]) + ")" if len(times[case]) > 1 else ""
            print(f"{case}: {row['tflops']:6.1f} TFLOP/s{each}  cudnn {row['cudnn_tflops']:6.1f}  "
                  f"x{row['vs_cudnn']:.3f}  fa2 x{row['vs_fa2']:.3f}  err {err:.1e}", flush=True)
    if args.out:
        save_sweep(args.out, rows)


if __name__ == "__main__":
    main()
