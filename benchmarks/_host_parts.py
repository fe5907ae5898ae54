import time, torch, fmha
from fmha.kernels.forward_sm90 import attention_forward_sm90, attn_fwd_sm90_kernel, launch_args
def us(fn, n=2000):
    for _ in range(50): fn()
    torch.cuda.synchronize(); t0 = time.perf_counter()
    for _ in range(n): fn()
    t = (time.perf_counter() - t0) / n * 1e6
    torch.cuda.synchronize(); return t
for causal in (True, False):
    b, s, h, d = 1, 128, 8, 256
    q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    out = torch.empty_like(q); lse = torch.empty(b, h, s, device="cuda")
    grid, args, meta = launch_args(q, k, v, out, lse, causal=causal, softmax_scale=d ** -0.5)
    ck = attn_fwd_sm90_kernel[grid](*args, **meta)
    consts = {i for i, p in enumerate(attn_fwd_sm90_kernel.params) if p.is_constexpr}
    rt = [a for i, a in enumerate(args) if i not in consts]
    runner = ck[grid]
    parts = {
        "fmha.attention": lambda: fmha.attention(q, k, v, causal=causal),
        "attention_forward_sm90": lambda: attention_forward_sm90(q, k, v, out, lse, causal=causal, softmax_scale=d ** -0.5),
        "launch_args (host only)": lambda: launch_args(q, k, v, out, lse, causal=causal, softmax_scale=d ** -0.5),
        "jit launch kernel[grid]": lambda: attn_fwd_sm90_kernel[grid](*args, **meta),
        "torch.zeros(1)": lambda: torch.zeros(1, dtype=torch.int32, device="cuda"),
        "torch.empty_like(q)": lambda: torch.empty_like(q),
        "empty lse": lambda: torch.empty(b, h, s, device="cuda"),
    }
    try:
        runner(*args)
        parts["compiled runner(all args)"] = lambda: runner(*args)
    except Exception as e:
        print("runner all args failed:", type(e).__name__, str(e)[:200])
        try:
            runner(*rt); parts["compiled runner(rt args)"] = lambda: runner(*rt)
        except Exception as e2:
            print("runner rt args failed:", type(e2).__name__, str(e2)[:200])
    for name, fn in parts.items():
        print(f"causal={causal} {name:28s} {us(fn):7.1f} us/call", flush=True)
