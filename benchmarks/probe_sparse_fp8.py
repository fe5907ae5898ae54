"""A/B of the FP8 sparse decode through `fmha.mla.flash_mla_with_kvcache`: `kernels/sparse_decode_sm90.py` (a
dequantising loader, a scoring warpgroup and a P·V-only one; what the package runs) against `mla_decode_sm90` (the
two-consumer kernel it replaced there), on `fmha bench sparse`'s FP8 decode rows (V3.2 and V4, `--cases`), one
process: outputs checked against `mla_decode_sm90`'s (also with invalid indices and a topk_length), then timed
round-robin from CUDA graphs.

    PYTHONPATH=src python3 benchmarks/probe_sparse_fp8.py [--out probe.json] [--rounds 3] [--cases v32-fp8 v4-fp8]
                                                          [--versions A.py ...] [--no-check]

`--versions` also times copies of `sparse_decode_sm90.py` (e.g. `git show REV:src/fmha/kernels/sparse_decode_sm90.py >
/tmp/a.py`), each launched in place of the package's own.
"""
import argparse
import contextlib

import torch

import fmha.mla as ours_mla
from fmha.bench import SPARSE_DECODE_CASES, _heat, interleaved_times, load_module_copy, save_sweep, sparse_decode_inputs
from fmha.kernels import sparse_decode_sm90


@contextlib.contextmanager
def _patched(name, value):
    saved = getattr(sparse_decode_sm90, name)
    setattr(sparse_decode_sm90, name, value)
    try:
        yield
    finally:
        setattr(sparse_decode_sm90, name, saved)


def _variant(fn, kernel):
    """fn run by `kernel`: "old" (mla_decode_sm90), "new" (the package), or a module copy."""
    def call():
        if kernel == "new":
            return fn()
        if kernel == "old":
            with _patched("supported", lambda *a, **k: None):
                return fn()
        with _patched("sparse_decode_forward_sm90", kernel.sparse_decode_forward_sm90):
            return fn()
    return call


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--versions", nargs="*", default=[])
    ap.add_argument("--cases", nargs="*", default=["v32-fp8", "v4-fp8"])
    ap.add_argument("--no-check", action="store_true", help="time only (experiments that drop work on purpose)")
    args = ap.parse_args()
    kernels = {"old": "old", "new": "new", **{f"v{i}": load_module_copy(p) for i, p in enumerate(args.versions)}}
    rows = []
    for case in [c for c in SPARSE_DECODE_CASES if c[0] in args.cases]:
        name, b, hq, sq, d, layout, topk, page, extra_topk, extra_page = case
        q, cache, lens, sink, kw = sparse_decode_inputs(case, torch.Generator(device="cuda").manual_seed(0))
        meta, splits = ours_mla.get_mla_metadata(lens, sq * hq, 1, num_heads_q=hq, topk=topk)
        # Invalid entries (-1 and past the cache) and a topk_length, in a copy of the call, for the check only.
        bad = kw["indices"].clone()
        bad[..., 5::97] = -1
        bad[..., 7::131] = cache.shape[0] * cache.shape[1] + 3
        length = torch.randint(1, topk + 1, (b,), dtype=torch.int32, device="cuda")
        checks = {"plain": kw, "invalid": dict(kw, indices=bad, topk_length=length)}
        if extra_topk:
            checks["invalid"]["extra_topk_length"] = torch.randint(0, extra_topk + 1, (b,), dtype=torch.int32,
                                                                   device="cuda")
        for label, kw_c in checks.items():
            fn = lambda kw_c=kw_c: ours_mla.flash_mla_with_kvcache(q, cache, None, lens, 512, meta, splits,  # noqa
                                                                  attn_sink=sink, **kw_c)
            o_ref, lse_ref = _variant(fn, "old")()
            for kname, kernel in kernels.items():
                if kname == "old":
                    continue
                o_new, lse_new = _variant(fn, kernel)()
                err_o = (o_new.float() - o_ref.float()).abs().max().item()
                err_l = (lse_new - lse_ref).abs().max().item()
                print(f"{name} h_q={hq} b={b} {kname} {label}: max |out diff| {err_o:.3e}, max |lse diff| {err_l:.3e}",
                      flush=True)
                assert args.no_check or (err_o < 2e-2 and err_l < 1e-3), "outputs differ"
        fn = lambda: ours_mla.flash_mla_with_kvcache(q, cache, None, lens, 512, meta, splits, attn_sink=sink,  # noqa
                                                     **kw)
        calls = {k: _variant(fn, kernel) for k, kernel in kernels.items()}
        flops = 2 * b * sq * hq * (topk + extra_topk) * (d + 512)
        _heat(list(calls.values()))
        times = interleaved_times(calls, args.rounds)
        row = dict(case=name, b=b, hq=hq, sq=sq, topk=topk, extra_topk=extra_topk)
        for k, ts in times.items():
            row[f"{k}_tflops"] = flops / sorted(ts)[len(ts) // 2] / 1e12
        for k in calls:
            row[f"{k}_vs_old"] = row[f"{k}_tflops"] / row["old_tflops"]
        rows.append(row)
        print(f"{name} h_q={hq} b={b}: " + "  ".join(f"{k} {row[f'{k}_tflops']:.1f}" for k in calls) + " TFLOP/s", flush=True)
    if args.out:
        save_sweep(args.out, rows)


if __name__ == "__main__":
    main()
