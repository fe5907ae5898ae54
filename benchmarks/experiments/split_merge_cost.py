"""What the separate merge costs a split decode, on the shapes where splits carry the call: one KV head of 8 query
heads (tensor parallelism, b = 16-64) and the long-context GQA rows. For each case, in one process: cuDNN on the
contiguous cache, ours, ours with no merge (none in the kernel, the combine launch skipped: a timing only, the
parts left unmerged), CUDA-graph GB/s; then torch.profiler's kernel records of ours (the split kernel, the gap, the combine; medians of 20 calls).
It says what merging inside the split kernel (no second launch) could win at most. `--merge F,R ..` also times
the kernel's own merge at `forward.MERGE_IN_FLIGHT` = F and `MERGE_ROUNDS` = R (labelled mF_R; R = 0: `combine`);
"ours" is the package's own constants.

    PYTHONPATH=src:benchmarks python3 benchmarks/experiments/split_merge_cost.py [--cases b,hq,hk,sk,page ..]
        [--merge 2048,1 1024,2 ..] [--out probe.json]
"""
import argparse
import statistics

import torch
from torch.profiler import ProfilerActivity, profile

import fmha
from fmha.bench import bench_gpu_graph, paged_copy, save_sweep
from fmha.kernels import forward
from probe_decode import _case, parse_cases
from probe_split_gap import _kernels

CASES = ["64,8,1,4096,16", "64,8,1,4096,64", "32,8,1,4096,16", "16,8,1,8192,64", "64,8,1,4096,-",
         "1,32,8,131072,64", "4,32,8,131072,64"]


def _breakdown(call, calls=20):
    for _ in range(3):
        call()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            call()
            torch.cuda.synchronize()
    ks = _kernels(prof)
    split, gap, comb = [], [], []
    for a, c in zip(ks, ks[1:]):
        if "attn_fwd_kernel" in a[0] and "combine_kernel" in c[0]:
            split.append(a[2])
            gap.append(c[1] - (a[1] + a[2]))
            comb.append(c[2])
    if not split:
        return {"kernels": sorted({k[0][:40] for k in ks})}
    return {n: statistics.median(x) for n, x in (("split_us", split), ("gap_us", gap), ("combine_us", comb))}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--cases", nargs="*", default=CASES)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--merge", nargs="*", default=[])
    p.add_argument("--out", default=None)
    args = p.parse_args()
    rows = []
    combine = forward.combine
    package = (forward.MERGE_IN_FLIGHT, forward.MERGE_ROUNDS)
    merges = {f"m{m.replace(',', '_')}": tuple(int(x) for x in m.split(",")) for m in args.merge}
    for b, hq, hk, sk, page in parse_cases(args.cases):
        q, k, v, lens, nbytes, cudnn, ref, row = _case(b, hq, hk, sk, page)
        kc, vc, table = (k, v, None) if page is None else paged_copy(page, k, v)
        call = lambda: fmha.attention_with_kvcache(q, kc, vc, lens, block_table=table)
        row["maxdiff"] = (call().float() - ref).abs().max().item()
        for _ in range(args.rounds):
            row.setdefault("ours_gbps", []).append(nbytes / bench_gpu_graph(call) / 1e9)
            for name, (forward.MERGE_IN_FLIGHT, forward.MERGE_ROUNDS) in merges.items():
                forward._PLANS.clear()
                if f"{name}_maxdiff" not in row:
                    row[f"{name}_maxdiff"] = (call().float() - ref).abs().max().item()
                row.setdefault(f"{name}_gbps", []).append(nbytes / bench_gpu_graph(call) / 1e9)
            forward.MERGE_IN_FLIGHT, forward.MERGE_ROUNDS = 0, 0           # parts left unmerged: a timing only
            forward._PLANS.clear()
            forward.combine = lambda *a, **kw: None
            row.setdefault("nomerge_gbps", []).append(nbytes / bench_gpu_graph(call) / 1e9)
            forward.combine = combine
            forward.MERGE_IN_FLIGHT, forward.MERGE_ROUNDS = package
            forward._PLANS.clear()
            row["cudnn_gbps"].append(nbytes / bench_gpu_graph(cudnn) / 1e9)
        row.update(_breakdown(call))
        rows.append(row)
        c = max(row["cudnn_gbps"])
        print(f"b={b} hq={hq} hk={hk} sk={sk} page={page} | cuDNN {c:.0f} | ours {max(row['ours_gbps']) / c:.3f} "
              f"no merge {max(row['nomerge_gbps']) / c:.3f} "
              + " ".join(f"{n} {max(row[n + '_gbps']) / c:.3f}" for n in merges) + " | "
              + " ".join(f"{n} {row[n]:.2f}" for n in ("split_us", "gap_us", "combine_us") if n in row), flush=True)
        del q, k, v, kc, vc
        torch.cuda.empty_cache()
    if args.out:
        save_sweep(args.out, rows)


if __name__ == "__main__":
    main()
