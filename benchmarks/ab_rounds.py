import sys, torch
from fmha.bench import load_module_copy, bench_gpu, attention_flops, _heat, save_sweep
rows = []
from fmha.kernels import forward_sm90 as pkg
mods = {"split": pkg, "base": load_module_copy("benchmarks/ab_base.py"), "nosplit": load_module_copy("benchmarks/ab_nosplit.py")}
for d, s in [(128, 4096), (128, 16384), (128, 1024), (64, 1024), (256, 4096)]:
    b, h = 16384 // s, 2048 // d
    torch.manual_seed(0)
    q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    out = torch.empty_like(q); lse = torch.empty(b, h, s, device="cuda")
    fl = attention_flops(b, s, s, h, d, d)
    fns = {n: (lambda m=m: m.attention_forward_sm90(q, k, v, out, lse, causal=False, softmax_scale=d ** -0.5)) for n, m in mods.items()}
    _heat(list(fns.values()), 1.0)
    res = {n: [] for n in fns}
    for r in range(4):
        order = list(fns) if r % 2 == 0 else list(fns)[::-1]
        for n in order:
            res[n].append(fl / bench_gpu(fns[n]) / 1e12)
    med = {n: sorted(x)[1:3] for n, x in res.items()}
    rows.append(dict(d=d, s=s, causal=False, **{f'{n}_tflops': sum(m) / 2 for n, m in med.items()}, **{f'{n}_each': res[n] for n in res}))
    print(f"d={d} s={s} " + "  ".join(f"{n} {sum(m)/2:.1f} ({' '.join(f'{y:.0f}' for y in res[n])})" for n, m in med.items()), flush=True)
save_sweep(sys.argv[1], rows)
