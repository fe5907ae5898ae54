"""Compile the portable decode forms for sm_90 on the CPU and list those whose registers, not their shared memory,
hold them to fewer programs an SM: where a register cap (`forward._GPU_MAXNREG`, FP8-only entries too) could add
one. No GPU needed; it runs `test_compile_sm90`'s DECODE_SCRIPT (as `split_compile.py` does) once a case, in a
subprocess.

    TRITON_INTERPRET=0 PYTHONPATH=src python3 benchmarks/experiments/occupancy_sweep.py [--dims 64 128]
        [--rows 8 16 32 64] [--jobs 2] [--out sweep.json]

Cases: each head dim x packed rows x {bf16, FP8} x {64-key pages, contiguous}, the tables' tiles (unsplit; seqlen_q
not a constant, as the twin and multi-token calls compile), and the short launch's two forms (bf16, GQA groups 4
and 8, where `_short_tiles` gives a second form), each under the package's register cap where it has one
(`forward._register_cap`). Programs an SM from the registers (65536 a SM, allocated 8 a
thread at a time), from the shared memory (228 KB a SM, 1 KB more a program) and from the warps (64 a SM);
`cap_for_one_more`: the most registers a thread that would fit one more program, where the registers bind (marked
where that is within 15% of what the form takes now). The forms are the unmasked ones: a causal launch can take
more (the d = 64 short launch's two forms: 134 here, 156 in a causal varlen call on the H200,
history/short_cap_d64_h200_8519203.json)."""
import argparse
import concurrent.futures
import datetime
import json
import subprocess
import sys

import split_compile
from fmha.kernels.forward import _short_tiles

SM_REGS, SM_SHARED, PROGRAM_SHARED, SM_WARPS = 65536, 233472, 1024, 64


def decode_script(paged, two_forms):
    """DECODE_SCRIPT (`split_compile.decode_script`) for the case: contiguous where not `paged`, reporting the
    stack too, compiled under the package's register cap."""
    script = split_compile.decode_script()
    script = script.replace("regs=int(re.search", "stack=int(re.search(r'STACK:([0-9]+)', usage).group(1)), "
                            "regs=int(re.search", 1)
    if not paged:
        for old, new in (("paged=True", "paged=False"), ("_short_tiles(d, d, rows, True, False)",
                                                          "_short_tiles(d, d, rows, False, False)"),
                         ("_page_tile(page_size, n)) for m", "0) for m")):
            script = script.replace(old, new)
        script = script.replace("ptrs = dict(Q=", "consts.update(PAGED=False, PAGE_TILE=0)\nptrs = dict(Q=", 1)
    # The package's register cap for the tiles (`forward._register_cap`), as its launch would compile them.
    old = "options=dict(num_warps=warps, num_stages=stages)"
    assert old in script, "DECODE_SCRIPT's compile options moved"
    cap = ("__import__('fmha.kernels.forward', fromlist=['_register_cap'])._register_cap(d, d, (bm, bn, warps, "
           f"stages), {'wide' if two_forms else 'None'}, False, bool(fp8))")
    return script.replace(old, f"options=dict(num_warps=warps, num_stages=stages, maxnreg={cap})")


def programs(regs, shared, warps):
    per_program = warps * 32 * (-(-regs // 8) * 8)
    by_regs = SM_REGS // per_program
    by_shared = SM_SHARED // (shared + PROGRAM_SHARED)
    by_warps = SM_WARPS // warps
    cap = None
    if by_regs < min(by_shared, by_warps):
        cap = SM_REGS // ((by_regs + 1) * warps * 32) // 8 * 8
    return by_regs, by_shared, by_warps, cap


def compile_case(case):
    d, rows, fp8, paged, two_forms = case
    script = decode_script(paged, two_forms)
    arg = json.dumps([d, 64, rows, fp8, [1] if two_forms else []])
    run = subprocess.run([sys.executable, "-c", script, arg], capture_output=True, text=True)
    line = [x for x in run.stdout.splitlines() if x.startswith("{")]
    if not line:
        return dict(d=d, rows=rows, fp8=fp8, paged=paged, two_forms=two_forms, error=run.stderr[-300:])
    got = json.loads(line[-1])
    by_regs, by_shared, by_warps, cap = programs(got["regs"], got["shared"], got["warps"])
    return dict(d=d, rows=rows, fp8=fp8, paged=paged, two_forms=two_forms, **got, by_regs=by_regs,
                by_shared=by_shared, by_warps=by_warps, cap_for_one_more=cap)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dims", type=int, nargs="*", default=[16, 32, 64, 128, 256])
    p.add_argument("--rows", type=int, nargs="*", default=[8, 16, 32, 64])
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    cases = [(d, rows, fp8, paged, False) for d in args.dims for rows in args.rows for fp8 in (False, True)
             for paged in (True, False)]
    cases += [(d, group, False, paged, True) for d in args.dims if d >= 64 for group in (4, 8)
              for paged in (True, False) if _short_tiles(d, d, group, paged, False)[2]]
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        results = list(pool.map(compile_case, cases))
    for r in results:
        if "error" in r:
            print(r)
            continue
        cap = r["cap_for_one_more"]
        flag = f", a cap of {cap} for one more" if cap else ""
        flag += "  <- within 15%" if cap and cap >= 0.85 * r["regs"] else ""
        print(f"d {r['d']:3} rows {r['rows']:2} {'fp8 ' if r['fp8'] else 'bf16'} {'paged' if r['paged'] else 'contig'}"
              f"{' two-forms' if r['two_forms'] else ''}: regs {r['regs']} stack {r['stack']} shared "
              f"{r['shared'] // 1024} KB warps {r['warps']} stages {r['stages']} -> programs an SM by regs "
              f"{r['by_regs']} / shared {r['by_shared']} / warps {r['by_warps']}{flag}", flush=True)
    if args.out:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
        with open(args.out, "w") as f:
            json.dump(dict(target="sm_90 (compiled on the CPU)", date=str(datetime.date.today()), commit=commit,
                           rows=results), f, indent=1)


if __name__ == "__main__":
    main()
