"""Calls whose launch grids reach CUDA's limits (65535 programs on a grid's second and third axes): each is run and
compared with the same attention through another path. Prints one line a case; exits 1 if any failed.

    PYTHONPATH=src python benchmarks/experiments/grid_limits.py
"""
import sys

import torch

import fmha


def _case(label, run, ref):
    try:
        got = run()
        torch.cuda.synchronize()
        want = ref()
        err = (got.float() - want.float()).abs().max().item()
        ok = err < 5e-2 and not got.isnan().any().item()
        print(f"{'ok  ' if ok else 'FAIL'} {label}: max |diff| {err:.3e}", flush=True)
        return ok
    except Exception as e:            # a launch past the grid limit: "invalid argument" from the driver
        print(f"FAIL {label}: {type(e).__name__}: {str(e)[:200]}", flush=True)
        torch.cuda.synchronize()
        return False


def split_chunk(sq, hq, hk, d, splits, dtype=torch.bfloat16):
    """A chunked-prefill call of sq queries on a contiguous cache of sq keys, keys split `splits` ways (forced):
    the combine merges sq * hq rows of one batch; against fmha.attention, which never splits."""
    q = torch.randn(1, sq, hq, d, device="cuda", dtype=dtype)
    k = torch.randn(1, sq, hk, d, device="cuda", dtype=dtype)
    v = torch.randn(1, sq, hk, d, device="cuda", dtype=dtype)
    lens = torch.full((1,), sq, dtype=torch.int32, device="cuda")
    return (lambda: fmha.attention_with_kvcache(q, k, v, lens, causal=True, num_splits=splits),
            lambda: fmha.attention(q, k, v, causal=True))


def main():
    cases = [("kvcache sq 4096 hq 32 split 2 (131k rows)", *split_chunk(4096, 32, 8, 128, 2)),
             ("kvcache sq 16384 hq 32 split 2 (524k rows)", *split_chunk(16384, 32, 8, 128, 2)),
             ("kvcache sq 32768 hq 32 split 3 (1M rows)", *split_chunk(32768, 32, 8, 64, 3)),
             ("kvcache sq 8192 hq 128 split 2 (1M rows, MQA)", *split_chunk(8192, 128, 1, 64, 2))]
    results = [_case(label, run, ref) for label, run, ref in cases]
    sys.exit(0 if all(results) else 1)


if __name__ == "__main__":
    main()
