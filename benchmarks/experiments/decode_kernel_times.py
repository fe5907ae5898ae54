"""Issue 3's b = 64 decode: per-call time from CUDA-graph replays (as `fmha bench decode` times it) against the
kernels' own GPU durations (torch.profiler, eager calls), for ours (contiguous, page 64 shuffled, page 16) and
SDPA's cuDNN backend on the contiguous cache: whether the gap to cuDNN is in the kernel or around it (extra
launches, gaps between graph nodes).

    PYTHONPATH=src:benchmarks python3 benchmarks/experiments/decode_kernel_times.py [--rounds 3]
"""
import argparse
import collections

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import ProfilerActivity, profile

import fmha
from fmha.bench import bench_gpu_graph, save_sweep
from probe_decode import placed_copy


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    torch.manual_seed(0)
    b, hq, hk, sk, d = 64, 32, 8, 4096, 128
    q = torch.randn(b, 1, hq, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(b, sk, hk, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(b, sk, hk, d, device="cuda", dtype=torch.bfloat16)
    lens = torch.full((b,), sk, dtype=torch.int32, device="cuda")
    nbytes = (2 * k.numel() + 2 * q.numel()) * k.element_size()
    qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    calls = {}

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True)
    calls["cudnn"] = cudnn
    calls["ours-contig"] = lambda: fmha.attention_with_kvcache(q, k, v, lens)
    for page in (64, 16):
        kp, vp, table = placed_copy(page, "shuffled", k, v)
        calls[f"ours-p{page}"] = (lambda kp=kp, vp=vp, table=table:
                                  fmha.attention_with_kvcache(q, kp, vp, lens, block_table=table))
    ref = cudnn().transpose(1, 2).float()
    for name, fn in calls.items():
        o = fn()
        o = o.transpose(1, 2) if name == "cudnn" else o
        print(name, "maxdiff", (o.float() - ref).abs().max().item())
    rows = {name: dict(graph_us=[], kernels={}) for name in calls}
    for _ in range(args.rounds):
        for name, fn in calls.items():
            rows[name]["graph_us"].append(bench_gpu_graph(fn) * 1e6)
    for name, fn in calls.items():
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(20):
                fn()
            torch.cuda.synchronize()
        per = collections.defaultdict(list)
        for e in prof.events():
            if e.device_type == torch.autograd.DeviceType.CUDA:
                per[e.name].append(e.time_range.elapsed_us())
        rows[name]["kernels"] = {kn: (len(ts) / 20, sorted(ts)[len(ts) // 2]) for kn, ts in per.items()}
    base = min(rows["cudnn"]["graph_us"])
    for name, r in rows.items():
        g = min(r["graph_us"])
        ktot = sum(n * t for n, t in r["kernels"].values())
        print(f"{name:12s} graph {g:8.2f} us ({nbytes / g / 1e3:7.1f} GB/s, {base / g:.4f} of cudnn)  "
              f"kernels/call {sum(n for n, _ in r['kernels'].values()):.1f}, kernel time {ktot:8.2f} us")
        for kn, (n, t) in r["kernels"].items():
            print(f"    {n:4.1f} x {t:8.2f} us  {kn[:110]}")
    if args.out:
        save_sweep(args.out, rows)          # with the GPU, date and commit


if __name__ == "__main__":
    main()
