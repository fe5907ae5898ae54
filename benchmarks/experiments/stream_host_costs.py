"""Host microseconds of the pieces of the routed call's fork and join (`forward._SideStream`), each in a loop, and of
a small Triton launch on one stream against launches alternating between two streams joined by events: where the
side stream's +20-34 us an eager call (eighty-third session) goes. Least of `--rounds` loops of `--n` each.

    PYTHONPATH=src python3 benchmarks/experiments/stream_host_costs.py [--out x.json]
"""
import argparse
import json
import time

import torch
import triton
import triton.language as tl


@triton.jit
def _touch(x):
    tl.store(x + tl.program_id(0), 1.0)


def least_us(fn, n, rounds):
    best = float("inf")
    for _ in range(rounds):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - t0) / n * 1e6)
        torch.cuda.synchronize()
    return best


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int, default=200)
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--out", default=None)
    a = p.parse_args()
    dev = torch.device("cuda", 0)
    main_s = torch.cuda.current_stream(dev)
    side = torch.cuda.Stream(dev)
    e1, e2 = torch.cuda.Event(), torch.cuda.Event()
    x = torch.zeros(1024, device=dev)

    def launch():
        _touch[(4,)](x)

    def fork_join_empty():
        e1.record(main_s)
        side.wait_event(e1)
        torch.cuda.set_stream(side)
        torch.cuda.set_stream(main_s)
        e2.record(side)
        main_s.wait_event(e2)

    def two_launch_one_stream():
        launch()
        launch()

    def two_launch_side():
        e1.record(main_s)
        side.wait_event(e1)
        torch.cuda.set_stream(side)
        launch()
        torch.cuda.set_stream(main_s)
        launch()
        torch.cuda.set_stream(main_s)
        e2.record(side)
        main_s.wait_event(e2)

    def two_launch_side_raw():            # the same through torch._C's raw setters where there are any
        e1.record(main_s)
        side.wait_event(e1)
        torch._C._cuda_setStream(stream_id=side.stream_id, device_index=side.device_index,
                                 device_type=side.device_type)
        launch()
        torch._C._cuda_setStream(stream_id=main_s.stream_id, device_index=main_s.device_index,
                                 device_type=main_s.device_type)
        launch()
        e2.record(side)
        main_s.wait_event(e2)

    pieces = {
        "current_device": torch.cuda.current_device,
        "current_stream": lambda: torch.cuda.current_stream(dev),
        "is_current_stream_capturing": torch.cuda.is_current_stream_capturing,
        "event_record": lambda: e1.record(main_s),
        "stream_wait_event": lambda: side.wait_event(e1),
        "set_stream": lambda: torch.cuda.set_stream(main_s),
        "fork_join_empty": fork_join_empty,
        "launch": launch,
        "two_launch_one_stream": two_launch_one_stream,
        "two_launch_side": two_launch_side,
        "two_launch_side_raw": two_launch_side_raw,
    }
    for fn in pieces.values():
        fn()
    torch.cuda.synchronize()
    rows = {}
    for r in range(2):                      # twice through, the second kept (warm)
        for name, fn in pieces.items():
            rows[name] = least_us(fn, a.n, a.rounds)
    for name, us in rows.items():
        print(f"{name:30s} {us:7.2f} us")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, n=a.n, rounds=a.rounds,
                           rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
