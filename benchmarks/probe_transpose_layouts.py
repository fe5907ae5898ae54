"""CPU only: an in-kernel FP8 transposition of V in Gluon, register layout by register layout, as ptxas would see it.

    TRITON_INTERPRET=0 PYTHONPATH=src python3 benchmarks/probe_transpose_layouts.py [--keys 128] [--dv 128]
        [--layouts 4,16,16,2,2,1 ...]

For a (keys, dv) e4m3 tile TMA-loaded into a 128-byte-swizzled slot, the snippet an in-kernel transposition would
run: `slot.load(layout)`, `gl.permute(.., [1, 0])`, `.store` into a (dv, keys) slot of the layout wgmma reads. Each
layout is BlockedLayout(size_per_thread, threads_per_warp, warps_per_cta) over (keys, dv), written
spt_k,spt_d,tpw_k,tpw_d,w_k,w_d; it is compiled for sm_90 (no GPU needed) and the PTX between the TMA wait and the
next barrier is read: instructions a thread, and shared-memory wavefronts a warp, found by evaluating the address
arithmetic for each lane of warp 0 (the swizzle is in that arithmetic) and counting, for each access, the distinct
words that fall in one bank (ldmatrix / stmatrix: each 8-lane phase; others: each 128-byte group of lanes). The
ideal is the tile's bytes, read once and written once, over 128 bytes a wavefront. What Triton's lowering picks
(ldmatrix, stmatrix, vector widths) follows from the layouts: NOTES.md, fifty-third session.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

SNIPPET = '''
import json, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import GluonASTSource
from triton.experimental.gluon.language.nvidia.hopper import tma, mbarrier


@gluon.jit
def tr_kernel(x_desc, Y, N: gl.constexpr, D: gl.constexpr, SPT_K: gl.constexpr, SPT_D: gl.constexpr,
              TPW_K: gl.constexpr, TPW_D: gl.constexpr, WK: gl.constexpr, WD: gl.constexpr):
    io: gl.constexpr = gl.BlockedLayout([1, 16], [4, 8], [gl.num_warps(), 1], [1, 0])
    blk: gl.constexpr = gl.BlockedLayout([SPT_K, SPT_D], [TPW_K, TPW_D], [WK, WD], [1, 0])
    staged = gl.allocate_shared_memory(gl.float8e4nv, [N, D], x_desc.layout)
    vt = gl.allocate_shared_memory(gl.float8e4nv, [D, N], gl.NVMMASharedLayout.get_default_for([D, N], gl.float8e4nv))
    bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(bar, count=1)
    mbarrier.expect(bar, x_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(x_desc, [0, 0], bar, staged)
    mbarrier.wait(bar, 0)
    vt.store(gl.permute(staged.load(blk), [1, 0]))
    gl.thread_barrier()
    r = gl.arange(0, D, layout=gl.SliceLayout(1, io))
    c = gl.arange(0, N, layout=gl.SliceLayout(0, io))
    gl.store(Y + r[:, None] * N + c[None, :], vt.load(io))


n, d, spt_k, spt_d, tpw_k, tpw_d, wk, wd = json.loads(sys.argv[1])
layout = gl.NVMMASharedLayout.get_default_for([n, d], gl.float8e4nv)
sig = dict(x_desc=f"tensordesc<fp8e4nv[{n},{d}],{layout!r}>", Y="*fp8e4nv")
consts = dict(N=n, D=d, SPT_K=spt_k, SPT_D=spt_d, TPW_K=tpw_k, TPW_D=tpw_d, WK=wk, WD=wd)
sig.update(dict.fromkeys(consts, "constexpr"))
names = list(sig)
src = GluonASTSource(tr_kernel, sig, constexprs={(names.index(k),): v for k, v in consts.items()})
print(triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=wk * wd)).asm["ptx"])
'''
M = 0xFFFFFFFF
OPS = {"mov": lambda a: a[0], "and": lambda a: a[0] & a[1], "or": lambda a: a[0] | a[1], "xor": lambda a: a[0] ^ a[1],
       "shl": lambda a: (a[0] << a[1]) & M, "shr": lambda a: a[0] >> a[1], "add": lambda a: (a[0] + a[1]) & M,
       "sub": lambda a: (a[0] - a[1]) & M, "neg": lambda a: (-a[0]) & M, "mul": lambda a: (a[0] * a[1]) & M,
       "bfe": lambda a: (a[0] >> a[1]) & ((1 << a[2]) - 1)}


def _bfe_signed(a):
    """bfe.s32: a[2] bits from bit a[1], sign-extended."""
    v = (a[0] >> a[1]) & ((1 << a[2]) - 1)
    return (v - (1 << a[2])) & M if v >> (a[2] - 1) & 1 else v


def registers(text, lane):
    """The integer registers of `text` (PTX) that depend only on %tid.x = lane and constants (global_smem = 0)."""
    regs = {"%tid.x": lane, "global_smem": 0}
    for line in text.splitlines():
        m = re.match(r"\s*(\w+)((?:\.\w+)*)\s+(%r\d+),\s*(.*);", line)
        if not m or m.group(1) not in OPS:
            continue
        op = _bfe_signed if m.group(1) == "bfe" and ".s32" in m.group(2) else OPS[m.group(1)]
        args = []
        for x in m.group(4).split(","):
            x = x.strip()
            args.append(regs[x] if x in regs else int(x, 0) & M if re.fullmatch(r"-?(0x)?[0-9a-fA-F]+", x) else None)
        if None not in args:
            regs[m.group(3)] = op(args)
    return regs


def wavefronts(ptx):
    """(instructions a thread, shared-memory wavefronts a warp, the ideal) between the TMA wait and the barrier."""
    i = ptx.index("mbarrier.try_wait")
    j = ptx.index("bar.sync", i)
    body = ptx[i:j]
    lanes = [registers(ptx[:j], lane) for lane in range(32)]
    instrs = len(re.findall(r"^\s*[a-z]+\.\S*\s", body, re.M))
    actual = ideal = 0
    for op, reg, imm in re.findall(r"^\s*((?:ld|st)\.shared\S*|ldmatrix\S*|stmatrix\S*)\s.*?\[(%r\d+)(?:\+(\d+))?\]",
                                   body, re.M):
        addr = [lane[reg] + int(imm or 0) for lane in lanes]
        if "matrix" in op:
            width, phases = 16, [range(8 * p, 8 * p + 8) for p in range(int(re.search(r"\.x(\d)", op).group(1)))]
        else:
            v = re.search(r"\.v(\d)", op)
            width = {"b8": 1, "b16": 2, "b32": 4, "b64": 8}[op.split(".")[-1]] * (int(v.group(1)) if v else 1)
            per = 128 // max(width, 4)
            phases = [range(p, p + per) for p in range(0, 32, per)]
        for ph in phases:
            banks = {}
            for lane in ph:
                for w in range(max(1, width // 4)):
                    word = (addr[lane] + 4 * w) // 4
                    banks.setdefault(word % 32, set()).add(word)
            actual += max(len(words) for words in banks.values())
            ideal += 1
    return instrs, actual, ideal


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--keys", type=int, default=128)
    p.add_argument("--dv", type=int, default=128)
    p.add_argument("--layouts", nargs="*", default=None, help="spt_k,spt_d,tpw_k,tpw_d,w_k,w_d (default: a sweep)")
    a = p.parse_args()
    if a.layouts:
        layouts = [tuple(int(x) for x in s.split(",")) for s in a.layouts]
    else:
        layouts = [(sk, sd, tk, 32 // tk, 2, 1) for sk, sd in ((4, 4), (4, 8), (8, 4), (4, 16), (16, 4), (8, 8))
                   for tk in (1, 2, 4, 8, 16, 32)]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:      # a @gluon.jit function must live in a file
        script = os.path.join(tmp, "transpose_snippet.py")
        open(script, "w").write(SNIPPET)
        for lay in layouts:
            row = measure(script, [a.keys, a.dv, *lay])
            if row is not None:
                rows.append(row)
    print("best:", *(f"{lay} {act}/{ideal} wavefronts, {ins} instr" for act, ins, lay, ideal in sorted(rows)[:3]),
          sep="\n  ")


def measure(script, case):
    """(wavefronts, instructions, layout, ideal) of one case, printed; None when it does not compile."""
    lay = tuple(case[2:])
    proc = subprocess.run([sys.executable, script, json.dumps(case)], capture_output=True, text=True)
    if proc.returncode:
        print(f"{lay}: does not compile ({proc.stderr.strip().splitlines()[-1][:100]})", flush=True)
        return None
    instrs, actual, ideal = wavefronts(proc.stdout)
    print(f"{lay}: {instrs} instructions a thread, {actual} shared wavefronts a warp (ideal {ideal})", flush=True)
    return actual, instrs, lay, ideal


if __name__ == "__main__":
    main()
