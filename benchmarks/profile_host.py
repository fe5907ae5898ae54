"""Host time per call of the prefill path, level by level and piece by piece, beside the peers' (cProfile at the end).

    PYTHONPATH=src python3 benchmarks/profile_host.py [--shape B S H D] [--rounds N] [--profile] [--fp8]

Eager prefill of short sequences can be host-bound: a call that spends more host time than its kernel runs
leaves the GPU idle (the d = 256 and d = 128 1k causal rows of `fmha bench prefill` swung by a third between runs
that way: NOTES.md, thirty-ninth session). Prints microseconds of host time per call (calls issued back to back,
one synchronisation at the end):
- levels: `fmha.attention` (and `fmha.attention_varlen` on the same rows packed, and cut into other lengths each
  call, as a server's batches are), the API layer alone (the kernel's launcher replaced by a no-op),
  `attention_forward` with outputs given, the Gluon launcher, building its arguments alone, the launch alone (the
  JIT's, and `launch.launch`'s direct one);
- pieces of the API layer and the launcher (validation, allocations, the causal counter, descriptors);
- the peers on the same inputs: torch SDPA's FlashAttention-2 and cuDNN backends (their whole call);
- the decode entry points at small sizes (`attention_with_kvcache` on a paged cache, `flash_mla_with_kvcache`
  dense and token-sparse);
- the token-sparse prefill (`flash_mla_sparse_fwd`) on `fmha bench sparse`'s first prefill row, beside FlashMLA's.
With --fp8, q, k and v are float8_e4m3fn with all three descales (the peers then fail and say so), and the
transposition of V (`transposed_v`, and its packed form) is timed alone too. Causal and not. Every entry is timed
once a round and the least of the rounds printed. With --profile [causal|varlen|paged|mla|sparse|prefill], the top
entries of a cProfile of that entry follow (`fmha.attention` causal by default). The launches alone are timed
without a mask only.
"""
import argparse
import cProfile
import importlib
import pstats
import time

import torch

import fmha
from fmha import _validate as V
from fmha._ops import _direct
from fmha.kernels import forward, forward_sm90, sm90
try:
    from fmha.kernels.launch import _arg_class, launch
except ImportError:                     # trees before the fortieth session, for comparisons
    from fmha.kernels.sm90 import _arg_class, launch
from fmha.kernels.forward_sm90 import attention_forward_sm90, attn_fwd_sm90_kernel, launch_args

API = importlib.import_module("fmha.attention")      # the module (the package exports its function)


def host_us(fn, n=300):
    """(issue, issue + run) microseconds a call over n calls back to back."""
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    issue = (time.perf_counter() - t0) / n * 1e6
    torch.cuda.synchronize()
    return issue, (time.perf_counter() - t0) / n * 1e6


def sdpa(backend, q, k, v, causal):
    from torch.nn.attention import sdpa_kernel
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))

    def call():
        with sdpa_kernel(backend):
            torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
    return call


def levels(q, k, v, causal, descales=None):
    """name -> a call to time; `descales`: FP8 inputs' {q_descale, k_descale, v_descale}."""
    from torch.nn.attention import SDPBackend
    b, s, h, d = q.shape
    out = torch.empty(q.shape, dtype=torch.bfloat16 if descales else q.dtype, device="cuda")
    lse = torch.empty(b, h, s, device="cuda")
    kw = dict(descales=tuple(descales.values())) if descales else {}
    scale = d ** -0.5
    views = forward_sm90.supported(q, k, v)
    fns = {
        "fmha.attention": lambda: fmha.attention(q, k, v, causal=causal, **(descales or {})),
        "API layer alone (no launcher)": None,       # filled in below
        "attention_forward (outputs given)": lambda: forward.attention_forward(
            q, k, v, out, lse, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=s, max_seqlen_k=s,
            softmax_scale=scale, window=(-1, 0 if causal else -1), softcap=0.0, alibi_slopes=None, sinks=None,
            **kw),
        "attention_forward_sm90": lambda: attention_forward_sm90(q, k, v, out, lse, causal=causal,
                                                                 softmax_scale=scale, **kw),
        "attention_forward_sm90 (views given: no plan kept)": lambda: attention_forward_sm90(
            q, k, v, out, lse, causal=causal, softmax_scale=scale, views=views, **kw),
        "launch_args alone": lambda: launch_args(q, k, v, out, lse, causal=causal, softmax_scale=scale,
                                                 views=views, **kw),
    }
    if hasattr(forward_sm90, "_plan_key"):            # trees from the fifty-eighth session: a kept launch plan
        options = dict(causal=causal, softmax_scale=scale, varlen=None, window=None, sinks=None, softcap=0.0,
                       cache=None, alibi_slopes=None, descales=kw.get("descales"))
        plan = forward_sm90._plan(q, k, v, out, lse, views=views, **options)
        fns["  _plan_key"] = lambda: forward_sm90._plan_key(q, k, v, out, lse, **options)
        fns["  _Plan.bind"] = lambda: plan.bind(q, k, v, out, lse, None, None, None, None, None, kw.get("descales"))
    cu = torch.arange(0, (b + 1) * s, s, dtype=torch.int32, device="cuda")
    packed = tuple(t.reshape(b * s, *t.shape[2:]) for t in (q, k, v))
    fns["fmha.attention_varlen (the same rows packed)"] = lambda: fmha.attention_varlen(
        *packed, cu, cu, s, s, causal=causal, **(descales or {}))
    batches = []                # the same tokens cut into other lengths each call (a server's prefill batches),
    for i in range(400):        # more than a round of calls, so that no call's lengths were seen before
        cuts = torch.randperm(b * s - 1, generator=torch.Generator().manual_seed(i))[:b - 1] + 1
        bounds = [0, *sorted(cuts.tolist()), b * s]
        longest = max(y - x for x, y in zip(bounds, bounds[1:]))
        batches.append((torch.tensor(bounds, dtype=torch.int32, device="cuda"), longest))
    turn = iter(range(1 << 62))

    def other_lengths():
        cu_i, longest = batches[next(turn) % len(batches)]
        return fmha.attention_varlen(*packed, cu_i, cu_i, longest, longest, causal=causal, **(descales or {}))
    fns["fmha.attention_varlen (other lengths each call)"] = other_lengths
    if descales:
        fns["  transposed_v"] = lambda: forward_sm90.transposed_v(v)
        fns["  transposed_v (packed)"] = lambda: forward_sm90.transposed_v(packed[2][None], (cu, s))
    if not causal:
        grid, args, meta = launch_args(q, k, v, out, lse, causal=False, softmax_scale=scale, views=views, **kw)
        fns["the JIT's launch alone"] = lambda: attn_fwd_sm90_kernel[grid](*args, **meta)
        fns["launch.launch alone"] = lambda: launch(attn_fwd_sm90_kernel, grid, args, meta)
        fns["  argument classes"] = lambda: tuple(map(_arg_class, args))
    fns.update({
        "  _prepare (validation, out)": lambda: API._prepare(
            q, k, v, varlen=False, causal=causal, window=(-1, -1), softmax_scale=None, softcap=0.0,
            alibi_slopes=None, sinks=None, out=None, descales=kw.get("descales", (None,) * 3)),
        "  check_qkv": lambda: V.check_qkv(q, k, v, varlen=False),
        "  check_options": lambda: V.check_options(q, window=(-1, -1), softmax_scale=None, softcap=0.0,
                                                   alibi_slopes=None, sinks=None, batch=b),
        "  _direct": lambda: _direct((q, k, v, out, None, None, s, s, scale, -1, 0, 0.0, None, None, None, None,
                                      None, None)),
        "  out: new_empty": lambda: q.new_empty(q.shape),
        "  lse: torch.empty": lambda: torch.empty((b, h, s), dtype=torch.float32, device=q.device),
        "  causal counter": (lambda: forward_sm90.zeroed_counter(q.device, 2))
        if hasattr(forward_sm90, "zeroed_counter") else (lambda: forward_sm90._counter(q.device))
        if hasattr(forward_sm90, "_counter")
        else lambda: torch.zeros(1, dtype=torch.int32, device=q.device),       # what older trees allocate
        "  supported (views)": lambda: forward_sm90.supported(q, k, v),
        "  one descriptor": lambda: sm90.descriptor(q, views[0], [1, 64, d]),
        "peer: sdpa-fa2": sdpa(SDPBackend.FLASH_ATTENTION, q, k, v, causal),
        "peer: cudnn": sdpa(SDPBackend.CUDNN_ATTENTION, q, k, v, causal),
    })
    return fns


def decode_levels():
    """The other eager entry points at small sizes: paged decode and dense MLA decode."""
    import fmha.mla as mla
    from fmha.bench import paged_copy
    b, sk, page = 4, 256, 64
    q = torch.randn(b, 1, 32, 128, device="cuda", dtype=torch.bfloat16)
    kc, vc = (torch.randn(b, sk, 8, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    kp, vp, table = paged_copy(page, kc, vc)
    lens = torch.full((b,), sk, dtype=torch.int32, device="cuda")
    ql = torch.randn(b, 1, 128, 576, device="cuda", dtype=torch.bfloat16)
    cache, mtable = paged_copy(page, torch.randn(b, sk, 1, 576, device="cuda", dtype=torch.bfloat16))
    meta, splits = mla.get_mla_metadata(lens, 128, 1)
    indices = torch.randint(0, b * sk, (b, 1, 256), dtype=torch.int32, device="cuda")
    smeta, ssplits = mla.get_mla_metadata(lens, 64, 1, num_heads_q=64, topk=256)
    qs = ql[:, :, :64].contiguous()
    return {
        "attention_with_kvcache (paged)": lambda: fmha.attention_with_kvcache(q, kp, vp, lens, block_table=table),
        "flash_mla_with_kvcache (h_q 128)": lambda: mla.flash_mla_with_kvcache(ql, cache, mtable, lens, 512, meta,
                                                                               splits),
        "flash_mla_with_kvcache sparse (h_q 64)": lambda: mla.flash_mla_with_kvcache(
            qs, cache, None, lens, 512, smeta, ssplits, indices=indices),
    }


def sparse_prefill_levels():
    """The token-sparse prefill, ours and FlashMLA's when importable: `fmha bench sparse`'s first prefill row (its
    host time a call was 265-300 us against FlashMLA's 50, hundred-and-seventeenth session; the GPU runs ~4.5 ms a
    call, so issuing 300 back to back never waits for it) and the same with 64 query tokens (does it grow with s_q?)."""
    import fmha.mla as mla
    from fmha.bench import SPARSE_PREFILL_CASES, _flash_mla_sparse_peer, sparse_prefill_inputs
    case = SPARSE_PREFILL_CASES[0]
    q, kv, indices = sparse_prefill_inputs(case, torch.Generator("cuda").manual_seed(0))
    d = case[4]
    q64, indices64 = q[:64], indices[:64]          # sliced here, not in the timed call
    fns = {"flash_mla_sparse_fwd (bench row)": lambda: mla.flash_mla_sparse_fwd(q, kv, indices, d ** -0.5, 512),
           "flash_mla_sparse_fwd (64 tokens)": lambda: mla.flash_mla_sparse_fwd(q64, kv, indices64, d ** -0.5, 512)}
    peer = _flash_mla_sparse_peer()
    if peer is not None and hasattr(peer, "flash_mla_sparse_fwd"):
        fns["peer: flash_mla (bench row)"] = lambda: peer.flash_mla_sparse_fwd(q, kv, indices, d ** -0.5, 512)
    return fns


PROFILED = {"causal": None, "varlen": "causal fmha.attention_varlen (the same rows packed)",
            "paged": "decode attention_with_kvcache (paged)",
            "mla": "decode flash_mla_with_kvcache (h_q 128)",
            "sparse": "decode flash_mla_with_kvcache sparse (h_q 64)",
            "prefill": "sparse prefill flash_mla_sparse_fwd (bench row)"}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--shape", type=int, nargs=4, default=[1, 128, 8, 256], metavar=("B", "S", "H", "D"),
                   help="a small call by default, so that the GPU is never what the host waits for")
    p.add_argument("--profile", nargs="?", const="causal", choices=PROFILED,
                   help="also print a cProfile of one entry: fmha.attention causal (the default), "
                        "attention_varlen causal, or one of the decode entries")
    p.add_argument("--rounds", type=int, default=5,
                   help="every entry is timed once a round; the least of its rounds is printed (the host's speed "
                        "drifts by up to 2x within a process)")
    p.add_argument("--fp8", action="store_true", help="float8_e4m3fn q, k, v with their three descales")
    a = p.parse_args()
    b, s, h, d = a.shape
    q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    descales = None
    if a.fp8:
        q, k, v = (t.to(torch.float8_e4m3fn) for t in (q, k, v))
        descales = {f"{n}_descale": torch.rand(b, h, device="cuda") + 0.5 for n in "qkv"}
    entries = {(f"{'causal' if causal else 'full  '} {name}"): fn
               for causal in (False, True) for name, fn in levels(q, k, v, causal, descales).items()}
    entries.update({f"decode {name}": fn for name, fn in decode_levels().items()})
    entries.update({f"sparse prefill {name}": fn for name, fn in sparse_prefill_levels().items()})
    best = {}
    for _ in range(a.rounds):
        for name, fn in entries.items():
            if fn is None:          # the API layer alone: the launcher it reaches replaced by a no-op that says
                saved = forward_sm90.attention_forward_sm90         # it launched (from the fifty-eighth session,
                forward_sm90.attention_forward_sm90 = lambda *args, **kw: True     # `supported` is the launcher's)
                try:
                    times = host_us(entries[name.replace("API layer alone (no launcher)", "fmha.attention")])
                finally:
                    forward_sm90.attention_forward_sm90 = saved
            else:
                try:
                    times = host_us(fn)
                except Exception as e:             # a peer this torch cannot run on these inputs
                    best[name] = f"failed: {type(e).__name__}: {e}"
                    continue
            old = best.get(name)
            best[name] = times if not isinstance(old, tuple) else min(old, times)
    for name, times in best.items():
        if isinstance(times, str):
            print(f"{name:43s} {times}")
        else:
            print(f"{name:43s} issue {times[0]:7.1f} us/call   issue + run {times[1]:7.1f} us/call", flush=True)
    if a.profile:
        fn = entries["causal fmha.attention" if a.profile == "causal" else PROFILED[a.profile]]
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(200):
            fn()
        prof.disable()
        torch.cuda.synchronize()
        pstats.Stats(prof).sort_stats("tottime").print_stats(25)
        pstats.Stats(prof).sort_stats("cumulative").print_stats(40)


if __name__ == "__main__":
    main()
