"""`fmha run` (test-and-time one case, like TensorRT-LLM's fmha.exe) and `fmha bench` (us vs every peer).

Without a GPU, `fmha run` switches Triton to its CPU interpreter and runs a small default case.
"""
from __future__ import annotations

import argparse
import sys


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _parse_window(text):
    try:
        left, right = (int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--window expects L,R (two ints), got {text!r}")
    return left, right


def _int_at_least(low):
    """An argparse type: an int >= low (a bad value ends the run with argparse's usage error, code 2)."""
    def parse(text):
        value = int(text)
        if value < low:
            raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {value}")
        return value

    parse.__name__ = "int"                  # argparse names the type so in its "invalid int value" message
    return parse


def _run_parser():
    p = argparse.ArgumentParser(prog="fmha run", add_help=False,
                                description="Run one attention case, check it against the fp32 oracle, time it.")
    p.add_argument("--help", action="help", help="show this help and exit")
    count, length = _int_at_least(1), _int_at_least(0)
    p.add_argument("-b", type=count, default=None, help="batch size")
    p.add_argument("-h", type=count, default=None, dest="heads", help="query heads")
    p.add_argument("-h-kv", type=count, default=None, dest="heads_kv", help="KV heads (default: = -h)")
    p.add_argument("-s", type=length, default=None, dest="seqlen", help="sequence length (keys)")
    p.add_argument("-s-q", type=length, default=None, dest="seqlen_q", help="query length (default: = -s)")
    p.add_argument("-d", type=count, default=None, dest="head_dim", help="head dim of q/k")
    p.add_argument("-dv", type=count, default=None, dest="head_dim_v", help="head dim of v (default: = -d)")
    p.add_argument("--causal", action="store_true", help="bottom-right causal mask")
    p.add_argument("--window", type=_parse_window, default=(-1, -1), help="sliding window L,R (-1 = unbounded)")
    p.add_argument("--softcap", type=float, default=0.0, help="tanh soft-capping of the scores (0 = off)")
    p.add_argument("--alibi", action="store_true", help="ALiBi with the standard geometric slopes")
    p.add_argument("--sinks", action="store_true", help="one random attention-sink logit per query head")
    p.add_argument("--paged", type=length, default=0, metavar="P", help="paged KV cache with page size P (0 = off)")
    p.add_argument("--dtype", choices=("fp16", "bf16", "fp8"), default=None,
                   help="input dtype (fp8: e4m3 q/k/v with per-(batch, KV head) descales, bf16 output)")
    p.add_argument("--runs", type=count, default=20, help="timed runs")
    p.add_argument("--warmup", type=length, default=5, help="untimed runs first")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("-v", action="store_true", dest="verbose",
                   help="print each kernel the call launches, with its grid and constexprs")
    return p


def _alibi_slopes(heads):
    """The ALiBi paper's slopes: geometric 2^(-8 i / n); for n not a power of two, the nearest power's
    slopes followed by every other slope of twice that power."""
    import torch

    def geometric(n):
        return [2 ** (-8 * (i + 1) / n) for i in range(n)]

    p = 1 << (heads.bit_length() - 1)
    slopes = geometric(p) + geometric(2 * p)[0::2][: heads - p]
    return torch.tensor(slopes, dtype=torch.float32)


def run_main(argv):
    args = _run_parser().parse_args(argv)
    gpu = _has_cuda()
    if not gpu:
        # Importing fmha already switched Triton to its interpreter, which evaluates log(0) in numpy for
        # rows with no key: that -inf is intended.
        import warnings
        warnings.filterwarnings("ignore", category=RuntimeWarning)
    import torch

    from .bench import paged_copy, quantize_fp8, time_fn
    from .reference import attention_ref

    small = not gpu
    b = args.b or (1 if small else 2)
    hq = args.heads or (4 if small else 16)
    hk = args.heads_kv or hq
    sk = args.seqlen if args.seqlen is not None else (96 if small else 4096)
    sq = args.seqlen_q if args.seqlen_q is not None else sk
    d = args.head_dim or (64 if small else 128)
    dv = args.head_dim_v or d
    dtype_name = args.dtype or ("fp16" if small else "bf16")
    if small and dtype_name == "bf16":
        print("note: bf16 arithmetic is wrong in the Triton interpreter; expect FAILED on the CPU")
    device = "cuda" if gpu else "cpu"
    torch.manual_seed(args.seed)
    fp8 = dtype_name == "fp8"
    # fp8: FMHA_v2's e4m3 inputs, here quantised per (batch, KV head) with FlashAttention-3's descales; the output
    # is bf16 (the portable kernel widens each tile on load and computes in fp16; on Hopper the Gluon kernel runs
    # e4m3 tensor cores with P in e4m3, as FlashAttention-3).
    dtype = torch.float32 if fp8 else {"fp16": torch.float16, "bf16": torch.bfloat16}[dtype_name]
    q = torch.randn(b, sq, hq, d, device=device, dtype=dtype)
    k = torch.randn(b, sk, hk, d, device=device, dtype=dtype)
    v = torch.randn(b, sk, hk, dv, device=device, dtype=dtype)
    descales = {}
    if fp8:
        (q, descales["q_descale"]), (k, descales["k_descale"]), (v, descales["v_descale"]) = (
            quantize_fp8(t, hk) for t in (q, k, v))
    options = dict(causal=args.causal, window=args.window, softcap=args.softcap)
    if args.alibi:
        options["alibi_slopes"] = _alibi_slopes(hq).to(device)
    if args.sinks:
        options["sinks"] = torch.randn(hq, device=device)

    import fmha

    where = "GPU " + torch.cuda.get_device_name() if gpu else "CPU, Triton interpreter (no GPU found)"
    print(f"fmha run on {where}: b={b} h={hq} h_kv={hk} s_q={sq} s={sk} d={d} dv={dv} {dtype_name} "
          + " ".join(f"{k}={v}" for k, v in options.items() if k in ("causal", "window", "softcap") and v not in
                     (False, (-1, -1), 0.0)) + (" alibi" if args.alibi else "") + (" sinks" if args.sinks else "")
          + (f" paged={args.paged}" if args.paged else ""))

    if not args.paged:
        def ours():
            return fmha.attention(q, k, v, return_lse=True, **options, **descales)
    else:
        # The same keys in a paged cache, pages in shuffled order, through attention_with_kvcache.
        k_cache, v_cache, table = paged_copy(args.paged, k, v)
        seqlens = torch.full((b,), sk, dtype=torch.int32, device=device)

        def ours():
            return fmha.attention_with_kvcache(q, k_cache, v_cache, seqlens, block_table=table, return_lse=True,
                                               **options, **descales)

    from .kernels import launch
    launch.RECORD = [] if args.verbose else None        # -v: the kernels the call launches
    try:
        out, lse = ours()
    except (ValueError, TypeError) as error:     # fmha's checks of the case, raised before any launch
        print(f"fmha run: {error}")
        return 2
    finally:
        record, launch.RECORD = launch.RECORD or (), None
    for name, grid, meta in record:
        print(f"launch: {name} grid {grid} " + " ".join(f"{k}={v}" for k, v in meta.items()))
    ref, ref_lse = attention_ref(q, k, v, **options, **descales)
    err = (out.float() - ref).abs()
    max_err = err.max().item() if err.numel() else 0.0
    cos = (torch.nn.functional.cosine_similarity(out.double().flatten(), ref.double().flatten(), dim=0).item()
           if ref.any() or out.any() else 1.0)            # (both all zero, as when no row sees a key: equal)
    atol, rtol = (4e-3, 1e-2) if out.dtype == torch.float16 else (3e-2, 3e-2)
    if fp8:
        # e4m3 P (the Gluon kernel) is within 2^-4 of the exact one, so an output is within 2^-4 max |v| of the
        # oracle's (`tests/utils.assert_matches_fp8_p` has the whole bound); a row with few keys (the
        # first causal rows) can reach it.
        if v.numel():
            atol += 2.0 ** -4 * (v.float() * descales["v_descale"][:, None, :, None]).abs().max().item()
    ok = (not torch.isnan(out).any().item() and bool((err <= atol + rtol * ref.abs()).all())
          and torch.equal(torch.isneginf(lse), torch.isneginf(ref_lse)))
    print(f"Checks: {'SUCCESS' if ok else 'FAILED'} (max abs err {max_err:.3e}, cos diff {1 - cos:.3e})")

    runs, warmup = (args.runs, args.warmup) if gpu else (min(args.runs, 2), min(args.warmup, 1))
    t_ours = time_fn(ours, runs=runs, warmup=warmup)
    t_ref = time_fn(lambda: attention_ref(q, k, v, **options, **descales), runs=max(1, runs // 4), warmup=1)
    from .bench import attention_flops
    flops = attention_flops(b, sq, sk, hq, d, dv, options["window"], args.causal)
    nbytes = sum(t.numel() * t.element_size() for t in (q, k, v, out))
    print(f"Elapsed: {t_ours * 1e6:.1f} us ({t_ref / t_ours:.3g}x vs reference), "
          f"{flops / t_ours / 1e12:.3g} TFLOP/s, {nbytes / t_ours / 1e9:.3g} GB/s"
          + ("" if gpu else "  [interpreter wall time: not kernel speed]"))
    return 0 if ok else 1


def bench_main(argv):
    from .bench import main as bench

    return bench(argv)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    usage = "usage: fmha {run,bench} [options]   (fmha run --help, fmha bench --help)"
    if not argv or argv[0] in ("-h", "--help"):
        print(usage)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command == "run":
        return run_main(rest)
    if command == "bench":
        return bench_main(rest)
    print(usage)
    return 2


if __name__ == "__main__":
    sys.exit(main())
