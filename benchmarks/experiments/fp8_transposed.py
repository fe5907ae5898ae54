"""The transposed FP8-cache decode form for 33-64 packed query rows: S^T = K Q^T with the widened FP8 K as
wgmma's register A operand, the softmax down the key axis, O^T = V^T P^T. Not in the package: measured, and slower (below).

Why: the package's 64-row form computes S = Q K^T and O = P V. wgmma takes its B operand from shared memory only,
so each FP8 K and V tile is loaded to registers, widened to bf16 and stored back for the wgmma (NOTES.md,
ninety-first session: 83 `st.shared` a loop, the form reads ~0.45 of the cache at d = 128 with 64 packed rows, in
tokens a second 0.96 of a bf16 cache). Here K is the A operand, which wgmma takes from registers, so K is widened
in registers and used there. V^T is A as well; P^T (the B operand) goes to shared memory instead: a 128-key tile
of 64 rows is 16 KB of bf16 P against the 32 KB of widened V the package stores.

What the sm_90 compile shows (ninety-seventh session, NOTES.md): it works as planned for the operands (K by cp.async
and straight into wgmma's A fragments, V as 16-bit words by cp.async and ldmatrix.trans, only P^T stored), but the
softmax down the key axis crosses the warps of the accumulator's rows (a shuffle and shared-memory reduction for
each of max and sum every tile) and K's fragments load two bytes at a time: the loop issues 2.4-4.8x the package's
instructions a key (per 128 keys: 9300-18600 warp instructions against the package's masked loop's 3900). Timed on
the H200 (`results/history/fp8_transposed_h200_3aa5ed9.json`, page 64, GB/s of FP8 bytes): the package 2115, this
form 1316 at its best (128 keys, 3 stages, 4 warps), 600-1046 in the others. Not worth pursuing in this form.

    TRITON_INTERPRET=1 PYTHONPATH=src python3 benchmarks/experiments/fp8_transposed.py check
        the kernel against `fmha.reference` on small FP8 caches (contiguous and paged, causal packed tokens,
        ragged lengths with NaN past each end), fp16 queries (the interpreter's bf16 is wrong)
    TRITON_INTERPRET=0 PYTHONPATH=src python3 benchmarks/experiments/fp8_transposed.py compile [N STAGES WARPS]
        compile for sm_90 here (no GPU): shared memory, registers, shared-memory and wgmma instruction counts;
        PTX, TTGIR and cubin in /tmp. The package's 64-row FP8 form to compare: `split_compile.py
        '[128, 64, 64, true, []]' False 3`
    PYTHONPATH=src python3 benchmarks/experiments/fp8_transposed.py time [--out F.json]   (on a GPU)
        GB/s of FP8 bytes, this kernel against `attention_with_kvcache` (the package) on the same FP8 cache: b = 64,
        8 KV heads, 8 tokens a GQA group of 8 (64 rows), d = 128, 4k keys, page 64; each variant checked first.
"""
import json
import os
import sys

import torch
import triton
import triton.language as tl

from fmha.bench import paged_copy
from fmha.kernels.forward import _fp8_word_halves

LOG2E = 1.4426950408889634


@triton.jit
def fp8_decode_t_kernel(Q, K, V, O, SEQLENS, BLOCK_TABLE, K_DESCALE, V_DESCALE,
                        stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh,
                        stride_vb, stride_vs, stride_vh, stride_ob, stride_os, stride_oh, stride_btb,
                        page_size, seqlen_q, heads_k, qk_scale_log2,
                        GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                        BLOCK_N: tl.constexpr, PAGED: tl.constexpr, NUM_STAGES: tl.constexpr,
                        V_WORDS: tl.constexpr):
    """One program a (sequence, KV head): its seqlen_q x GROUP query rows (<= BLOCK_M) packed token-major, row r is
    token r // GROUP of query head kv_head * GROUP + r % GROUP; bottom-right causal over the cache's length."""
    pid = tl.program_id(0)
    b = pid // heads_k
    kv_head = pid % heads_k
    k_len = tl.load(SEQLENS + b)
    rows = tl.arange(0, BLOCK_M)
    tok = rows // GROUP
    row_ok = tok < seqlen_q
    q_head = kv_head * GROUP + rows % GROUP
    q_pos = k_len - seqlen_q + tok                       # the last key row r may see
    offs_d = tl.arange(0, HEAD_DIM)
    q_ptrs = (Q + b.to(tl.int64) * stride_qb + tok[None, :] * stride_qs + q_head[None, :] * stride_qh
              + offs_d[:, None])
    q_t = tl.load(q_ptrs, mask=row_ok[None, :], other=0.0)            # (D, M): Q^T, wgmma's B operand
    kd = tl.load(K_DESCALE + b * heads_k + kv_head)
    vd = tl.load(V_DESCALE + b * heads_k + kv_head)
    scale = qk_scale_log2 * kd
    # O^T's even and odd rows (output columns 2j, 2j + 1) apart: V is read as 16-bit words, two columns each
    # (`forward._fp8_word_halves`), so that V^T's A fragments come from shared memory by ldmatrix.trans.
    acc_e = tl.zeros([HEAD_DIM // 2, BLOCK_M], dtype=tl.float32)
    acc_o = tl.zeros([HEAD_DIM // 2, BLOCK_M], dtype=tl.float32)
    offs_w = tl.arange(0, HEAD_DIM // 2)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    offs_n = tl.arange(0, BLOCK_N)
    hi = k_len
    k_head = K + kv_head * stride_kh
    v_head = V + kv_head * stride_vh
    bt_row = BLOCK_TABLE + b * stride_btb
    for n in tl.range(0, hi, BLOCK_N, num_stages=NUM_STAGES):
        keys = n + offs_n
        key_ok = keys < k_len
        if PAGED:
            page = tl.load(bt_row + keys // page_size, mask=key_ok, other=0).to(tl.int64)
            slot = keys % page_size
        else:
            page = b.to(tl.int64)
            slot = keys
        k_rows = k_head + page * stride_kb + slot * stride_ks
        v_rows = v_head + page * stride_vb + slot * stride_vs
        k = tl.load(k_rows[:, None] + offs_d[None, :], mask=key_ok[:, None], other=0.0)
        v_words = v_rows.to(tl.pointer_type(tl.int16), bitcast=True)
        w_t = tl.load(v_words[None, :] + offs_w[:, None], mask=key_ok[None, :], other=0)      # (D / 2, N)
        s_t = tl.dot(k.to(q_t.dtype), q_t) * scale                     # (N, M), K from registers
        ok = key_ok[:, None] & (keys[:, None] <= q_pos[None, :])
        s_t = tl.where(ok, s_t, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s_t, 0))
        m_shift = tl.where(m_new == float("-inf"), 0.0, m_new)
        p_t = tl.exp2(s_t - m_shift[None, :])
        alpha = tl.exp2(m_i - m_shift)
        l_i = l_i * alpha + tl.sum(p_t, 0)
        m_i = m_new
        # V^T (D, N) as A in registers (fp16: e4m3 widens to fp16 in one conversion), P^T (N, M) as B through
        # shared memory.
        v_e, v_o = _fp8_word_halves(w_t, V_WORDS)
        p16 = p_t.to(tl.float16)
        acc_e = tl.dot(v_e, p16, acc_e * alpha[None, :])
        acc_o = tl.dot(v_o, p16, acc_o * alpha[None, :])
    norm = (vd / tl.where(l_i == 0.0, 1.0, l_i))[None, :]
    o_ptrs = (O + b.to(tl.int64) * stride_ob + tok[None, :] * stride_os + q_head[None, :] * stride_oh
              + 2 * offs_w[:, None])
    tl.store(o_ptrs, (acc_e * norm).to(O.dtype.element_ty), mask=row_ok[None, :])
    tl.store(o_ptrs + 1, (acc_o * norm).to(O.dtype.element_ty), mask=row_ok[None, :])


def fp8_decode_t(q, k_cache, v_cache, cache_seqlens, k_descale, v_descale, block_table=None, block_n=128,
                 num_stages=3, num_warps=4):
    """q (b, s_q, h_q, d) fp16/bf16; FP8 caches paged (blocks, page, h_k, d) with block_table, or contiguous
    (b, s_k, h_k, d); descales (b, h_k) fp32. Output (b, s_q, h_q, d), causal bottom-right, no LSE."""
    b, s_q, h_q, d = q.shape
    h_k = k_cache.shape[2]
    group = h_q // h_k
    block_m = max(16, triton.next_power_of_2(s_q * group))
    assert block_m <= 64 and q.stride(-1) == 1 and k_cache.stride(-1) == 1 and v_cache.stride(-1) == 1
    o = torch.empty_like(q)
    paged = block_table is not None
    bt = block_table if paged else cache_seqlens
    fp8_decode_t_kernel[(b * h_k,)](
        q, k_cache, v_cache, o, cache_seqlens, bt, k_descale, v_descale,
        q.stride(0), q.stride(1), q.stride(2), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), o.stride(0), o.stride(1), o.stride(2),
        bt.stride(0) if paged else 0, k_cache.shape[1] if paged else 1, s_q, h_k, d ** -0.5 * LOG2E,
        GROUP=group, HEAD_DIM=d, BLOCK_M=block_m, BLOCK_N=block_n, PAGED=paged, NUM_STAGES=num_stages,
        V_WORDS=1 if os.environ.get("TRITON_INTERPRET") == "1" else 2,
        num_warps=num_warps, num_stages=num_stages)
    return o


def _inputs(b, s_q, h_q, h_k, d, lens, page, device, dtype, seed=0):
    """q, FP8 caches (paged with shuffled pages when page, else contiguous) holding NaN past each length, the
    lengths, descales, the block table, and the contiguous FP8 keys and values for the oracle; made on `device`."""
    g = torch.Generator(device=device).manual_seed(seed)
    max_len = max(lens)
    q = torch.randn(b, s_q, h_q, d, generator=g, device=device).to(dtype)
    k = (torch.randn(b, max_len, h_k, d, generator=g, device=device) * 2).to(torch.float8_e4m3fn)
    v = (torch.randn(b, max_len, h_k, d, generator=g, device=device) * 2).to(torch.float8_e4m3fn)
    nan = torch.tensor(float("nan"), device=device).to(torch.float8_e4m3fn)
    for i, n in enumerate(lens):
        k[i, n:] = nan
        v[i, n:] = nan
    kd = torch.rand(b, h_k, generator=g, device=device) + 0.5
    vd = torch.rand(b, h_k, generator=g, device=device) + 0.5
    seqlens = torch.tensor(lens, dtype=torch.int32, device=device)
    table = None
    kc, vc = k, v
    if page:
        perm = torch.randperm(b * -(-max_len // page), generator=g, device=device)
        kc, vc, table = paged_copy(page, k, v, perm=perm)
    return q, kc, vc, seqlens, kd, vd, table, k, v


def check():
    from fmha.reference import attention_ref

    worst = 0.0
    for (b, s_q, h_q, h_k, d, lens, page) in [(2, 8, 16, 2, 32, [37, 200], 16), (3, 4, 16, 1, 64, [5, 129, 64], None),
                                               (2, 3, 12, 2, 32, [1, 70], 32), (1, 1, 8, 1, 64, [300], 64)]:
        q, kc, vc, seqlens, kd, vd, table, k, v = _inputs(b, s_q, h_q, h_k, d, lens, page, "cpu", torch.float16)
        out = fp8_decode_t(q, kc, vc, seqlens, kd, vd, table, block_n=32, num_stages=1)
        for i, n in enumerate(lens):
            ref, _ = attention_ref(q[i:i + 1].float(), k[i:i + 1, :n].float(), v[i:i + 1, :n].float(), causal=True,
                                   k_descale=kd[i:i + 1], v_descale=vd[i:i + 1])
            err = (out[i:i + 1].float() - ref).abs().max().item()
            assert err < 2e-2, (b, s_q, h_q, h_k, d, lens, page, i, err)
            worst = max(worst, err)
    print(json.dumps(dict(check="passed", cases=4, max_abs_err=worst)))


def compile_sm90(block_n=128, stages=3, warps=4):
    """PTX / registers of this kernel and of the package's 64-row FP8 form at d = 128, page 64."""
    import re
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from sm90_report import sass_and_usage

    names = list(fp8_decode_t_kernel.arg_names)
    consts = dict(GROUP=8, HEAD_DIM=128, BLOCK_M=64, BLOCK_N=block_n, PAGED=True, NUM_STAGES=stages, V_WORDS=2)
    ptrs = dict(Q="*bf16", K="*fp8e4nv", V="*fp8e4nv", O="*bf16", SEQLENS="*i32", BLOCK_TABLE="*i32",
                K_DESCALE="*fp32", V_DESCALE="*fp32")
    sig = {n: "constexpr" if n in consts else ptrs.get(n, "fp32" if n == "qk_scale_log2" else "i32") for n in names}
    odd = ("page_size", "seqlen_q", "heads_k", "stride_btb")
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names)
             if sig[n].startswith("*") or (sig[n] == "i32" and n not in odd)}
    src = ASTSource(fp8_decode_t_kernel, sig, constexprs={(names.index(k),): v for k, v in consts.items()},
                    attrs=attrs)
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=warps, num_stages=stages))
    ptx = k.asm["ptx"]
    open("/tmp/fp8_transposed.ptx", "w").write(ptx)
    open("/tmp/fp8_transposed.ttgir", "w").write(k.asm["ttgir"])
    open("/tmp/fp8_transposed.cubin", "wb").write(k.asm["cubin"])
    sass, regs, stack = sass_and_usage(k)
    counts = {op: len(re.findall(rf"\b{op}\b", sass)) for op in ("STS", "LDS", "LDSM", "HGMMA", "F2FP", "LDGSTS")}
    counts["STS_all"] = len(re.findall(r"\bSTS(\.\w+)*\b", sass))
    counts["LDS_all"] = len(re.findall(r"\bLDS(\.\w+)*\b", sass))
    counts["LDSM_all"] = len(re.findall(r"\bLDSM(\.\w+)*\b", sass))
    counts["HGMMA_all"] = len(re.findall(r"\bHGMMA(\.\w+)*\b", sass))
    print(json.dumps(dict(kernel="transposed", block_n=block_n, stages=stages, warps=warps, shared=k.metadata.shared,
                          regs=regs, stack=stack,
                          wgmma=ptx.count("wgmma.mma_async"), cvt_e4m3=ptx.count("e4m3x2"),
                          st_shared=ptx.count("st.shared"), ld_shared=ptx.count("ld.shared"),
                          ldmatrix=ptx.count("ldmatrix"), sass=counts)))


def time_gpu(out_path=None):
    import fmha
    from fmha.bench import interleaved_times

    torch.manual_seed(0)
    rows = []
    b, s_q, h_q, h_k, d, n = 64, 8, 64, 8, 128, 4096
    for page in (64,):
        q, kc, vc, seqlens, kd, vd, table, k, v = _inputs(b, s_q, h_q, h_k, d, [n] * b, page, "cuda", torch.bfloat16)
        del k, v
        pkg = lambda: fmha.attention_with_kvcache(q, kc, vc, seqlens, block_table=table, causal=True,  # noqa: E731
                                                  k_descale=kd, v_descale=vd)
        ref = pkg().float()
        calls = {"package": pkg}
        for bn, st, w in ((128, 3, 4), (64, 3, 8), (128, 3, 8), (64, 4, 4)):
            f = (lambda bn=bn, st=st, w=w: fp8_decode_t(q, kc, vc, seqlens, kd, vd, table, bn, st, w))
            err = (f().float() - ref).abs().max().item()
            name = f"transposed {bn},{st},{w}"
            if err > 3e-2:
                rows.append(dict(page=page, name=name, error=err))
                print(page, name, "max err", err, flush=True)
                continue
            calls[name] = f
        nbytes = kc.element_size() * 2 * b * n * h_k * d + 2 * 2 * q.numel()
        times = interleaved_times(calls, 2)
        for name, ts in times.items():
            t = sorted(ts)[len(ts) // 2]
            rows.append(dict(page=page, name=name, gbps=nbytes / t / 1e9, rounds=[nbytes / x / 1e9 for x in ts]))
            print(page, name, f"{nbytes / t / 1e9:.0f} GB/s", flush=True)
    if out_path:
        json.dump(dict(gpu=torch.cuda.get_device_name(), commit=os.environ.get("FMHA_COMMIT", "unknown"),
                       case=dict(b=b, s_q=s_q, h_q=h_q, h_k=h_k, d=d, keys=n), rows=rows), open(out_path, "w"),
                  indent=1)


if __name__ == "__main__":
    what = sys.argv[1] if len(sys.argv) > 1 else "check"
    if what == "check":
        check()
    elif what == "compile":
        compile_sm90(*map(int, sys.argv[2:5]))
    else:
        time_gpu(sys.argv[sys.argv.index("--out") + 1] if "--out" in sys.argv else None)
