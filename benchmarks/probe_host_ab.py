"""Host time of the Gluon prefill's launcher (or, `--portable`, the portable kernel's: `forward.attention_forward` on
decode calls), this tree's against another revision's, in one process: separate
processes on the device's hosts differ by 10-15% on unchanged code (NOTES.md, fifty-ninth session), more than the
changes being measured. The other revision's `forward_sm90.py` (a file: `git show REV:src/fmha/kernels/forward_sm90.py
> benchmarks/experiments/forward_sm90_REV.py`) is loaded as a second module of `fmha.kernels`; rounds alternate the
two (and which of them goes first), and the least microseconds a call of each entry are printed.

Entries, each causal and not, calling `attention_forward_sm90` directly (outputs given): a padded batch; its rows
packed, the same lengths each call; the same tokens cut into new lengths each call (a server's prefill batches,
`--batches` of them, more than a round's calls, so that no call's lengths were seen before in its round: each round
starts with the launch plans emptied but for one call, as a running server's are).

With `--portable` the other file is a revision's `forward.py` and the entries are decode calls of
`attention_forward` (b sequences of one query token, 32 / 8 heads, d = 128, 4096 keys: paged by 16 and by 64, and a
contiguous cache; the split count left to the planner, as `attention_with_kvcache` leaves it), and a mixed batch
packed over a 16-key paged cache as `attention_varlen` calls it (`mixed_entries`: the Gluon launch and the short
one; `--calls 100` keeps its ~4 launches a call within the GPU's launch queue).

With `--launch` the other file is a revision's `kernels/launch.py`, whose `launch` replaces this tree's in every
kernel module for the other's rounds; the entries are the decode calls and the padded-batch prefill calls.

    PYTHONPATH=src python3 benchmarks/probe_host_ab.py --old benchmarks/experiments/forward_sm90_26d3b18.py
        [--shape 16 1024 8 128] [--rounds 8] [--calls 200] [--out probe.json]
    PYTHONPATH=src python3 benchmarks/probe_host_ab.py --portable --old benchmarks/experiments/forward_43b861a.py
        [--decode-batch 4]
    PYTHONPATH=src python3 benchmarks/probe_host_ab.py --launch --old benchmarks/experiments/launch_REV.py
"""
import argparse
import datetime
import importlib.util
import itertools
import json
import sys
import time

import torch

from fmha.bench import _commit
from fmha.kernels import combine, forward, forward_sm90, launch, mla_decode_sm90, sparse_decode_sm90, transpose


def load(path, name="fmha.kernels._ab_other_forward_sm90"):
    """The module at `path` as a submodule of fmha.kernels (its relative imports resolve there)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def cuts(total, parts, n, seed=0):
    """n ways of cutting `total` tokens into `parts` sequences: (cu_seqlens on the GPU, longest) each."""
    out = []
    for i in range(n):
        g = torch.Generator().manual_seed(seed + i)
        bounds = [0, *sorted((torch.randperm(total - 1, generator=g)[:parts - 1] + 1).tolist()), total]
        longest = max(y - x for x, y in zip(bounds, bounds[1:]))
        out.append((torch.tensor(bounds, dtype=torch.int32, device="cuda"), longest))
    return out


def entries(shape, batches):
    """name -> (args, [kwargs of each call]) for `attention_forward_sm90`."""
    b, s, h, d = shape
    q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    out, lse = torch.empty_like(q), torch.empty(b, h, s, device="cuda")
    packed = tuple(t.reshape(b * s, h, d) for t in (q, k, v, out))
    lse_packed = torch.empty(h, b * s, device="cuda")
    cu = torch.arange(0, (b + 1) * s, s, dtype=torch.int32, device="cuda")
    found = {}
    for causal in (False, True):
        mask = "causal" if causal else "full"
        opts = dict(causal=causal, softmax_scale=d ** -0.5)
        found[f"{mask} padded batch"] = ((q, k, v, out, lse), [opts])
        found[f"{mask} packed, the same lengths"] = ((*packed, lse_packed), [dict(opts, varlen=(cu, cu, s, s))])
        found[f"{mask} packed, new lengths each call"] = (
            (*packed, lse_packed), [dict(opts, varlen=(c, c, n, n)) for c, n in batches])
    return found


def decode_entries(b, hq=32, hk=8, d=128, keys=4096):
    """name -> (args, [kwargs]) for `forward.attention_forward`: one query token a sequence over a full cache."""
    q = torch.randn(b, 1, hq, d, device="cuda", dtype=torch.bfloat16)
    out, lse = torch.empty_like(q), torch.empty(b, hq, 1, device="cuda")
    seqlens = torch.full((b,), keys, dtype=torch.int32, device="cuda")
    opts = dict(cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=1, max_seqlen_k=keys, softmax_scale=d ** -0.5,
                window=(-1, -1), softcap=0.0, alibi_slopes=None, sinks=None, cache_seqlens=seqlens, num_splits=0)
    found = {}
    for page in (16, 64, 0):
        if page:
            k, v = (torch.randn(b * keys // page, page, hk, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
            table = torch.randperm(b * keys // page, device="cuda", dtype=torch.int32).view(b, -1)
        else:
            k, v = (torch.randn(b, keys, hk, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
            table = None
        found[f"decode b={b} " + (f"page {page}" if page else "contiguous")] = (
            (q, k, v, out, lse), [dict(opts, block_table=table, max_seqlen_k=keys if table is None else
                                       table.shape[1] * page)])
    return found


def mixed_entries(hq=32, hk=8, d=128, keys=4096, page=16):
    """name -> (args, [kwargs]) for `forward.attention_forward`: packed queries over a paged cache, 32 decodes and a
    128-row chunk (as `attention_varlen` calls it: the routed call, the Gluon launch and the short launch, side by
    side since the eighty-third session)."""
    lens = [1] * 32 + [128]
    b = len(lens)
    cu = torch.tensor([0, *itertools.accumulate(lens)], dtype=torch.int32, device="cuda")
    q = torch.randn(sum(lens), hq, d, device="cuda", dtype=torch.bfloat16)
    out, lse = torch.empty_like(q), torch.empty(hq, sum(lens), device="cuda")
    k, v = (torch.randn(b * keys // page, page, hk, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    table = torch.randperm(b * keys // page, device="cuda", dtype=torch.int32).view(b, -1)
    seqlens = torch.full((b,), keys, dtype=torch.int32, device="cuda")
    opts = dict(cu_seqlens_q=cu, cu_seqlens_k=None, max_seqlen_q=max(lens), max_seqlen_k=keys,
                softmax_scale=d ** -0.5, window=(-1, 0), softcap=0.0, alibi_slopes=None, sinks=None,
                cache_seqlens=seqlens, block_table=table)
    return {f"mixed 32 x 1 + 1 x 128, page {page}": ((q, k, v, out, lse), [opts])}


class LaunchedBy:
    """`forward` and `forward_sm90`'s entries with `fn` as every kernel module's `launch` (`--launch`): a decode
    call's args (5 tensors) go to `forward.attention_forward`, a prefill call's to `attention_forward_sm90`, a
    function (a public entry) is called."""
    _PLANS = {}

    def __init__(self, fn):
        self.fn = fn

    def attention_forward_sm90(self, *args, **kw):
        if callable(args[0]):                           # a public entry (`profile_host.decode_levels`)
            args[0]()
            return True
        if "cache_seqlens" in kw:
            forward.attention_forward(*args, **kw)
            return True
        return forward_sm90.attention_forward_sm90(*args, **kw)

    def use(self):
        """Makes `fn` every kernel module's `launch` (before each of this launcher's measurements)."""
        for module in (combine, forward, forward_sm90, mla_decode_sm90, sparse_decode_sm90, transpose):
            module.launch = self.fn


def per_call_us(module, args, calls, n):
    """Host microseconds a call over n calls cycling through `calls` (issue time; one synchronisation after)."""
    call = getattr(module, "attention_forward_sm90", None)
    if call is None:                       # a forward.py: returns None
        def call(*a, **kw):
            module.attention_forward(*a, **kw)
            return True
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(n):
        assert call(*args, **calls[i % len(calls)])
    issue = (time.perf_counter() - t0) / n * 1e6
    torch.cuda.synchronize()
    return issue


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--old", required=True, help="another revision's forward_sm90.py (forward.py with --portable)")
    p.add_argument("--portable", action="store_true", help="decode calls of the portable kernel's attention_forward")
    p.add_argument("--launch", action="store_true", help="--old is a launch.py: every kernel's launcher A/B")
    p.add_argument("--decode-batch", type=int, default=4)
    p.add_argument("--shape", type=int, nargs=4, default=[16, 1024, 8, 128], metavar=("B", "S", "H", "D"))
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--batches", type=int, default=400)
    p.add_argument("--out", default=None)
    a = p.parse_args()
    assert a.batches > a.calls, "--batches must exceed --calls: each call of a round takes new lengths"
    if a.launch:
        launchers = {"this tree": launch.launch, "other": load(a.old, "fmha.kernels._ab_other_launch").launch}
        modules = {label: LaunchedBy(fn) for label, fn in launchers.items()}
        from profile_host import decode_levels          # the public decode entries, small sizes
        found = {**decode_entries(a.decode_batch),
                 **{name: (args, calls) for name, (args, calls) in entries(a.shape, []).items() if "padded" in name},
                 **{name: ((fn,), [{}]) for name, fn in decode_levels().items()}}
    elif a.portable:
        modules = {"this tree": forward, "other": load(a.old, "fmha.kernels._ab_other_forward")}
        found = {**decode_entries(a.decode_batch), **mixed_entries()}
    else:
        modules = {"this tree": forward_sm90, "other": load(a.old)}
        b, s = a.shape[:2]
        found = entries(a.shape, cuts(b * s, b, a.batches))
    best = {}
    for name, (args, calls) in found.items():         # compile and warm every kernel and path first
        for module in modules.values():
            getattr(module, "use", lambda: None)()
            per_call_us(module, args, calls[:1], 3)
    for r in range(a.rounds):
        order = list(modules.items())
        for label, module in order[::-1] if r % 2 else order:       # each module first in half the rounds
            getattr(module, "use", lambda: None)()
            for name, (args, calls) in found.items():
                getattr(module, "_PLANS", {}).clear()
                per_call_us(module, args, calls[-1:], 1)        # the plan a running server would hold
                us = per_call_us(module, args, calls, a.calls)
                best[name, label] = min(best.get((name, label), float("inf")), us)
    rows = []
    for name in found:
        new, old = best[name, "this tree"], best[name, "other"]
        rows.append(dict(entry=name, this_tree_us=new, other_us=old, ratio=new / old))
        print(f"{name:40s} this tree {new:7.1f} us   other {old:7.1f} us   ratio {new / old:.3f}")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(dict(gpu=torch.cuda.get_device_name(), date=datetime.date.today().isoformat(),
                           commit=_commit(None), shape=a.shape, portable=a.portable, launch=a.launch,
                           decode_batch=a.decode_batch, rounds=a.rounds, calls=a.calls, other=a.old, rows=rows),
                      f, indent=1)


if __name__ == "__main__":
    main()
