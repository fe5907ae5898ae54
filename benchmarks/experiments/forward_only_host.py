"""Host time of `_ops.forward_only` (the entry points' marking of results for a backward that raises): eager
calls issued back to back (one synchronisation a batch), microseconds a call, of each entry point against its
undecorated function (`__wrapped__`), interleaved, least of the rounds. With grad mode on and plain inputs (a
script without no_grad: the check alone), under inference_mode (an engine), and with q requiring grad (the
marking itself).

    PYTHONPATH=src:benchmarks python3 benchmarks/experiments/forward_only_host.py [--rounds 7] [--calls 200] [--out F.json]
"""
import argparse
import contextlib
import time

import torch

import fmha
from fmha.bench import save_sweep


def per_call(fn, calls):
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(calls):
        fn()
    elapsed = time.perf_counter() - t
    torch.cuda.synchronize()
    return elapsed / calls * 1e6


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    torch.manual_seed(0)
    dev, dt = "cuda", torch.bfloat16
    q = torch.randn(1, 128, 8, 128, device=dev, dtype=dt)
    k, v = (torch.randn(1, 128, 2, 128, device=dev, dtype=dt) for _ in range(2))
    cache_k, cache_v = (torch.randn(64, 64, 2, 128, device=dev, dtype=dt) for _ in range(2))
    table = torch.arange(64, device=dev, dtype=torch.int32).reshape(4, 16)
    lens = torch.full((4,), 1000, device=dev, dtype=torch.int32)
    q1 = torch.randn(4, 1, 8, 128, device=dev, dtype=dt)
    entries = {                                   # name: (its query, the call of f, decorated or not, on a query)
        "attention": (q, lambda f, q: f(q, k, v, causal=True)),
        "attention_with_kvcache": (q1, lambda f, q: f(q, cache_k, cache_v, lens, block_table=table)),
    }
    modes = {"grad-on": contextlib.nullcontext, "inference_mode": torch.inference_mode}
    rows = []
    for name, (query, call) in entries.items():
        decorated = getattr(fmha, name)
        plain = decorated.__wrapped__
        for mode, ctx in modes.items():
            best = {"decorated": float("inf"), "plain": float("inf")}
            order = [("decorated", decorated), ("plain", plain)]
            for _ in range(args.rounds):
                with ctx():
                    for kind, f in order:
                        best[kind] = min(best[kind], per_call(lambda: call(f, query), args.calls))
                order.reverse()                   # A B B A ...: neither is always first
            rows.append(dict(entry=name, mode=mode, decorated_us=best["decorated"], plain_us=best["plain"],
                             extra_us=best["decorated"] - best["plain"]))
            print(rows[-1])
        marked = query.detach().requires_grad_()
        t = min(per_call(lambda: call(decorated, marked), args.calls) for _ in range(args.rounds))
        rows.append(dict(entry=name, mode="q-requires-grad", decorated_us=t))
        print(rows[-1])
    if args.out:
        save_sweep(args.out, rows)


if __name__ == "__main__":
    main()
