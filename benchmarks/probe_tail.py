"""How much the last, partly filled round of prefill work items costs: time ours, cuDNN and SDPA-FA2 on shapes
whose item count is or is not a multiple of the SM count (items = b * h * ceil(s / rows)).

    PYTHONPATH=src python3 benchmarks/probe_tail.py [--out probe.json]
"""
import argparse
import math

import torch

import fmha
from fmha.bench import _heat, attention_flops, bench_gpu, prefill_peers, save_sweep
from fmha.schedule import num_sms

# (d, b, s, h): the benchmark's shape first, then the same work per item with a whole number of rounds
CASES = [(128, 4, 4096, 16), (128, 4, 4224, 16), (128, 33, 4096, 2),
         (128, 1, 16384, 16), (128, 1, 16896, 16),
         (64, 16, 1024, 32), (64, 16, 1024, 33), (64, 33, 1024, 16)]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out")
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args()
    peers = {k: v for k, v in prefill_peers().items() if k in ("cudnn", "sdpa-fa2")}
    sms = num_sms(torch.device("cuda"))
    rows = []
    for d, b, s, h in CASES:
        torch.manual_seed(0)
        q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        impls = {"ours": lambda: fmha.attention(q, k, v)}
        impls.update({n: build(q, k, v, False) for n, build in peers.items()})
        flops = attention_flops(b, s, s, h, d, d)
        items = b * h * math.ceil(s / 128)
        row = dict(d=d, b=b, s=s, h=h, items=items, rounds=items / sms)
        _heat(list(impls.values()))
        for r in range(args.rounds):
            for name, fn in impls.items():
                t = bench_gpu(fn)
                row[f"{name}_tflops"] = max(row.get(f"{name}_tflops", 0), flops / t / 1e12)
        row["ours_vs_cudnn"] = row["ours_tflops"] / row["cudnn_tflops"]
        row["ours_vs_fa2"] = row["ours_tflops"] / row["sdpa-fa2_tflops"]
        print(" ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()), flush=True)
        rows.append(row)
    if args.out:
        save_sweep(args.out, rows)


if __name__ == "__main__":
    main()
