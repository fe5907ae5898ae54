"""Sustained runs of one prefill shape, ours and the SDPA peers in turn, with nvidia-smi sampling the SM clock, the
power draw and the throttle reasons every 50 ms in the background: whether a kernel's sustained rate falls with the
clock under the power cap, and how much power each draws (the fourteenth session saw ours lose 2-3% after the first
timing at the cap while cuDNN held). Each phase: `--seconds` of back-to-back calls, then its TFLOP/s over the phase
and the mean clock / power / throttle samples inside it.

    PYTHONPATH=src python3 benchmarks/experiments/power_draw.py [--d 64] [--s 1024] [--causal] [--seconds 8]
"""
import argparse
import subprocess
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import fmha
from fmha.bench import attention_flops, save_sweep


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--d", type=int, default=64)
    p.add_argument("--s", type=int, default=1024)
    p.add_argument("--causal", action="store_true")
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    d, s = args.d, args.s
    b, h = 16384 // s, 2048 // d
    torch.manual_seed(0)
    q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
    flops = attention_flops(b, s, s, h, d, d, causal=args.causal)

    def peer(backend):
        def call():
            with sdpa_kernel(backend):
                F.scaled_dot_product_attention(qt, kt, vt, is_causal=args.causal)
        return call
    calls = {"ours": lambda: fmha.attention(q, k, v, causal=args.causal),
             "cudnn": peer(SDPBackend.CUDNN_ATTENTION), "sdpa-fa2": peer(SDPBackend.FLASH_ATTENTION)}
    for fn in calls.values():
        fn()
    torch.cuda.synchronize()
    log = "/tmp/power_samples.csv"
    smi = subprocess.Popen(["nvidia-smi", "--query-gpu=timestamp,clocks.sm,power.draw,clocks_throttle_reasons.active",
                            "--format=csv,noheader,nounits", "-lms", "50", "-f", log])
    time.sleep(1.0)
    phases = []
    for r in range(args.rounds):
        for name, fn in calls.items():
            n, t0 = 0, time.time()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            while time.time() - t0 < args.seconds:
                for _ in range(20):
                    fn()
                n += 20
                torch.cuda.synchronize()
            end.record()
            torch.cuda.synchronize()
            t1 = time.time()
            phases.append(dict(name=name, round=r, t0=t0, t1=t1, calls=n,
                               tflops=flops * n / (start.elapsed_time(end) / 1e3) / 1e12))
            time.sleep(1.0)
    smi.terminate()
    smi.wait()
    samples = []
    for line in open(log):
        try:        # "2026/11/30 19:40:01.123, 1980, 650.12, 0x0000000000000004"
            ts, clock, power, reasons = [x.strip() for x in line.split(",")]
            t = time.mktime(time.strptime(ts.split(".")[0], "%Y/%m/%d %H:%M:%S")) + float("0." + ts.split(".")[1])
            samples.append((t, float(clock), float(power), reasons))
        except ValueError:
            print("unparsed sample:", line.strip())
    for ph in phases:
        inside = [x for x in samples if ph["t0"] + 1.0 <= x[0] <= ph["t1"]]      # after a second of warm-up
        ph["samples"] = len(inside)
        if inside:
            ph["clock_mhz"] = sum(x[1] for x in inside) / len(inside)
            ph["power_w"] = sum(x[2] for x in inside) / len(inside)
            ph["reasons"] = sorted({x[3] for x in inside})
        ph["tflops_per_kw"] = ph["tflops"] / ph.get("power_w", float("nan")) * 1e3
        print(f"{ph['name']:9s} round {ph['round']}: {ph['tflops']:7.1f} TFLOP/s, clock {ph.get('clock_mhz', 0):6.0f} "
              f"MHz, power {ph.get('power_w', 0):6.1f} W, {ph['tflops_per_kw']:6.1f} TFLOP/s per kW, "
              f"throttle {ph.get('reasons')} ({ph['samples']} samples)")
    if args.out:
        # the phases as rows, with the GPU, date and commit (the records of b094dec held them as `phases`)
        save_sweep(args.out, [dict(ph, d=d, s=s, causal=args.causal) for ph in phases])


if __name__ == "__main__":
    main()
