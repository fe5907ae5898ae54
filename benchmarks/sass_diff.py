"""Whether the portable forward kernel compiles to the same sm_90 SASS at another commit: a GPU-free check that a
change left the measured kernels alone (ptxas schedules the same operations apart when the statements move, so
equal Triton IR is not enough; NOTES.md, sixty-fifth session).

Each form is `attn_fwd_kernel` compiled through ASTSource for sm_90 (no GPU needed) in this tree and in a
worktree of REV, with its tiles and options as constants; the SASS from `cuobjdump -sass`, less the instruction
encodings, compared. FP8 forms take the V word reads (`forward.FP8_V_WORDS`) where the tree has them.

    PYTHONPATH=src python3 benchmarks/sass_diff.py REV [--forms bf16 fp8]
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

from fmha.kernels.forward import DECODE_ODD_ARGS

# (name, d, paged, BLOCK_M, BLOCK_N, warps, stages, FP8 cache, softcap and sinks)
FORMS = {
    "bf16": [("decode16-paged", 128, 1, 16, 128, 4, 3, 0, 0), ("decode16-contig", 128, 0, 16, 128, 4, 3, 0, 0),
             ("decode64-paged", 128, 1, 64, 64, 4, 5, 0, 0), ("decode64-paged-opts", 128, 1, 64, 64, 4, 5, 0, 1),
             ("decode64-contig", 128, 0, 64, 128, 4, 2, 0, 0), ("prefill128", 128, 0, 128, 64, 8, 3, 0, 1),
             ("prefill128-d64", 64, 0, 128, 64, 4, 3, 0, 1), ("decode64-paged-d256", 256, 1, 64, 64, 4, 2, 0, 0),
             ("decode16-paged-d64", 64, 1, 16, 128, 2, 3, 0, 0), ("decode16-contig-d64", 64, 0, 16, 64, 4, 4, 0, 0),
             ("decode16-paged-d256", 256, 1, 16, 64, 4, 4, 0, 0), ("decode16-contig-d256", 256, 0, 16, 32, 4, 4, 0, 0)],
    "fp8": [("fp8-16-paged", 128, 1, 16, 64, 2, 6, 1, 0), ("fp8-16-contig", 128, 0, 16, 64, 2, 4, 1, 0),
            ("fp8-32-paged", 128, 1, 32, 64, 2, 6, 1, 0), ("fp8-32-contig", 128, 0, 32, 128, 4, 3, 1, 0),
            ("fp8-16-paged-d256", 256, 1, 16, 64, 2, 3, 1, 0), ("fp8-64-paged", 128, 1, 64, 64, 4, 5, 1, 0),
            ("fp8-64-contig", 128, 0, 64, 128, 4, 3, 1, 0)],
}

COMPILE = r'''
import inspect, json, os, subprocess, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from fmha.kernels import forward
d, paged, bm, bn, warps, stages, fp8, opts, cubin, odd = json.loads(sys.argv[1])
consts = dict(HEAD_DIM_QK=d, HEAD_DIM_V=d, BLOCK_M=bm, BLOCK_N=bn, BLOCK_D=d, BLOCK_DT=16, BLOCK_DV=d,
              HAS_TAIL=False, IS_VARLEN=False, MASK_LEFT=False, MASK_RIGHT=not paged, HAS_SOFTCAP=bool(opts),
              HAS_ALIBI=False, HAS_SINKS=bool(opts), REVERSE_M=False, TMA=0, HAS_SEQLENS_K=bool(paged),
              PAGED=bool(paged), SPLIT=bool(paged), LEFT_PER_BATCH=False,
              PAGE_TILE=forward._page_tile(64, bn) if paged else 0, V_WORDS=getattr(forward, "FP8_V_WORDS", 0)
              if fp8 and bm < 64 else 0, CU_Q=None, CU_K=None, SLOPES=None, K_DESC=None, V_DESC=None,
              WINDOW_LEFTS=None, Q_DESCALE=None, K_STARTS=None)
ptrs = dict(Q="*bf16", K="*fp8e4nv" if fp8 else "*bf16", V="*fp8e4nv" if fp8 else "*bf16", O="*bf16",
            LSE="*fp32", SEQLENS_K="*i32", BLOCK_TABLE="*i32", SINKS="*fp32", K_DESCALE="*fp32",
            V_DESCALE="*fp32")
if not paged:
    consts.update(BLOCK_TABLE=None, SEQLENS_K=None)
if not fp8:
    consts.update(K_DESCALE=None, V_DESCALE=None)
params = inspect.signature(forward.attn_fwd_kernel.fn).parameters
names = list(params)
consts = {n: v for n, v in consts.items() if n in names}      # an older tree without V_WORDS
# constexprs left at their defaults (PAIR): constants, as a real launch's, not runtime arguments
consts.update({n: p.default for n, p in params.items() if n not in consts and p.default is not p.empty})
sig = {n: "constexpr" if n in consts else ptrs.get(n, "fp32" if n in ("qk_scale_log2", "softcap") else "i32")
       for n in names}
attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names)     # as a real decode call's
         if sig[n].startswith("*") or (sig[n] == "i32" and n not in odd)}
src = ASTSource(forward.attn_fwd_kernel, sig, constexprs={(names.index(k),): v for k, v in consts.items()},
                attrs=attrs)
k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=warps, num_stages=stages))
open(cubin, "wb").write(k.asm["cubin"])
print(os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump"))
'''


def sass(tree, form, workdir):
    """The form's SASS compiled from `tree`'s sources, less addresses and encodings."""
    cubin = os.path.join(workdir, "k.cubin")
    env = dict(os.environ, PYTHONPATH=os.path.join(tree, "src"), TRITON_INTERPRET="0")
    odd = sorted(DECODE_ODD_ARGS)     # this tree's list for both trees (an older one may not name it)
    proc = subprocess.run([sys.executable, "-c", COMPILE, json.dumps([*form[1:], cubin, odd])], env=env, cwd=tree,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        return "compile failed: " + proc.stderr[-300:]
    cuobjdump = proc.stdout.strip().splitlines()[-1]
    text = subprocess.run([cuobjdump, "-sass", cubin], capture_output=True, text=True).stdout
    return "\n".join(re.sub(r"/\*[0-9a-f]{4,}\*/", "", line).strip() for line in text.splitlines()
                     if re.search(r"[A-Z]", line))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("rev", help="the commit to compare this tree with")
    p.add_argument("--forms", nargs="*", default=list(FORMS), choices=list(FORMS))
    args = p.parse_args()
    here = subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True, text=True,
                          check=True).stdout.strip()
    with tempfile.TemporaryDirectory() as tmp:
        other = os.path.join(tmp, "tree")
        subprocess.run(["git", "-C", here, "worktree", "add", "-q", "--detach", other, args.rev], check=True)
        try:
            same = 0
            forms = [f for group in args.forms for f in FORMS[group]]
            for form in forms:
                a, b = sass(other, form, tmp), sass(here, form, tmp)
                verdict = "same" if a == b and not a.startswith("compile failed") else "DIFFERS"
                same += verdict == "same"
                print(f"{form[0]:<22} {verdict}  ({len(a.splitlines())} / {len(b.splitlines())} lines)", flush=True)
            print(f"{same} of {len(forms)} forms compile to {args.rev}'s SASS")
        finally:
            subprocess.run(["git", "-C", here, "worktree", "remove", "--force", other], check=True)


if __name__ == "__main__":
    main()
