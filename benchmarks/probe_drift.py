"""Does a timing depend on its place in a burst of timings? Times cuDNN SDPA, SDPA-FA2 and ours on one prefill
shape, round-robin for several rounds with no pause, and prints each timing with the SM clock and the throttle
reasons that nvidia-smi reports right after it. (Fourteenth session: the last of four back-to-back timings in
tune_prefill read 7-15% low whichever kernel it was.)

    PYTHONPATH=src python3 benchmarks/probe_drift.py [--d 128] [--s 4096] [--rounds 3] [--causal] [--out x.json]
"""
import argparse
import json
import subprocess

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import fmha
from fmha.bench import attention_flops, bench_gpu


def smi():
    q = "clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active"
    r = subprocess.run(["nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader"], capture_output=True, text=True)
    return r.stdout.strip()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--d", type=int, default=128)
    p.add_argument("--s", type=int, default=4096)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--causal", action="store_true")
    p.add_argument("--out", default=None)
    a = p.parse_args()
    b, h = 16384 // a.s, 2048 // a.d
    q, k, v = (torch.randn(b, a.s, h, a.d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    qt, kt, vt = (t.transpose(1, 2).contiguous() for t in (q, k, v))
    flops = attention_flops(b, a.s, a.s, h, a.d, a.d, causal=a.causal)

    def sdpa(backend):
        def call():
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(qt, kt, vt, is_causal=a.causal)
        return call
    impls = {"ours": lambda: fmha.attention(q, k, v, causal=a.causal), "cudnn": sdpa(SDPBackend.CUDNN_ATTENTION),
             "sdpa-fa2": sdpa(SDPBackend.FLASH_ATTENTION)}
    for fn in impls.values():
        fn()
    torch.cuda.synchronize()
    rows = []
    for r in range(a.rounds):
        for name, fn in impls.items():
            t = bench_gpu(fn)
            rows.append(dict(round=r, impl=name, tflops=flops / t / 1e12, smi=smi()))
            print(f"round {r} {name:9s} {rows[-1]['tflops']:6.1f} TFLOP/s   {rows[-1]['smi']}", flush=True)
    if a.out:
        json.dump(dict(args=vars(a), gpu=torch.cuda.get_device_name(), rows=rows), open(a.out, "w"), indent=1)


if __name__ == "__main__":
    main()
