"""Compile the forward kernel for sm_90 on a machine with no GPU (Triton's bundled ptxas), so errors that
the interpreter cannot see (non-constexpr globals, unsupported ops, shared memory over the limit) fail CI.
It also checks that the Hopper instructions we rely on are there: wgmma, and TMA for descriptor loads."""
import itertools
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

# Each compile script runs with the interpreter off, so in a process of its own (Triton reads TRITON_INTERPRET when
# the kernels are defined). The cases of one test function share one such process (`compiled`): the imports of torch,
# Triton and the package took ~2.5 s a process, about a third of these tests' CPU time.
RUNNER = textwrap.dedent('''
    import contextlib, io, json, sys, traceback
    script, args = json.load(sys.stdin)
    code = compile(script, "<compile script>", "exec")
    for arg in args:
        sys.argv = ["-c", json.dumps(arg)]
        out = io.StringIO()
        err = None
        try:
            with contextlib.redirect_stdout(out):
                exec(code, {"__name__": "__main__"})
        except BaseException:
            err = traceback.format_exc()
        print("@@case " + json.dumps([arg, out.getvalue(), err]), flush=True)
''')
# Under pytest-xdist with `--dist loadgroup` (the CPU default, `conftest.pytest_cmdline_main`) one worker runs all of
# this file's cases, so the sharing holds there too; under other `--dist` modes each case runs alone.
pytestmark = pytest.mark.xdist_group("compile_sm90")
_RESULTS = {}           # (script, JSON of its argument) -> (what it printed, its traceback or None)
_TRIED = set()          # (script, JSON of its argument) run in a process already


def _run_scripts(script, args):
    """Run `script` once for each argument in `args` (its `sys.argv[1]`, as JSON) in one process, into `_RESULTS`."""
    _TRIED.update((script, json.dumps(a)) for a in args)
    env = dict(os.environ, TRITON_INTERPRET="0")
    proc = subprocess.run([sys.executable, "-c", RUNNER], input=json.dumps([script, args]), env=env,
                          capture_output=True, text=True, timeout=600 * len(args))
    for line in proc.stdout.splitlines():
        if line.startswith("@@case "):
            arg, out, err = json.loads(line[len("@@case "):])
            _RESULTS[script, json.dumps(arg)] = out, err
    return proc.stderr


def compiled(request, script, arg_of):
    """The JSON that `script` prints last when run, with the interpreter off, on `arg_of(params)` for this test's
    parameters; the first case of a test function to run also runs its other selected cases' (one process; under
    pytest-xdist only with `--dist loadgroup`, else the workers share the cases out). A case whose process died is
    run again alone."""
    key = json.dumps(arg_of(request.node.callspec.params))
    if (script, key) not in _RESULTS:
        args = [key]
        grouped = "PYTEST_XDIST_WORKER" not in os.environ or getattr(request.config.option, "loadgroup", False)
        if grouped and (script, key) not in _TRIED:
            siblings = (json.dumps(arg_of(item.callspec.params)) for item in request.session.items
                        if getattr(item, "function", None) is request.function)
            args = [a for a in dict.fromkeys([key, *siblings]) if (script, a) not in _TRIED]
        stderr = _run_scripts(script, [json.loads(a) for a in args])
        if (script, key) not in _RESULTS and len(args) > 1:
            stderr = _run_scripts(script, [json.loads(key)])
        assert (script, key) in _RESULTS, stderr[-3000:]
    out, err = _RESULTS.pop((script, key))
    assert err is None, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


SCRIPT = textwrap.dedent('''
    import inspect, json, sys
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from fmha.kernels.forward import attn_fwd_kernel, _GPU_TILES, _split_head_dim
    d, dv, use_tma, causal, varlen, paged, fp8 = json.loads(sys.argv[1])
    bm, bn, warps, stages = _GPU_TILES[max(d, dv) if max(d, dv) in _GPU_TILES else 1024]
    block_d, block_dt = _split_head_dim(d)
    consts = dict(HEAD_DIM_QK=d, HEAD_DIM_V=dv, BLOCK_M=bm, BLOCK_N=bn, BLOCK_D=block_d, BLOCK_DT=max(block_dt, 16),
                  BLOCK_DV=triton.next_power_of_2(dv), HAS_TAIL=block_dt > 0, IS_VARLEN=varlen, MASK_LEFT=False,
                  MASK_RIGHT=causal, HAS_SOFTCAP=True, HAS_ALIBI=True, HAS_SINKS=True, REVERSE_M=causal,
                  TMA=1 if use_tma else 0, HAS_SEQLENS_K=paged, PAGED=paged, SPLIT=paged, LEFT_PER_BATCH=varlen,
                  PAGE_TILE=bn if paged else 0, V_WORDS=0)      # the 128-row (wgmma) forms read V as it is
    if varlen:
        consts.update(MASK_LEFT=True)           # the per-sequence sliding window
    else:
        consts.update(CU_Q=None, CU_K=None)     # as a padded call's launch passes them
    if paged:                                   # split, its parts merged in the kernel (4 a round)
        consts.update(MERGE_PARTS=4)
    else:
        consts.update(O_PART=None, LSE_PART=None, COUNTER=None)
    # fp8: "qkv" (float8 q, k, v and their descales) or "kv" (an FP8 KV cache beside bf16 q), else "".
    kv_t = "*fp8e4nv" if fp8 else "*bf16"
    ptrs = dict(Q="*fp8e4nv" if fp8 == "qkv" else "*bf16", K=kv_t, V=kv_t, O="*bf16", LSE="*fp32", CU_Q="*i32",
                CU_K="*i32", SLOPES="*fp32", SINKS="*fp32", K_DESC="constexpr", V_DESC="constexpr", SEQLENS_K="*i32",
                BLOCK_TABLE="*i32", WINDOW_LEFTS="*i32", O_PART="*fp32", LSE_PART="*fp32", COUNTER="*i32")
    params = inspect.signature(attn_fwd_kernel.fn).parameters
    names = list(params)
    consts.update(K_DESC=None, V_DESC=None, K_STARTS=None)
    # constexprs left at their defaults (PAIR): constants, as a real launch's, not runtime arguments
    consts.update({n: p.default for n, p in params.items() if n not in consts and p.default is not p.empty})
    for name in ("Q_DESCALE", "K_DESCALE", "V_DESCALE"):
        if fp8 and (fp8 == "qkv" or name != "Q_DESCALE"):
            ptrs[name] = "*fp32"
        else:
            consts[name] = None
    sig = {n: ptrs.get(n, "constexpr" if n in consts else ("fp32" if n in ("qk_scale_log2", "softcap") else "i32"))
           for n in names}
    src = ASTSource(attn_fwd_kernel, sig, constexprs={(names.index(k),): v for k, v in consts.items()})
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=warps, num_stages=stages))
    ptx = k.asm["ptx"]
    print(json.dumps(dict(shared=k.metadata.shared, wgmma="wgmma" in ptx, tma="cp.async.bulk.tensor" in ptx)))
''')


@pytest.mark.cpu
@pytest.mark.parametrize("case", [(128, 128, True, True, False, False, ""), (64, 64, False, False, True, False, ""),
                                  (576, 512, False, True, False, False, ""), (128, 128, False, True, False, True, ""),
                                  (128, 128, True, True, False, False, "qkv"), (64, 64, False, False, True, False, "qkv"),
                                  (128, 128, False, True, False, True, "kv")],
                         ids=["d128-tma-causal", "d64-varlen", "d576", "d128-paged-split", "d128-tma-causal-fp8",
                              "d64-varlen-fp8", "d128-paged-split-fp8-kv"])
def test_compiles_for_sm90(case, request):
    info = compiled(request, SCRIPT, lambda p: p["case"])
    assert info["wgmma"], "no wgmma in the PTX: tl.dot did not lower to Hopper's tensor-core path"
    assert info["tma"] == case[2]
    assert info["shared"] <= 232448, f"shared memory {info['shared']} over the H100 limit"


DECODE_SCRIPT = textwrap.dedent('''
    import inspect, json, os, re, subprocess, sys, tempfile
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from fmha.kernels.forward import (attn_fwd_kernel, _tile_config, _page_tile, _short_tiles, DECODE_ODD_ARGS,
                                      v_words_mode)
    d, page_size, rows, fp8, two_forms = json.loads(sys.argv[1])
    bm, bn, warps, stages = _tile_config(d, d, False, rows=rows, paged=True, kv_fp8=bool(fp8))
    if two_forms:                 # a short launch of packed sequences, group `rows`, in its forms (`_short_tiles`)
        _, (bm, bn, warps, stages), wide = _short_tiles(d, d, rows, True, False)
    consts = dict(HEAD_DIM_QK=d, HEAD_DIM_V=d, BLOCK_M=bm, BLOCK_N=bn, BLOCK_D=d, BLOCK_DT=16, BLOCK_DV=d,
                  HAS_TAIL=False, IS_VARLEN=False, MASK_LEFT=False, MASK_RIGHT=False, HAS_SOFTCAP=False,
                  HAS_ALIBI=False, HAS_SINKS=False, REVERSE_M=False, TMA=0, HAS_SEQLENS_K=True, PAGED=True,
                  SPLIT=False, LEFT_PER_BATCH=False, PAGE_TILE=_page_tile(page_size, bn),
                  V_WORDS=v_words_mode(bool(fp8), bm),
                  CU_Q=None, CU_K=None, SLOPES=None, SINKS=None, K_DESC=None, V_DESC=None, WINDOW_LEFTS=None,
                  Q_DESCALE=None, K_DESCALE=None, V_DESCALE=None, K_STARTS=None)
    ptrs = dict(Q="*bf16", K="*bf16", V="*bf16", O="*bf16", LSE="*fp32", SEQLENS_K="*i32", BLOCK_TABLE="*i32",
                O_PART="*fp32", LSE_PART="*fp32", COUNTER="*i32")
    if not consts["SPLIT"]:
        consts.update(O_PART=None, LSE_PART=None, COUNTER=None)
    if two_forms:
        consts.update(IS_VARLEN=True, SHORT_ONLY=True,
                      WIDE=tuple((m, n, s, _page_tile(page_size, n)) for m, n, _, s in wide))
        del consts["CU_Q"]
        ptrs["CU_Q"] = "*i32"
    if fp8:                       # an FP8 cache beside bf16 queries
        ptrs.update(K="*fp8e4nv", V="*fp8e4nv", K_DESCALE="*fp32", V_DESCALE="*fp32")
        del consts["K_DESCALE"], consts["V_DESCALE"]
    params = inspect.signature(attn_fwd_kernel.fn).parameters
    names = list(params)
    consts.update({n: p.default for n, p in params.items() if n not in consts and p.default is not p.empty})
    sig = {n: "constexpr" if n in consts else ptrs.get(n, "fp32" if n in ("qk_scale_log2", "softcap") else "i32")
           for n in names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names)     # as a real decode call's
             if sig[n].startswith("*") or (sig[n] == "i32" and n not in DECODE_ODD_ARGS)}
    src = ASTSource(attn_fwd_kernel, sig, constexprs={(names.index(k),): v for k, v in consts.items()}, attrs=attrs)
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=warps, num_stages=stages))
    ptx = k.asm["ptx"]
    # Registers a thread, from the cubin (Triton's bundled cuobjdump).
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(k.asm["cubin"])
        f.flush()
        tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
        usage = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True, check=True).stdout
    print(json.dumps(dict(shared=k.metadata.shared, stages=stages, cp_async=ptx.count("cp.async.cg"),
                          wgmma=ptx.count("wgmma.mma_async"), mma_sync=ptx.count("mma.sync.aligned"),
                          v_trans="ldmatrix.sync.aligned.m8n8.x4.trans" in ptx, prmt=ptx.count("prmt.b32"),
                          warps=warps, regs=int(re.search(r"REG:([0-9]+)", usage).group(1)))))
''')


@pytest.mark.cpu
@pytest.mark.parametrize("case", [(128, 16, 4, 2, False), (128, 64, 4, 2, False), (128, 16, 32, 2, False),
                                  (128, 64, 32, 2, False), (64, 16, 4, 4, False), (256, 64, 32, 2, False),
                                  (256, 64, 4, 2, False), (128, 16, 4, 4, True), (128, 64, 32, 4, True),
                                  (256, 64, 4, 4, True), (256, 64, 32, 2, True), (128, 16, 4, 2, False, True),
                                  (128, 64, 8, 2, False, True), (64, 64, 32, 4, False), (64, 64, 32, 4, True),
                                  (128, 64, 64, 2, True)],
                         ids=["d128-p16", "d128-p64", "d128-p16-rows32", "d128-p64-rows32", "d64-p16",
                              "d256-p64-rows32", "d256-p64", "d128-p16-fp8", "d128-p64-rows32-fp8", "d256-p64-fp8",
                              "d256-p64-rows32-fp8", "d128-p16-short-g4", "d128-p64-short-g8", "d64-p64-rows32",
                              "d64-p64-rows32-fp8", "d128-p64-rows64-fp8"])
def test_paged_decode_tiles_fit_per_sm(case, request):
    """The paged decode tiles (64 rows and 5 stages at d <= 128, d = 64: 3, 7 split; 16 rows, 128 keys and 3 stages for
    at most 16 packed rows at d = 128) exist for their pipelining, and are only worth it while two programs still fit on
    an SM: check both, the K/V loads pipelined as cp.async, and the shared memory within an H100 SM's 228 KB (less 1 KB
    the driver reserves per program) and the registers within its 64K for that many programs, with a bf16 or an FP8
    cache (its tiles widened after the load). (d=256 past 16 rows: 32 keys and 3 stages, ~98 KB and 255 registers, two
    an SM; at most 16 rows, 64 keys and 4 stages, ~74 KB, two an SM. An FP8 cache with at most 16 rows: 2 warps, 64 keys
    and 6 stages, the FP8 tile sweep's pick, ~39 KB, and four programs an SM, as `plan_num_splits` counts 2-warp
    programs; with 17-32 rows the same in 32-row tiles, four an SM too; at d = 256, 2 warps, 64 keys and 3 stages,
    ~42 KB, four an SM, and with 17-32 rows 4 warps, 128 keys and 2 stages, ~88 KB and 255 registers, two an SM; at
    d = 64 with 17-32 rows, 2 warps, 128 keys and 4 stages, ~20 KB and 255 registers, four an SM; at d = 128 with
    33-64 rows, the 64-row wgmma form of 128 keys and 3 stages, ~115 KB, two an SM. A bf16 cache at d = 64 with at
    most 16 rows: 2 warps, 128 keys and 3 stages, ~39 KB, four an SM, as its 255 registers allow; with 17-32 rows,
    2 warps, 64 keys and 6 stages, ~41 KB, four an SM.) And the short launch of a varlen call
    (`forward._short_tiles`, GQA groups of 4 and 8 at d = 128): the narrow form and the 64-row one in one kernel,
    their buffers sharing the shared memory (the 64-row form's ~113 KB), still two an SM."""
    d, page_size, rows, programs, fp8, *two_forms = case
    info = compiled(request, DECODE_SCRIPT, lambda p: [*p["case"][:3], p["case"][4], list(p["case"][5:])])
    assert info["cp_async"] > 0, info
    assert programs * (info["shared"] + 1024) <= 233472, info
    # and within an SM's 64K registers (allocated 8 a thread at a time, a warp's whole)
    assert programs * info["warps"] * 32 * -(-info["regs"] // 8) * 8 <= 65536, info
    if two_forms:
        assert info["wgmma"] > 0 and info["mma_sync"] > 0, info
    if fp8 and not info["wgmma"]:   # the mma.sync forms read V as 16-bit words: transposed by ldmatrix, its bytes
        # paired by permutes (`_fp8_word_halves`)
        assert info["v_trans"] and info["prmt"] > 0, info


MLA_SCRIPT = textwrap.dedent('''
    import inspect, json, sys
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from fmha.kernels.mla_decode import mla_decode_kernel, _tile_config
    tma, causal, rows, sparse, fp8 = json.loads(sys.argv[1])
    bm, bn, warps, stages, transposed = _tile_config(rows, False)
    consts = dict(BLOCK_M=bm, BLOCK_N=bn, HALF=256, DT=64, HAS_ROPE=fp8 != 2, CAUSAL=causal, TMA=tma,
                  TRANSPOSED=transposed, HAS_SINKS=True, SPARSE=sparse, FP8=fp8, SCHED_BLOCK=64,
                  SCHED_FIELDS=8, HAS_MAX=sparse and not fp8, EXTRA=sparse and fp8 == 2)
    # sparse bf16 is the sparse prefill form; sparse model1 is V4's, with the extra source.
    # fp8 == 2 is model1: d_qk = d_v = 512, no separate rope part.
    ptrs = dict(Q_LAT="*bf16", Q_ROPE="*bf16", KV_LAT="*bf16", K_ROPE="*bf16", O="*bf16", LSE="*fp32",
                O_PART="*fp32", LSE_PART="*fp32", MAX_LOGITS="*fp32", BLOCK_TABLE="*i32", SEQLENS="*i32", SCHED="*i32",
                SPLIT_OFFSETS="*i32", SINKS="*fp32", VALID_LENS="*i32", X_TABLE="*i32", X_VALID="*i32", X_LAT="*bf16", X_ROPE="*bf16",
                LAT_DESC=f"tensordesc<bf16[{bn},256]>",
                ROPE_DESC=f"tensordesc<bf16[{bn},64]>")
    if fp8:
        ptrs.update(KV_LAT="*u8", K_ROPE="*u8", X_LAT="*u8", X_ROPE="*u8")
    names = list(inspect.signature(mla_decode_kernel.fn).parameters)
    sig = {n: ptrs.get(n, "constexpr" if n in consts else ("fp32" if n == "qk_scale_log2" else "i32"))
           for n in names}
    if not tma:
        sig.update(LAT_DESC="constexpr", ROPE_DESC="constexpr")
        consts.update(LAT_DESC=None, ROPE_DESC=None)
    src = ASTSource(mla_decode_kernel, sig, constexprs={(names.index(k),): v for k, v in consts.items()})
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=warps, num_stages=stages))
    ptx = k.asm["ptx"]
    print(json.dumps(dict(shared=k.metadata.shared, wgmma="wgmma" in ptx, tma="cp.async.bulk.tensor" in ptx)))
''')


@pytest.mark.cpu
@pytest.mark.parametrize("tma,causal,rows,sparse,fp8", [(True, True, 128, False, 0), (False, False, 64, False, 0),
                                                       (True, True, 16, False, 0), (False, False, 128, True, 1),
                                                       (False, True, 64, False, 1), (False, False, 128, True, 0),
                                                       (False, False, 128, True, 2)],
                         ids=["mla-tma-causal", "mla-gather", "mla-transposed", "mla-sparse-fp8", "mla-fp8",
                              "mla-sparse-prefill", "mla-sparse-model1"])
def test_mla_compiles_for_sm90(tma, causal, rows, sparse, fp8, request):
    info = compiled(request, MLA_SCRIPT, lambda p: [p[n] for n in ("tma", "causal", "rows", "sparse", "fp8")])
    assert info["wgmma"] and info["tma"] == tma
    assert info["shared"] <= 232448, f"shared memory {info['shared']} over the H100 limit"


# Appended to the Gluon compile scripts: ptxas on the kernel's PTX, and what it said about serialising wgmma
# ("wgmma.mma_async instructions are serialized due to ...", its C751x warnings: a wait after every wgmma) and
# about spills.
SERIALIZED = textwrap.dedent('''
    def ptxas_log(ptx):
        import os, subprocess, tempfile
        ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
        with tempfile.TemporaryDirectory() as tmp:
            open(os.path.join(tmp, "k.ptx"), "w").write(ptx)
            return subprocess.run([ptxas, "-arch=sm_90a", "-v", os.path.join(tmp, "k.ptx"), "-o",
                                   os.path.join(tmp, "k.o")], capture_output=True, text=True).stderr

    def serialized(ptx):
        import re
        return sorted(set(re.findall(r"instructions are serialized due to ([^']*)'", ptxas_log(ptx))))

    def spills(ptx):
        import re
        return int(re.search(r"(\\d+) bytes spill stores", ptxas_log(ptx)).group(1))
''')


GLUON_SCRIPT = textwrap.dedent('''
    import inspect, json, sys
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon._runtime import GluonASTSource
    from fmha.kernels.forward_sm90 import (attn_fwd_sm90_kernel, PAGED_REGS, _PAIR_TILES, _QK_PART, _TILES,
                                           _WIDE_TILES, _ROWS, TRANSPOSE_REGS, tma_store, transpose_in_kernel)
    case = json.loads(sys.argv[1]) + [False] * 11
    d, causal, dt, wide, offsets_64, varlen, window, sinks, softcap, lefts, cache, alibi, pack, transpose = case[:14]
    store = case[14]              # a head dim run padded to d (`padded_dims`): its own (0: d's own); 4-D boxes
    dv = case[15] or {192: 128}.get(d, d)         # head_dim_v: d's, 128 beside 192, or the case's
    bn, stages, q_bufs, regs, wgs = _PAIR_TILES.get((d, dv)) or (_WIDE_TILES if wide else _TILES)[d]
    if cache == 2:                # as `choose_tiles` for a paged cache
        regs = min(regs, PAGED_REGS)
    el = {"bf16": gl.bfloat16, "fp16": gl.float16, "fp8e4nv": gl.float8e4nv}[dt]
    fp8 = dt == "fp8e4nv"         # FP8 q, k, v: V transposed, the descales, a bf16 output
    assert not transpose or (fp8 and transpose_in_kernel(d, wgs, varlen))   # FP8 V transposed in the kernel
    if transpose:
        regs = min(regs, TRANSPOSE_REGS)

    def desc(rows, width):
        box = [1, rows, 1, width] if store else [1, rows, width]
        layout = gl.NVMMASharedLayout.get_default_for(box, el)
        return f"tensordesc<{dt}[{','.join(map(str, box))}],{layout!r}>"
    consts = dict(BLOCK_N=bn, HEAD_D=d, HEAD_DV=dv, DV_STORE=store or dv, STAGES=stages, Q_BUFS=q_bufs, CAUSAL=causal,
                  PINGPONG=not causal and wgs == 2, CONSUMER_REGS=regs, WGS=wgs, OFFSETS_64=offsets_64,
                  TRANSPOSE=transpose, MIN_ROWS=0, PAIR_TAILS=False)
    if not causal and not varlen and not window and not cache:  # as `launch_args` launches it: the counter for
        consts["COUNTER"] = None                                # unequal items
    # cache: 0 none, 1 a contiguous KV cache, 2 a paged one (16-row pages: 16-row TMA boxes), 3 a contiguous one
    # whose sequences start at rows CU_K gives (cache_leftpad)
    kv_rows = 16 if cache == 2 else bn
    consts.update(VARLEN=varlen, WINDOW=window, HAS_SINKS=sinks, SOFTCAP=softcap, KV_CACHE=bool(cache),
                  PAGE_ROWS=kv_rows if cache == 2 else 0, HAS_ALIBI=alibi, HEADS=2 if pack else 1)
    # as `launch_args` picks it: the output by TMA store (d = 256, padded calls, offsets under 2^31)
    consts["TMA_STORE"] = tma_store(dv, 1024, wgs, varlen, offsets_64, not fp8)   # a short call
    if not consts["TMA_STORE"]:
        consts["o_desc"] = None
    if not alibi:
        consts["SLOPES"] = None
    if not cache:
        consts["SEQLENS"] = None
    if cache != 2:
        consts["BLOCK_TABLE"] = None
    if not varlen:
        consts.update(CU_Q=None, **({} if cache == 3 else dict(CU_K=None)))
    elif cache == 2:              # packed queries over a paged cache: no packed keys, and the short sequences left
        consts.update(CU_K=None, MIN_ROWS=8)        # to the portable kernel (`forward._short_tiles`, group 2)
        consts["PAIR_TAILS"] = wgs == 2 and not pack  # group 2: tails paired as `_plan` sets it
    if not sinks:
        consts["SINKS"] = None
    if not lefts:
        consts["LEFTS"] = None
    if not fp8:
        consts.update(Q_DESCALE=None, K_DESCALE=None, V_DESCALE=None)
    part = _QK_PART.get(d, d)
    ptrs = dict(q_desc=desc(_ROWS, part), k_desc=desc(kv_rows, part),
                v_desc=desc(dv, kv_rows) if fp8 and not transpose else desc(kv_rows, dv), o_desc=desc(_ROWS, dv),
                O="*bf16" if fp8 else f"*{dt}", LSE="*fp32", COUNTER="*i32", CU_Q="*i32", CU_K="*i32",
                SINKS="*fp32", LEFTS="*i32", SEQLENS="*i32", BLOCK_TABLE="*i32", SLOPES="*fp32", Q_DESCALE="*fp32",
                K_DESCALE="*fp32", V_DESCALE="*fp32")
    ptrs = {n: v for n, v in ptrs.items() if n not in consts}
    names = list(inspect.signature(attn_fwd_sm90_kernel.fn).parameters)
    floats = ("qk_scale_log2", "cap_in")
    sig = {n: ptrs.get(n, "constexpr" if n in consts else ("fp32" if n in floats else "i32")) for n in names}
    src = GluonASTSource(attn_fwd_sm90_kernel, sig, constexprs={(names.index(k),): v for k, v in consts.items()})
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=4))
    ptx = k.asm["ptx"]
    print(json.dumps(dict(shared=k.metadata.shared, warps=k.metadata.num_warps, wgmma="wgmma.mma_async" in ptx,
                          tma=f"cp.async.bulk.tensor.{4 if store else 3}d" in ptx, setmaxnreg="setmaxnreg" in ptx,
                          serialized=serialized(ptx), transpose=bool(transpose))))
''')


@pytest.mark.cpu
# (head_dim, causal, dtype, three consumer warpgroups, 64-bit output offsets[, varlen[, window[, sinks[, softcap[,
# per-sequence left bounds[, KV cache: 1 contiguous, 2 paged, 3 contiguous with key starts[, ALiBi[, GQA heads
# paired[, FP8 V transposed in the kernel[, the real head dim of a call run padded to head_dim]]]]]]]]]])
# Flags share cases (64-bit offsets ride on a varlen and a window case) to keep the CPU suite's compiles few.
@pytest.mark.parametrize("case", [(128, True, "bf16", False, False), (128, False, "fp16", False, False),
                                  (64, False, "bf16", False, False), (64, False, "fp16", True, False),
                                  (64, True, "bf16", True, False), (256, True, "fp16", False, False),
                                  (192, True, "bf16", False, False), (192, False, "fp16", False, False),
                                  (128, True, "bf16", False, True, True), (64, False, "bf16", True, False, True),
                                  (64, True, "bf16", False, False, True, True, True, False, True),
                                  (64, True, "bf16", True, True, False, True, True, True),
                                  (128, True, "bf16", False, False, False, False, False, False, False, 2, True),
                                  (128, True, "bf16", False, False, False, False, False, False, False, 3),
                                  (128, True, "bf16", False, False, True, False, False, False, False, 2),
                                  (64, False, "fp16", True, False, False, True, True, False, False, 1, True),
                                  (128, True, "fp16", False, False, False, True, True, False, False, 2, True, True),
                                  (128, True, "fp8e4nv", False, False, True),
                                  (128, False, "fp8e4nv", False, False, False, False, False, False, False, 0, False,
                                   False, True),
                                  (64, True, "fp8e4nv", False, False, False, True, True, True, False, 0, True, True),
                                  (128, True, "bf16", False, False, False, False, False, False, False, 2, False, False,
                                   False, 96),
                                  (256, False, "fp16", False, False, False, False, False, False, False, 0, False, False,
                                   False, 200),
                                  (192, True, "bf16", False, False, False, False, False, False, False, 0, False, False,
                                   False, 160, 256)],
                         ids=["d128-causal", "d128", "d64", "d64-wide", "d64-wide-causal", "d256-causal",
                              "d192-dv128-causal", "d192-dv128", "d128-causal-varlen-offsets64", "d64-wide-varlen",
                              "d64-window-lefts-sinks-varlen", "d64-wide-window-sinks-softcap-offsets64",
                              "d128-causal-paged-cache-alibi", "d128-causal-cache-leftpad", "d128-causal-varlen-paged",
                              "d64-wide-window-sinks-cache-alibi",
                              "d128-window-sinks-paged-alibi-paired-heads", "d128-causal-fp8-varlen",
                              "d128-fp8-v-in-kernel", "d64-window-sinks-softcap-alibi-paired-heads-fp8",
                              "d96-as-128-causal-paged", "d200-as-256-tma-store",
                              "d160-as-192-256-causal-tma-store"])
def test_gluon_prefill_compiles_for_sm90(case, request):
    """The Hopper Gluon kernel cannot run in the interpreter; compiling it here catches API drift and shared
    memory over the limit, and checks the warp-specialised shape: wgmma, 3-D TMA loads (4-D for a padded head
    dim), per-partition register budgets (setmaxnreg), two or three consumer warpgroups and one with the producer
    warp."""
    info = compiled(request, SERIALIZED + GLUON_SCRIPT, lambda p: p["case"])
    assert info["wgmma"] and info["tma"] and info["setmaxnreg"], info
    assert info["warps"] == (16 if case[3] or info["transpose"] else 12), info      # three consumers, a transposer
    # A wait after every wgmma (an accumulator in flight across a branch, too few registers, ...) costs far more
    # than any change that causes it could gain.
    assert not info["serialized"], f"ptxas serialised the wgmmas: {info['serialized']}"
    assert info["shared"] <= 232448, f"shared memory {info['shared']} over the H100 limit"


FP8_DECODE_SCRIPT = textwrap.dedent('''
    import json, sys
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon._runtime import GluonASTSource
    from fmha.kernels.fp8_decode_sm90 import CONFIGS, PRODUCER_REGS, WIDEN_REGS, fp8_decode_kernel
    d, page, causal, descales, out = json.loads(sys.argv[1])
    block_n, raw_stages, w_stages, ch = CONFIGS[d]
    box = min(page, block_n) if page else block_n        # as `fp8_decode_forward_sm90` cuts a tile
    layout = gl.NVMMASharedLayout.get_default_for([1, box, d], gl.float8e4nv)
    desc = f"tensordesc<fp8e4nv[1,{box},{d}],{layout!r}>"
    consts = dict(BLOCK_N=block_n, RAW_STAGES=raw_stages, W_STAGES=w_stages, CH=ch, PAGED=bool(page), CAUSAL=causal,
                  WIDEN_REGS=WIDEN_REGS, PRODUCER_REGS=PRODUCER_REGS, OFFSETS_64=out == "bf16" and causal)
    if not page:
        consts["BLOCK_TABLE"] = None
    if not descales:
        consts.update(K_DESCALE=None, V_DESCALE=None)
    names = list(fp8_decode_kernel.arg_names)
    ptrs = dict(k_desc=desc, v_desc=desc, Q="*bf16", O=f"*{out}", LSE="*fp32", SEQLENS="*i32", BLOCK_TABLE="*i32",
                K_DESCALE="*fp32", V_DESCALE="*fp32")
    sig = {n: "constexpr" if n in consts else ptrs.get(n, "fp32" if n == "qk_scale_log2" else "i32") for n in names}
    src = GluonASTSource(fp8_decode_kernel, sig, constexprs={(names.index(k),): v for k, v in consts.items()})
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=4))
    ptx = k.asm["ptx"]
    print(json.dumps(dict(shared=k.metadata.shared, wgmma=ptx.count("wgmma.mma_async"),
                          tma="cp.async.bulk.tensor.3d" in ptx, setmaxnreg="setmaxnreg" in ptx,
                          e4m3="e4m3x2" in ptx, serialized=serialized(ptx))))
''')


@pytest.mark.cpu
# (head dim, page size or 0 for a contiguous cache, causal, descales given, the output's dtype: q's, or fp32 parts)
@pytest.mark.parametrize("case", [(128, 64, False, True, "bf16"), (128, 0, True, False, "fp32"),
                                  (64, 16, True, True, "bf16"), (256, 256, False, True, "fp32"),
                                  (256, 0, True, True, "bf16")],
                         ids=["d128-p64", "d128-contiguous-causal-split", "d64-p16-causal", "d256-p256-split",
                              "d256-contiguous-causal"])
def test_fp8_decode_compiles_for_sm90(case, request):
    """The Gluon decode over an FP8 cache (`fp8_decode_sm90`) compiles for sm_90 in every head dim's tiles within the
    H100's shared memory, with TMA loads of the raw tiles, the e4m3 pair conversions, wgmma for both products (Q·Kᵀ
    and P·V, two instructions a 16-deep step each), per-partition register budgets, and no wgmma serialised."""
    info = compiled(request, SERIALIZED + FP8_DECODE_SCRIPT, lambda p: p["case"])
    assert info["tma"] and info["e4m3"] and info["setmaxnreg"], info
    assert info["wgmma"] >= 2, info
    assert not info["serialized"], f"ptxas serialised the wgmmas: {info['serialized']}"
    assert info["shared"] <= 232448, f"shared memory {info['shared']} over the H100 limit"


@pytest.mark.cpu
def test_fp8_decode_widener_layout_conflict_free():
    """The widener's register layout (`widen_layout`) loads each raw chunk of the FP8 ring and stores it into the fp16
    slot with no shared-memory bank conflict, at every head dim's CONFIGS (Triton's own count, `bank_conflicts`: the
    excess wavefronts of each ld/st.shared the layout compiles to). The 16-bytes-a-thread layout it replaced, counted
    the same way, conflicts at d = 128: the count tells them apart."""
    from triton._C.libtriton import gluon_ir, ir
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language._semantic import GluonSemantic

    from fmha.kernels.fp8_decode_sm90 import CONFIGS, widen_layout

    context = ir.context()
    ir.load_dialects(context)
    semantic = GluonSemantic(gluon_ir.GluonOpBuilder(context))

    def conflicts(layout, dtype, block_n, rows, d):
        shared = gl.NVMMASharedLayout.get_default_for([block_n, d], dtype)
        slot = gl.shared_memory_descriptor_type(dtype, [rows, d], shared, [rows, d])
        return semantic.bank_conflicts(gl.distributed_type(dtype, [rows, d], layout), slot)

    for d, (block_n, _, _, ch) in CONFIGS.items():
        for dtype in (gl.float8e4nv, gl.float16):
            assert conflicts(widen_layout(d), dtype, block_n, ch, d) == 0, (d, dtype)
    assert conflicts(gl.BlockedLayout([1, 16], [4, 8], [4, 1], [1, 0]), gl.float16, 128, 64, 128) == 1


@pytest.mark.cpu
def test_gluon_fp8_host_pieces(monkeypatch):
    """The host side of FP8 calls on the Gluon kernel: V transposed into a copy whose TMA view has the keys as
    columns (rows 16-byte aligned, the padding outside the view); packed sequences each from a 16-byte-aligned
    column (TMA boxes start aligned in their innermost dimension), zeros between them and past the last one (the
    buffer's rows past cu_seqlens_k[-1] are NaN here) as far as the kernel's key tiles reach (`transpose.TAIL`);
    new buffers come filled with e4m3 NaN here, so that a column the transposition leaves out shows."""
    from fmha.kernels.forward_sm90 import transposed_v
    from fmha.kernels.transpose import TAIL, packed_start
    empty = torch.empty

    def poisoned_empty(*args, **kwargs):
        t = empty(*args, **kwargs)
        t.view(torch.uint8).fill_(0x7F)
        return t
    monkeypatch.setattr(torch, "empty", poisoned_empty)
    torch.manual_seed(0)
    v = (torch.randn(2, 37, 3, 16 + 8)[..., :16] * 4).to(torch.float8_e4m3fn)      # strided, 37 keys
    vt, (shape, strides) = transposed_v(v)
    assert vt.shape == (2, 3, 16, 48) and shape == [2, 48, 37] and strides == [3 * 16 * 48, 48, 1]
    seen = vt.view(torch.uint8).reshape(2, 48, 48)[:, :, :37]
    assert torch.equal(seen, v.view(torch.uint8).permute(0, 2, 3, 1).reshape(2, 48, 37))
    packed = v[:1].clone()
    packed[:, 30:] = float("nan")
    cu = torch.tensor([0, 12, 12, 30], dtype=torch.int32)          # 12 keys, none, 18; rows 30..36 not a sequence's
    vt, (shape, strides) = transposed_v(packed, (cu, 18))
    starts = [packed_start.fn(first, b) for b, first in enumerate(cu.tolist())]
    assert starts == [0, 32, 48, 80] and shape[2] == vt.shape[3] >= 80 and strides[1] == vt.shape[3]
    got = vt.view(torch.uint8)[0]                                   # (heads, dv, columns)
    want = packed.view(torch.uint8)[0].permute(1, 2, 0)            # (heads, dv, keys)
    assert torch.equal(got[..., :12], want[..., :12]) and torch.equal(got[..., 48:66], want[..., 12:30])
    assert not got[..., 12:48].any() and not got[..., 66:].any()
    long = (torch.randn(1, 300, 2, 16) * 4).to(torch.float8_e4m3fn)            # 5 keys, then 295 rows of no one's
    long[:, 5:] = float("nan")
    vt, (shape, strides) = transposed_v(long, (torch.tensor([0, 5], dtype=torch.int32), 5))
    got = vt.view(torch.uint8)[0]
    assert packed_start.fn(5, 1) == 32 and vt.shape[3] >= 32 + TAIL
    assert torch.equal(got[..., :5], long.view(torch.uint8)[0, :5].permute(1, 2, 0))
    assert not got[..., 5:32 + TAIL].any()          # as far as a tile that starts inside the sequence reads


@pytest.mark.cpu
def test_gluon_prefill_tma_store_choice():
    """The output by TMA store only where it measured faster and the box cannot leave the call's rows: d = 256,
    short, padded, two warpgroups, offsets under 2^31, an output of the inputs' dtype."""
    from fmha.kernels.forward_sm90 import TMA_STORE_MAX_ROWS, tma_store
    assert tma_store(256, 1024, 2, False, False, True)
    assert not tma_store(256, TMA_STORE_MAX_ROWS, 2, False, False, True)
    assert not tma_store(128, 1024, 2, False, False, True)
    assert not tma_store(256, 1024, 2, True, False, True)
    assert not tma_store(256, 1024, 2, False, True, True)
    assert not tma_store(256, 1024, 2, False, False, False)


@pytest.mark.cpu
def test_gluon_prefill_tile_choice():
    """Three consumer warpgroups only where they were measured faster: d = 64, long enough (longer with a mask);
    paged calls at PAGED_REGS consumer registers at most."""
    from fmha.kernels.forward_sm90 import PAGED_REGS, WIDE_MIN_ROWS, WIDE_MIN_ROWS_CAUSAL, choose_tiles
    assert choose_tiles(64, False, WIDE_MIN_ROWS)[4] == 3
    assert choose_tiles(64, False, WIDE_MIN_ROWS - 1)[4] == 2
    assert choose_tiles(64, True, WIDE_MIN_ROWS_CAUSAL)[4] == 3
    assert choose_tiles(64, True, WIDE_MIN_ROWS_CAUSAL - 1)[4] == 2
    assert all(choose_tiles(d, causal, 16384)[4] == 2 for d in (128, 256) for causal in (False, True))
    # A left window bound makes a call as long as its window.
    assert choose_tiles(64, True, 16384, left=128)[4] == 2
    assert choose_tiles(64, True, 16384, left=WIDE_MIN_ROWS_CAUSAL)[4] == 3
    assert choose_tiles(64, True, 16384, softcap=30.0)[4] == 2      # a softcap's tanh spills at 160 registers
    # A paged cache leaves the producer warp enough registers for its page arithmetic.
    assert all(choose_tiles(d, True, 256, paged=True)[3] <= PAGED_REGS for d in (64, 128, 192, 256))


@pytest.mark.cpu
def test_gluon_pack_heads_rule():
    """GQA heads paired in an item (`pack_heads`): an even group, two consumer warpgroups, a last row block at most
    half full, padded calls only."""
    from fmha.kernels.forward_sm90 import pack_heads
    assert all(pack_heads(4, s, 2) for s in (1, 50, 64, 192, 320))
    assert not any(pack_heads(4, s, 2) for s in (65, 128, 200, 4096))
    assert not pack_heads(1, 64, 2) and not pack_heads(3, 64, 2) and not pack_heads(4, 64, 3)
    assert not pack_heads(4, 64, 2, varlen=True)


@pytest.mark.cpu
def test_gluon_padded_dims():
    """Head dims without tiles of their own run padded to a pair that has them (`padded_dims`), each over 4-D TMA
    views whose last dimension is the real head dim (`tma_view`), so the box's columns past it read as zeros."""
    from fmha.kernels.forward_sm90 import HEAD_DIMS, padded_dims, tma_view
    assert all(padded_dims(*pair) == pair for pair in HEAD_DIMS)
    assert [padded_dims(d, d) for d in (40, 48, 56, 72, 80, 96, 112, 136, 152, 160, 184, 200, 248)] == \
        [(64, 64)] * 3 + [(128, 128)] * 4 + [(192, 256)] * 4 + [(256, 256)] * 2
    assert padded_dims(160, 128) == (192, 128) and padded_dims(192, 192) == (192, 256)     # the fewest products
    # widened more than PAD_MAX (1.9) times, or no tiles to widen to: the portable kernel
    assert all(padded_dims(d, d) is None for d in (8, 32, 264, 512))
    assert padded_dims(128, 96) == (128, 128) and padded_dims(96, 64) is None        # no (128, 64) tiles
    t = torch.zeros(2, 300, 4, 104, dtype=torch.bfloat16)[..., :96]                   # heads 104 columns apart
    assert tma_view(t, True) == ([2, 300, 4, 96], [300 * 4 * 104, 4 * 104, 104, 1])
    assert tma_view(t) == ([2, 300, 3 * 104 + 96], [300 * 4 * 104, 4 * 104, 1])
    assert tma_view(torch.zeros(2, 300, 4, 100, dtype=torch.bfloat16)[..., :96], True) is None   # 200-byte heads
    one = torch.zeros(2, 300, 4, 104, dtype=torch.bfloat16)[:, :, 1:2, :96]       # one head: its stride unused
    assert tma_view(one, True) == ([2, 300, 1, 96], [300 * 4 * 104, 4 * 104, 96, 1])


@pytest.mark.cpu
def test_gluon_page_rows():
    """A paged cache's TMA box: the largest power of two dividing the page (a multiple of 16), at most a key tile."""
    from fmha.kernels.forward_sm90 import page_rows
    assert [page_rows(p, 128) for p in (16, 32, 48, 64, 96, 128, 256, 272)] == [16, 32, 16, 64, 32, 128, 128, 16]
    assert page_rows(256, 64) == 64 and page_rows(80, 64) == 16


GLUON_MLA_SCRIPT = textwrap.dedent('''
    import inspect, json, sys
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon._runtime import GluonASTSource
    from fmha.kernels import mla_decode_sm90 as M
    causal, sinks, dt, sparse, rope, fp8, extra, loader = json.loads(sys.argv[1])
    el = gl.bfloat16 if dt == "bf16" else gl.float16

    def desc(rows, d, name=dt, e=el):
        layout = gl.NVMMASharedLayout.get_default_for([1, rows, d], e)
        return f"tensordesc<{name}[1,{rows},{d}],{layout!r}>"
    # sparse: the token-sparse prefill form (cp.async gathers, no key descriptors, max_logits written).
    consts = dict(CAUSAL=causal, HAS_SINKS=sinks, SPARSE=sparse, FP8=fp8, HAS_MAX=sparse and not fp8, HAS_ROPE=rope,
                  EXTRA=extra, LOADER=loader, CONSUMER_REGS=M.CONSUMER_REGS,
                  PRODUCER_CONSUMER_REGS=M.PRODUCER_CONSUMER_REGS.get({1: "v32", 2: "model1"}.get(fp8), 0))
    ptrs = dict(q_lat_desc=desc(64, 256), q_rope_desc=desc(64, 64), k_lat_desc=desc(64, 256),
                k_rope_desc=desc(64, 64), o_desc=desc(64, 256), o_part_desc=desc(64, 256, "fp32", gl.float32),
                LSE="*fp32", LSE_PART="*fp32", SCHED="*i32", SEQLENS="*i32", SPLIT_OFFSETS="*i32", SINKS="*fp32",
                BLOCK_TABLE="*i32", KV_LAT=f"*{dt}", K_ROPE=f"*{dt}", VALID_LENS="*i32", MAX_LOGITS="*fp32",
                X_LAT=f"*{dt}", X_ROPE=f"*{dt}", X_TABLE="*i32", X_VALID="*i32")
    if fp8:                                     # packed FP8 rows (1: V3.2, 2: model1), read as bytes
        ptrs.update(KV_LAT="*u8", K_ROPE="*u8", X_LAT="*u8", X_ROPE="*u8")
    if not extra:
        consts.update(X_LAT=None, X_ROPE=None, X_TABLE=None, X_VALID=None)
    if sparse or fp8:
        consts.update(k_lat_desc=None, k_rope_desc=None)
    if not sparse:
        consts.update(VALID_LENS=None)
    if not consts["HAS_MAX"]:
        consts.update(MAX_LOGITS=None)
    if not rope:
        consts.update(q_rope_desc=None, k_rope_desc=None)
    names = list(inspect.signature(M.mla_decode_sm90_kernel.fn).parameters)
    sig = {n: "constexpr" if n in consts else ptrs.get(n, "fp32" if n == "qk_scale_log2" else "i32") for n in names}
    # The JIT's divisibility hints for pointers and strides (sizes may be anything).
    unaligned = {"batch", "seqlen_q", "group", "rows_per_k", "page_size", "index_bound", "main_span", "x_page_size",
                 "x_bound"}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names)
             if sig[n].startswith("*") or (sig[n] == "i32" and n not in unaligned)}
    src = GluonASTSource(M.mla_decode_sm90_kernel, sig, constexprs={(names.index(k),): v for k, v in consts.items()},
                         attrs=attrs)
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=4))
    ptx = k.asm["ptx"]
    print(json.dumps(dict(shared=k.metadata.shared, warps=k.metadata.num_warps, wgmma="wgmma.mma_async" in ptx,
                          tma_store="cp.async.bulk.tensor.3d.global.shared" in ptx,
                          serialized=serialized(ptx), spills=spills(ptx),
                          gathers=ptx.count("cp.async.cg.shared.global"),
                          arrives=ptx.count("cp.async.mbarrier.arrive.noinc"))))
''')


@pytest.mark.cpu
# (causal, sinks, dtype, sparse, RoPE part, FP8 layout (1 V3.2, 2 model1), second source, loading warpgroup)
@pytest.mark.parametrize("case", [(False, False, "bf16", False, True, 0, False, False),
                                  (True, True, "fp16", False, True, 0, False, False),
                                  (False, True, "bf16", True, True, 0, False, False),
                                  (False, False, "bf16", True, False, 0, False, False),
                                  (False, False, "bf16", True, True, 0, False, True),
                                  (False, True, "bf16", True, True, 1, False, True),
                                  (True, False, "bf16", False, True, 1, False, True),
                                  (False, True, "bf16", True, False, 2, True, False),
                                  (False, True, "bf16", True, False, 2, True, True),
                                  (True, False, "bf16", False, False, 2, False, False)],
                         ids=["mla-bf16", "mla-causal-sinks-fp16", "sparse-sinks", "sparse-d512", "sparse-loader",
                              "sparse-fp8-v32",
                              "paged-fp8-v32-causal", "sparse-fp8-model1-extra", "sparse-fp8-model1-extra-loader",
                              "paged-fp8-model1"])
def test_gluon_mla_compiles_for_sm90(case, request):
    """The Gluon MLA decode kernel for sm_90: two consumer warpgroups (8 warps, so 255 registers a thread), and
    with a loading warpgroup (V3.2's FP8 cache; model1's on long token rows; bf16 sparse when forced) as the
    default partition (12 warps), wgmma that ptxas does not serialise (C7512 for want of registers is what a
    consumer as the default partition beside a third warpgroup causes; any C751x), TMA-store epilogue, shared
    memory within the H100 limit. The token-sparse and FP8 forms (V3.2's and model1's layouts, model1 with V4's
    second source) gather keys with cp.async copies, each thread arriving on the part's barrier (no TMA loads of
    keys). Almost no spills: Q's wgmma descriptors, made before the loop, were kept in registers that spilled, 172
    bytes in the sparse prefill (`_score_part`'s run-time 0; model1's forms keep up to 88)."""
    info = compiled(request, SERIALIZED + GLUON_MLA_SCRIPT, lambda p: p["case"])
    assert info["spills"] <= (96 if case[5] == 2 else 8), info
    assert info["wgmma"] and info["tma_store"], info
    assert info["warps"] == (12 if case[7] else 8), info
    gather = bool(case[3] or case[5])
    assert (info["gathers"] > 0 and info["arrives"] > 0) == gather, info
    assert not info["serialized"], f"ptxas serialised the wgmmas: {info['serialized']}"
    assert info["shared"] <= 232448, f"shared memory {info['shared']} over the H100 limit"


GLUON_MLA_ROWS_SCRIPT = textwrap.dedent('''
    import inspect, json, sys
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon._runtime import GluonASTSource
    from fmha.kernels import mla_rows_sm90 as M
    nq, causal, sinks, dt = json.loads(sys.argv[1])
    el = gl.bfloat16 if dt == "bf16" else gl.float16

    def desc(rows, d, name=dt, e=el):
        layout = gl.NVMMASharedLayout.get_default_for([1, rows, d], e)
        return f"tensordesc<{name}[1,{rows},{d}],{layout!r}>"
    # The dense call's arguments (`mla_decode_sm90._Plan.bind`); the gather ones are None there.
    consts = dict(NQ=nq, CAUSAL=causal, HAS_SINKS=sinks, X_LAT=None, X_ROPE=None, X_TABLE=None, X_VALID=None,
                  VALID_LENS=None, MAX_LOGITS=None)
    ptrs = dict(q_lat_desc=desc(nq, 256), q_rope_desc=desc(nq, 64), k_lat_desc=desc(64, 256),
                k_rope_desc=desc(64, 64), o_desc=desc(nq, 256), o_part_desc=desc(nq, 256, "fp32", gl.float32),
                LSE="*fp32", LSE_PART="*fp32", SCHED="*i32", SEQLENS="*i32", SPLIT_OFFSETS="*i32", SINKS="*fp32",
                BLOCK_TABLE="*i32", KV_LAT=f"*{dt}", K_ROPE=f"*{dt}")
    names = list(inspect.signature(M.mla_rows_sm90_kernel.fn).parameters)
    sig = {n: "constexpr" if n in consts else ptrs.get(n, "fp32" if n == "qk_scale_log2" else "i32") for n in names}
    unaligned = {"batch", "seqlen_q", "group", "rows_per_k", "page_size", "index_bound", "main_span", "x_page_size",
                 "x_bound"}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names)
             if sig[n].startswith("*") or (sig[n] == "i32" and n not in unaligned)}
    src = GluonASTSource(M.mla_rows_sm90_kernel, sig, constexprs={(names.index(k),): v for k, v in consts.items()},
                         attrs=attrs)
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=4))
    ptx = k.asm["ptx"]
    print(json.dumps(dict(shared=k.metadata.shared, warps=k.metadata.num_warps,
                          wgmma=ptx.count("wgmma.mma_async.sync.aligned.m64n%dk16" % nq),
                          tma_store="cp.async.bulk.tensor.3d.global.shared" in ptx,
                          serialized=serialized(ptx), spills=spills(ptx))))
''')


@pytest.mark.cpu
# (NQ, causal, sinks, dtype)
@pytest.mark.parametrize("case", [(16, False, False, "bf16"), (32, False, False, "bf16"), (32, True, True, "fp16")],
                         ids=["rows16-bf16", "rows32-bf16", "rows32-causal-sinks-fp16"])
def test_gluon_mla_rows_compiles_for_sm90(case, request):
    """The few-rows MLA kernel (`mla_rows_sm90`) for sm_90: one warpgroup, every product an m64nNQk16 wgmma with the
    keys (or value columns) on M, none serialised: Q·Kᵀ 36 of them (576 / 16), P·V 32 (4 M-blocks of 256 columns
    x 4 key steps, two halves); a TMA-store epilogue; shared memory within the H100 limit. Spills only outside the
    key loop, and few (up to 44 bytes at NQ = 32, causal with sinks: 128 accumulator registers a thread)."""
    info = compiled(request, SERIALIZED + GLUON_MLA_ROWS_SCRIPT, lambda p: p["case"])
    assert info["warps"] == 4 and info["tma_store"], info
    assert info["wgmma"] == 36 + 32, info
    assert not info["serialized"], f"ptxas serialised the wgmmas: {info['serialized']}"
    assert info["spills"] <= 64, info
    assert info["shared"] <= 232448, f"shared memory {info['shared']} over the H100 limit"


@pytest.mark.cpu
def test_gluon_mla_one_key_pages():
    """A sparse call's cache whose pages follow each other is gathered as pages of one key: every flat position
    `page * page_size + slot` names the same bytes in both views. Pages that do not follow (padded) stay as given."""
    from fmha.kernels.mla_decode_sm90 import _one_key_pages
    cache = torch.randn(5, 4, 1, 16)
    lat, rope = _one_key_pages(cache[..., :12], cache[..., 12:])
    assert lat.shape == (20, 1, 1, 12) and rope.shape == (20, 1, 1, 4)
    for p in range(20):
        key = cache[p // 4, p % 4]
        assert torch.equal(lat[p, 0], key[:, :12]) and torch.equal(rope[p, 0], key[:, 12:])
    assert lat.data_ptr() == cache.data_ptr() and rope.data_ptr() == cache[..., 12:].data_ptr()
    one, none = _one_key_pages(cache, None)
    assert one.shape == (20, 1, 1, 16) and none is None
    padded = torch.randn(5, 6, 1, 16)[:, :4]
    kept = _one_key_pages(padded[..., :12], padded[..., 12:])
    assert kept[0] is not None and kept[0].shape == (5, 4, 1, 12) and kept[1].shape == (5, 4, 1, 4)


@pytest.mark.cpu
def test_gluon_mla_loader_choice():
    """The loading warpgroup: every V3.2 FP8 call; model1 sparse calls with long token rows (with one 64-row query
    block a token, h_q = 64: 1152 keys, not 640; with two, h_q = 128: from 384 keys on); never the bf16/fp16 forms
    nor a paged model1 call."""
    from fmha.kernels.mla_decode_sm90 import MODEL1_LOADER_TILES, uses_loader
    assert uses_loader("v32", True, 64) and uses_loader("v32", False, 0)
    assert not uses_loader("model1", True, 128 + 2048) and not uses_loader("model1", True, 128 + 512)
    assert uses_loader("model1", True, 128 + 1024, 2) and not uses_loader("model1", True, 128 + 512, 2)
    for blocks, least in enumerate(MODEL1_LOADER_TILES, 1):
        if least is not None:
            assert uses_loader("model1", True, 64 * least, blocks)
            assert not uses_loader("model1", True, 64 * least - 64, blocks)
    assert not uses_loader("model1", False, 1 << 20)
    assert not uses_loader("model1", False, 1 << 20, 2)
    assert not any(uses_loader(None, sparse, 1 << 20) for sparse in (False, True))


SPARSE_FP8_SCRIPT = textwrap.dedent('''
    import inspect, json, sys
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon._runtime import GluonASTSource
    from fmha.kernels import sparse_decode_sm90 as M
    layout, extra, sinks, page_size, cluster = json.loads(sys.argv[1])

    def desc(rows, d):
        layout = gl.NVMMASharedLayout.get_default_for([1, rows, d], gl.bfloat16)
        return f"tensordesc<bf16[1,{rows},{d}],{layout!r}>"
    consts = dict(FP8={"v32": 1, "model1": 2}[layout], EXTRA=extra, HAS_SINKS=sinks, WG0_REGS=M.WG0_REGS,
                  WG1_REGS=M.WG1_REGS)
    if page_size == 1:                          # what the JIT makes of a cache whose pages follow each other
        consts.update(page_size=1)
    consts.update(SHIFTED=page_size > 1 and page_size & (page_size - 1) == 0)
    if layout == "model1":                      # no RoPE part of its own
        consts.update(q_rope_desc=None)
    # 2-CTA clusters: placeholder offsets, as `sm90.launch_pairs`' first compile
    consts.update(CLUSTER=cluster, SMEM=(0, 0, 0, 0) if cluster else None)
    ptrs = dict(q_lat_desc=desc(64, 256), q_rope_desc=desc(64, 64), o_desc=desc(64, 256), LSE="*fp32", SINKS="*fp32",
                **{p + n: t for p in ("", "X_") for n, t in (("CACHE", "*u8"), ("SCALES", "*u8"), ("IDX", "*i32"),
                                                              ("VALID_LENS", "*i32"))})
    names = list(inspect.signature(M.sparse_decode_kernel.fn).parameters)
    sig = {n: "constexpr" if n in consts else ptrs.get(n, "fp32" if n == "qk_scale_log2" else "i32") for n in names}
    aligned = {p + n for p in ("", "x_") for n in ("stride_idx", "stride_page", "stride_slot")}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names) if sig[n].startswith("*") or n in aligned}
    src = GluonASTSource(M.sparse_decode_kernel, sig, constexprs={(names.index(k),): v for k, v in consts.items()},
                         attrs=attrs)
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=4))
    ptx = k.asm["ptx"]
    offsets = []
    if cluster:
        from fmha.kernels.sm90 import shared_offsets
        offsets = shared_offsets(k, M._cluster_buffers(consts))
    print(json.dumps(dict(shared=k.metadata.shared, warps=k.metadata.num_warps, serialized=serialized(ptx),
                          wide_loads=ptx.count("ld.global.v4"), spills=spills(ptx), offsets=offsets,
                          peer_copies=ptx.count("cp.async.bulk.shared::cluster"))))
''')


@pytest.mark.cpu
@pytest.mark.parametrize("case", [("v32", False, True, 1, False), ("v32", False, False, 61, False),
                                  ("model1", True, True, 256, False), ("model1", False, False, 61, False),
                                  ("v32", False, True, 1, True), ("model1", True, True, 256, True)],
                         ids=["v32-sinks-one-key-pages", "v32-page61", "model1-extra-sinks", "model1-page61",
                              "v32-pairs", "model1-extra-pairs"])
def test_sparse_decode_fp8_compiles_for_sm90(case, request):
    """The FP8 sparse decode kernel (`sparse_decode_sm90`), both layouts, with and without a second source: 12 warps
    (loader, scorer, P·V warpgroup), wgmma not serialised, the loader's reads 16 bytes wide (this tile's and the
    next's), almost no spills (bytes carried across the loop edge as bytes, one a register, spilled 4.6 KB), shared
    memory within the H100 limit."""
    info = compiled(request, SERIALIZED + SPARSE_FP8_SCRIPT, lambda p: p["case"])
    assert info["warps"] == 12, info
    assert not info["serialized"], f"ptxas serialised the wgmmas: {info['serialized']}"
    assert info["wide_loads"] >= (16 if case[4] else 32) and info["spills"] <= 64, info     # pairs: half the rows
    assert info["shared"] <= 232448, f"shared memory {info['shared']} over the H100 limit"
    if case[4]:                                 # 2-CTA clusters: the copies to the other CTA, the offsets they use
        k_lat, k_rope, k_ready, peer_free = info["offsets"]
        assert info["peer_copies"] == (9 if case[0] == "v32" else 2), info
        assert k_lat % 1024 == 0 and k_rope % 1024 == 0 and (k_rope != k_lat) == (case[0] == "v32"), info
        assert k_ready % 8 == 0 and peer_free % 8 == 0 and k_ready != peer_free and peer_free < info["shared"], info


def test_launch_cache_classes():
    """`launch.launch` reuses a compile for every argument list of one `_arg_class` tuple, so within a class
    Triton's own specialization must be one and the same (else a kernel compiled for 16-byte aligned pointers or
    strides divisible by 16 would run on others): ints around 1, 16 and the int32 range, floats, None, tensors at
    every alignment, Gluon `descriptor`s and `triton.language` tensor descriptors of two boxes over aligned and
    unaligned bases."""
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.compiler import BaseBackend
    from triton.tools.tensor_descriptor import TensorDescriptor
    from fmha.kernels.launch import _arg_class
    from fmha.kernels.sm90 import descriptor
    buf = torch.zeros(1 << 16, dtype=torch.bfloat16)
    ints = [0, 1, 2, 15, 16, 17, 48, 2 ** 31 - 16, 2 ** 31 - 1, 2 ** 31, 2 ** 33 + 16, -1, -16, -(2 ** 31),
            -(2 ** 31) - 16]
    tensors = [buf[off:] for off in (0, 1, 3, 8, 16)] + [buf.float()[off:] for off in (0, 2, 4)] + [buf.half()]
    descs = [descriptor(buf[off:off + 2 * 64 * d].view(2, 64, d), ([2, 64, d], [64 * d, d, 1]), [1, 64, d])
             for d in (64, 128) for off in (0, 8, 1)]
    for d in (64, 128):
        for off in (0, 8, 1):             # the portable kernel's (its constructor refuses an unaligned base)
            t = buf[off:off + 2 * 64 * d].view(1, 64, 2, d)
            desc = object.__new__(TensorDescriptor)
            desc.base, desc.shape, desc.strides, desc.block_shape = t, list(t.shape), list(t.stride()), [1, 64, 1, d]
            desc.padding = "zero"
            descs.append(desc)
    classes = {}
    for a in ints + [0.5, 1.0, None] + tensors + descs:
        c = _arg_class(a)
        assert c is not None, a
        classes.setdefault(c, set()).add(repr(native_specialize_impl(BaseBackend, a, False, True, True)))
    mixed = {c: s for c, s in classes.items() if len(s) > 1}
    assert not mixed, f"one class, several specializations: {mixed}"
    assert len(classes) >= 10             # the classes do separate what Triton separates
    assert _arg_class(True) is None and _arg_class("x") is None     # unknown kinds take the JIT's own path


@pytest.mark.cpu
def test_launch_direct(monkeypatch):
    """A compiled kernel's later launches (`launch._direct`) call its launcher as Triton's runner would: the grid
    padded to three axes, the current stream, the function and its metadata, no launch metadata or hooks, then every
    argument in order, a tensor as its address, and the constexprs; with a launch hook set (a profiler), Triton's own
    runner instead, with the tensors themselves. Here a stand-in kernel records both."""
    from triton import knobs
    from triton.runtime.jit import JITFunction
    from fmha.kernels import launch

    def body(x):
        pass

    class Kernel:
        function, packed_metadata, calls = "function", "metadata", []

        def run(self, *a):
            self.calls.append(("run", a))

        def __getitem__(self, grid):
            return lambda *a: self.calls.append(("runner", grid, a))

    class Descriptor:                     # a tensor descriptor (`_arg_class` knows it): passed as it is
        base, block_shape = torch.zeros(4), [1, 64]

    fn, kernel, t, desc = JITFunction(body), Kernel(), torch.arange(8.0), Descriptor()
    args, meta = (t[2:], None, 7, 0.5, desc), dict(BLOCK=64)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda device: 1000 + device, raising=False)
    classes = tuple(map(launch._arg_class, args))
    monkeypatch.setitem(launch._COMPILED, (fn, 3, classes, tuple(meta.items())), (kernel, (64,)))
    for fixed in (None, (classes[2:], tuple(meta.items()))):       # the last three as a launch plan's scalars
        launch.launch(fn, (5, 2), args, meta, fixed)
        assert kernel.calls.pop() == ("run", (5, 2, 1, 1003, "function", "metadata", None, None, None,
                                              t.data_ptr() + 8, None, 7, 0.5, desc, 64))
    hooks = knobs.runtime.launch_enter_hook
    if hasattr(hooks, "add"):
        hook = lambda metadata: None      # noqa: E731
        hooks.add(hook)
        try:
            launch.launch(fn, (5,), args, meta)
        finally:
            hooks.remove(hook)
        assert kernel.calls.pop() == ("runner", (5, 1, 1), (*args, 64))
    assert not kernel.calls


@pytest.mark.cpu
@pytest.mark.parametrize("probe", ["probe_timeline", "probe_prefill_timeline"])
def test_timeline_probes_still_apply(probe, monkeypatch):
    """The timeline probes (`benchmarks/`) insert clock stamps into a copy of a Gluon kernel by exact text edits,
    each asserted to match; a change of the kernel's arguments broke `probe_prefill_timeline` for two sessions
    unnoticed. Here every edit must still apply and the stamped source must parse."""
    import ast
    import importlib
    monkeypatch.syspath_prepend(os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
    ast.parse(importlib.import_module(probe).stamped_source())


@pytest.mark.cpu
def test_gluon_plan_key():
    """A launch plan's key (`forward_sm90._plan_key`) is the same for new tensors of the same shapes, strides,
    dtypes and 16-byte alignment with the same options, and differs when any of those, or which optional tensors a
    call has, differ."""
    from fmha.kernels.forward_sm90 import _plan_key
    b, s, h, d = 2, 64, 4, 128

    def key(q=None, out=None, **options):
        q = torch.zeros(b, s, h, d, dtype=torch.float16) if q is None else q
        k, v = torch.zeros_like(q), torch.zeros_like(q)
        out = torch.empty_like(q) if out is None else out
        options = dict(dict(causal=True, softmax_scale=0.1, varlen=None, window=None, sinks=None, softcap=0.0,
                            cache=None, alibi_slopes=None, descales=None), **options)
        return _plan_key(q, k, v, out, torch.empty(b, h, s), **options)
    base = key()
    assert key() == base
    buf = torch.zeros(b * s * h * d + 8, dtype=torch.float16)
    lens, table = torch.zeros(b, dtype=torch.int32), torch.zeros(b, 4, dtype=torch.int32)
    others = [key(q=buf[8:].view(b, s, h, d)), key(q=buf[1:-7].view(b, s, h, d)),        # aligned; 2 bytes off
              key(q=torch.zeros(b, s, h, 2 * d, dtype=torch.float16)[..., :d]), key(q=torch.zeros(b, s, h, d)),
              key(out=torch.empty(b, s, h, d, dtype=torch.float32)), key(causal=False), key(softmax_scale=0.2),
              key(window=(100, 0)), key(window=(torch.zeros(b, dtype=torch.int32), 0)), key(softcap=5.0),
              key(sinks=torch.zeros(h)), key(alibi_slopes=torch.zeros(h)), key(cache=(lens, None, None)),
              key(cache=(lens, table, None)), key(cache=(lens, table[:, :2], None)), key(cache=(lens, None, lens)),
              key(descales=(torch.ones(b, h), None, None))]
    assert others[0] == base and len({base, *others[1:]}) == len(others)


@pytest.mark.cpu
@pytest.mark.parametrize("case", ["dense-causal", "packed-window-sinks", "packed-other-lengths", "paged",
                                  "packed-paged", "packed-paged-other-lengths"])
def test_gluon_launch_plan_binds_each_call(case, monkeypatch):
    """A kept launch plan (`forward_sm90._PLANS`) gives a later call of its key that call's own tensors: the same
    arguments, field for field, as planning it afresh (`launch_args`), and not the first call's; packed sequences
    of other token counts and longest lengths take the same plan, with their own grid and scalars. The argument
    classes the plan keeps are those of the call's own arguments. The host side only (capability, SM count and
    launch replaced), so it runs without a GPU."""
    from fmha.kernels.launch import _arg_class
    from fmha.kernels import forward_sm90 as F
    counter = torch.zeros(2, dtype=torch.int32)
    monkeypatch.setattr(F, "supported", lambda q, k, v: tuple(F.tma_view(t) for t in (q, k, v)))
    monkeypatch.setattr(F, "num_sms", lambda device: 132)
    monkeypatch.setattr(F, "zeroed_counter", lambda device, words: counter)
    launches, plans = [], []
    monkeypatch.setattr(F, "launch", lambda fn, grid, args, meta, fixed: launches.append((grid, args, meta, fixed)))
    real_plan = F._plan
    monkeypatch.setattr(F, "_plan", lambda *a, **kw: plans.append(1) or real_plan(*a, **kw))
    b, s, hq, hk, d = 2, 200, 8, 2, 128

    def call(seed):
        g = torch.Generator().manual_seed(seed)
        q, k, v = (torch.randn(b, s, h, d, generator=g, dtype=torch.float16) for h in (hq, hk, hk))
        out, lse = torch.empty_like(q), torch.empty(b, hq, s)
        options = dict(causal=True, softmax_scale=0.1)
        if case == "packed-window-sinks":
            q, k, v, out = (t.flatten(0, 1) for t in (q, k, v, out))
            lse = torch.empty(hq, b * s)
            cu = torch.arange(0, (b + 1) * s, s, dtype=torch.int32)
            options.update(varlen=(cu, cu, s, s), window=(50, 0), sinks=torch.randn(hq, generator=g))
        if case == "packed-other-lengths":     # the second: fewer tokens, other longest lengths, multiples of 16
            lens_q, lens_k = ((200, 150), (180, 200)) if seed == 0 else ((32, 128), (90, 130))
            q, out = (t[:, :max(lens_q)].flatten(0, 1)[:sum(lens_q)] for t in (q, out))
            k, v = (t.flatten(0, 1)[:sum(lens_k)] for t in (k, v))
            lse = torch.empty(hq, sum(lens_q))
            cu_q, cu_k = (torch.tensor([0, n[0], sum(n)], dtype=torch.int32) for n in (lens_q, lens_k))
            options.update(varlen=(cu_q, cu_k, max(lens_q), max(lens_k)))
        if case in ("paged", "packed-paged", "packed-paged-other-lengths"):
            k, v = (t.view(b * s // 40, 40, hk, d) for t in (k, v))       # 10 pages of 40 keys
            options.update(cache=(torch.full((b,), s, dtype=torch.int32),
                                  torch.randperm(b * s // 40, generator=g).view(b, -1).to(torch.int32), None))
        if case == "packed-paged":              # packed queries over the paged cache (attention_varlen's block_table)
            q, out = q.flatten(0, 1), out.flatten(0, 1)
            lse = torch.empty(hq, b * s)
            options.update(varlen=(torch.arange(0, (b + 1) * s, s, dtype=torch.int32), None, s, s))
        if case == "packed-paged-other-lengths":    # the same, the second call of other token counts and longest
            lens_q = (200, 150) if seed == 0 else (32, 128)      # lengths (the key count's bound: under capacity)
            q, out = (t[:, :max(lens_q)].flatten(0, 1)[:sum(lens_q)] for t in (q, out))
            lse = torch.empty(hq, sum(lens_q))
            options.update(varlen=(torch.tensor([0, lens_q[0], sum(lens_q)], dtype=torch.int32), None, max(lens_q),
                                   s - 8 * (seed + 1)), short_rows=4)
        assert F.attention_forward_sm90(q, k, v, out, lse, **options)
        return (q, k, v, out, lse), options
    call(0)
    tensors, options = call(1)
    assert len(plans) == 1 and len(launches) == 2
    grid, args, meta, (kept, _) = launches[1]
    assert kept == tuple(map(_arg_class, args[len(args) - len(kept):]))
    want_grid, want, want_meta = F.launch_args(*tensors, **options)
    assert grid == want_grid and meta == want_meta and len(args) == len(want)
    for got, exp in zip(args, want):
        if hasattr(exp, "block_shape"):             # a TMA descriptor: over this call's tensor, in the same box
            assert got.base.data_ptr() == exp.base.data_ptr() and got.base.shape == exp.base.shape
            assert (got.shape, got.strides, got.block_shape, got.layout) == \
                (exp.shape, exp.strides, exp.block_shape, exp.layout)
        elif isinstance(exp, torch.Tensor):
            assert got is exp
        else:
            assert type(got) is type(exp) and got == exp
    q, k, v, out, lse = tensors
    assert args[0].base.data_ptr() == q.data_ptr() and args[4] is out and args[5] is lse


@pytest.mark.cpu
@pytest.mark.parametrize("heads_k,group,max_k", [(8, 4, 4096), (16, 2, 4096), (6, 4, 16384), (5, 2, 8192),
                                                 (7, 8, 16384), (3, 1, 1 << 20)])
def test_gluon_packed_chunks_hold_whole_sequences(heads_k, group, max_k, monkeypatch):
    """Packed calls' causal chunks (`forward_sm90._chunk`: the heads whose items go out together) divide each
    sequence's heads, in a fresh plan and in one made for other lengths (`_Plan.with_lengths`): the kernel skips an
    empty item's whole run of items on that (`_past_empty`), and a chunk spanning two sequences would skip the next
    sequence's items. KV heads whose L2 fit (`L2_BUDGET` over max_k keys) is not a divisor of heads_k among the
    cases; GQA head pairs (an item of two heads) where the group is even. The host side only."""
    from fmha.kernels import forward_sm90 as F
    monkeypatch.setattr(F, "num_sms", lambda device: 132)
    hq, d, lens = heads_k * group, 128, (64, 300)
    q, out = (torch.zeros(sum(lens), hq, d, dtype=torch.float16) for _ in range(2))
    k, v = (torch.zeros(sum(lens), heads_k, d, dtype=torch.float16) for _ in range(2))
    cu = torch.tensor([0, lens[0], sum(lens)], dtype=torch.int32)
    lse = torch.empty(hq, sum(lens))
    plan = F._plan(q, k, v, out, lse, causal=True, softmax_scale=0.1, varlen=(cu, cu, max(lens), max_k))
    other = plan.with_lengths(q, k, v, lse, (cu, cu, 40, 2 * max_k))
    heads = hq // plan.meta["HEADS"]                      # items' heads a sequence
    for chunk in (plan.scalars[F.HEAD_CHUNK], other.scalars[F.HEAD_CHUNK]):
        assert 0 < chunk and heads % chunk == 0, (chunk, heads)
    kv_heads = plan.scalars[F.HEAD_CHUNK] // (group // plan.meta["HEADS"])
    assert kv_heads <= max(1, F.L2_BUDGET // (max_k * 2 * d * 2))   # still within L2's share


@pytest.mark.cpu
@pytest.mark.parametrize("paged", [False, True], ids=["no-cache", "paged"])
def test_gluon_pair_tails_plan_agrees(paged, monkeypatch):
    """The kernel's PAIR_TAILS (`_plan`: a packed call's last row blocks of at most 64 rows run two query heads an
    item) is set exactly where `pairs_tails` says, the rule `forward.attention_forward` halves the short launch's
    rows by over a cache (were the kernel not to pair where the rule does, the 33-64-row sequences it keeps would
    run unpaired), across groups, head dims, masks and lengths; never for a padded call or heads paired by `pack`.
    The host side only."""
    from fmha.kernels import forward_sm90 as F
    monkeypatch.setattr(F, "num_sms", lambda device: 132)
    lens, page = (64, 300), 16
    cu = torch.tensor([0, lens[0], sum(lens)], dtype=torch.int32)
    checked = set()
    for (group, heads_k), d, window, max_q in itertools.product(
            ((1, 8), (2, 4), (3, 2), (4, 2), (8, 1)), (64, 128, 256), ((-1, 0), (-1, -1), (128, 0)), (300, 1 << 16)):
        hq = heads_k * group
        q, out = (torch.zeros(sum(lens), hq, d, dtype=torch.float16) for _ in range(2))
        lse = torch.empty(hq, sum(lens))
        if paged:
            k, v = (torch.zeros(2 * 32, page, heads_k, d, dtype=torch.float16) for _ in range(2))
            cache = (torch.tensor(lens, dtype=torch.int32), torch.arange(64, dtype=torch.int32).view(2, 32), None)
            varlen = (cu, None, max_q, 32 * page)
        else:
            k, v = (torch.zeros(sum(lens), heads_k, d, dtype=torch.float16) for _ in range(2))
            cache, varlen = None, (cu, cu, max_q, max_q)
        plan = F._plan(q, k, v, out, lse, causal=window[1] == 0, softmax_scale=0.1, varlen=varlen, window=window,
                       cache=cache)
        rule = F.pairs_tails(d, d, group, window, max_q, 0.0, paged)
        assert plan.meta["PAIR_TAILS"] == rule, (group, d, window, max_q)
        checked.add(rule)
        if rule and not paged:    # heads paired in every item instead
            assert not F._plan(q, k, v, out, lse, causal=window[1] == 0, softmax_scale=0.1, varlen=varlen,
                               window=window, pack=True).meta["PAIR_TAILS"]
    assert checked == {False, True}
    q4, k4 = torch.zeros(2, 300, 8, 128, dtype=torch.float16), torch.zeros(2, 300, 2, 128, dtype=torch.float16)
    assert not F._plan(q4, k4, k4, q4.clone(), torch.empty(2, 8, 300), causal=True,
                       softmax_scale=0.1).meta["PAIR_TAILS"]


@pytest.mark.cpu
@pytest.mark.parametrize("case", ["dense", "sparse", "fp8-v32-paged", "model1-extra"])
def test_mla_launch_plan_binds_each_call(case, monkeypatch):
    """A kept MLA route (`mla_decode._ROUTES`: the Gluon kernel's launch plan) and the combine's plan
    (`combine._PLANS`) give a later call of their key that call's own tensors: the same launches, argument for
    argument, as routing and planning it afresh, and not the first call's; the argument classes the plans keep are
    those of the call's own arguments. The host side only (`on_hopper`, `is_cuda` and the launches replaced), so it
    runs without a GPU."""
    import fmha.mla as flash_mla
    from fmha.kernels import combine, mla_decode, mla_decode_sm90
    from fmha.kernels.launch import _arg_class
    launches = []

    def record(fn, grid, args, meta, fixed=None):
        launches.append((fn, grid, args, meta, fixed))
    monkeypatch.setattr(mla_decode_sm90, "launch", record)
    monkeypatch.setattr(combine, "launch", record)
    monkeypatch.setattr(mla_decode_sm90, "on_hopper", lambda t: True)
    monkeypatch.setattr(mla_decode, "gluon_enabled", lambda: True)
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda t: True))
    forward = mla_decode.mla_decode_forward
    monkeypatch.setattr(flash_mla, "mla_decode_forward", lambda *a, **kw: forward(*a, **dict(kw, interpret=False)))
    b, s_q, h_q, page = 3, 2, 32, 64
    d = 512 if case == "model1-extra" else 576

    inputs, firsts = set(), set()

    def made(run, *tensors):
        storages = {t.untyped_storage().data_ptr() for t in tensors if isinstance(t, torch.Tensor)}
        firsts.update(() if inputs else storages)
        inputs.update(storages)
        return run

    def call(seed):
        """A call of the case's key on tensors of this seed, to be made by calling it."""
        g = torch.Generator().manual_seed(seed)
        q = torch.randn(b, s_q, h_q, d, generator=g).to(torch.bfloat16)
        cache = torch.randn(12, page, 1, d, generator=g).to(torch.bfloat16)
        lens = torch.tensor([300, 5, 190] if seed == 0 else [7, 320, 64], dtype=torch.int32)
        kw = dict(attn_sink=torch.randn(h_q, generator=g))
        if case in ("dense", "fp8-v32-paged"):
            table = torch.randperm(12, generator=g)[:3 * 4].view(3, 4).to(torch.int32)
            meta, splits = flash_mla.get_mla_metadata(lens, s_q * h_q, 1)
            if case == "fp8-v32-paged":
                cache = flash_mla.quantize_kv_cache(cache, "v32")
            return made(lambda: flash_mla.flash_mla_with_kvcache(q, cache, table, lens, 512, meta, splits,
                                                                 causal=True, is_fp8_kvcache=case != "dense", **kw),
                        q, cache, table, lens, meta, splits, *kw.values())
        topk = 96
        indices = torch.randint(-1, 12 * page, (b, s_q, topk), generator=g, dtype=torch.int32)
        kw.update(indices=indices, topk_length=torch.randint(0, topk + 1, (b,), generator=g, dtype=torch.int32))
        if case == "model1-extra":
            cache = flash_mla.quantize_kv_cache(cache, "model1")
            extra = torch.randn(5, 32, 1, d, generator=g).to(torch.bfloat16)
            kw.update(is_fp8_kvcache=True, extra_k_cache=flash_mla.quantize_kv_cache(extra, "model1"),
                      extra_indices_in_kvcache=torch.randint(-1, 5 * 32, (b, s_q, 24), generator=g,
                                                             dtype=torch.int32))
        meta, splits = flash_mla.get_mla_metadata(lens, s_q * h_q, 1, num_heads_q=h_q, topk=topk)
        return made(lambda: flash_mla.flash_mla_with_kvcache(q, cache, None, lens, 512, meta, splits, **kw),
                    q, cache, lens, meta, splits, *kw.values())

    outputs = {}

    def tensor(a):
        """A tensor by its place in the test's inputs or in the call's outputs (`outputs`: storage -> name), or by
        its layout alone where the call allocated it otherwise (split buffers)."""
        base = a.untyped_storage().data_ptr()
        where = (base if base in inputs else outputs.get(base), a.data_ptr() - base)
        return where if where[0] is not None else None, tuple(a.shape), a.stride(), a.dtype

    def tensor_of(a):
        """`tensor` of an argument, or of a descriptor's tensor; (None,) for other arguments."""
        a = a.base if hasattr(a, "block_shape") else a
        return tensor(a) if isinstance(a, torch.Tensor) else (None,)

    def canonical(args, outs):
        """Arguments as comparable values: a descriptor by its tensor and box, a tensor by `tensor` (the call's
        outputs `outs`)."""
        outputs.clear()
        outputs.update({t.untyped_storage().data_ptr(): name for name, t in zip(("out", "lse"), outs)})
        return [(tensor(a.base), list(a.shape), list(a.strides), list(a.block_shape), a.layout)
                if hasattr(a, "block_shape") else tensor(a) if isinstance(a, torch.Tensor) else a for a in args]
    first = call(0)                     # kept alive: no later allocation takes its tensors' addresses
    first()
    routes = dict(mla_decode._ROUTES)
    assert len(routes) == 1 and routes[next(iter(routes))] is not None
    launches.clear()
    second = call(1)
    kept_outs = second()
    assert mla_decode._ROUTES.keys() == routes.keys()       # the first call's key: its route taken
    kept = launches[:]
    launches.clear()
    mla_decode._ROUTES.clear()
    combine._PLANS.clear()
    outs = second()                                         # the same call, routed and planned afresh
    assert len(kept) == len(launches) == 2                 # the kernel and the combine (the tokens are split)
    for (fn, grid, args, meta, fixed), (fn0, grid0, args0, meta0, _) in zip(kept, launches):
        assert fn is fn0 and grid == grid0 and meta == meta0 and len(args) == len(args0)
        if fixed is not None:
            assert fixed[0] == tuple(map(_arg_class, args[len(args) - len(fixed[0]):]))
        want = canonical(args0, outs)
        assert canonical(args, kept_outs) == want             # `outputs` is the kept call's from here on
        assert {"out", "lse"} <= {where[0] for where, *_ in map(tensor_of, args) if where}    # its own outputs
        assert not firsts & {where[0] for where, *_ in map(tensor_of, args) if where}     # none of the first call's
