"""Split-KV planning: how many programs share one sequence's keys. Pure Python, unit-testable on CPU.

Decode-like calls have few (batch, head, query-block) programs; without splitting, most SMs idle while a
few walk the whole cache. The planner splits keys until the grid covers the GPU about twice, but never
into chunks shorter than a few key tiles (each split costs a partial write and a merge).
It uses only shapes (the cache capacity, not `cache_seqlens`), so it needs no host synchronisation.
"""
from __future__ import annotations

import functools

MAX_SPLITS = 64
MIN_TILES_PER_SPLIT = 4


def num_sms(device) -> int:
    """Multiprocessors of `device` (a torch.device); the interpreter pretends to be a 4-SM GPU so that
    automatic splits get exercised on the CPU."""
    if device.type != "cuda":
        return 4
    return _cuda_sms(device.index if device.index is not None else 0)


@functools.lru_cache(maxsize=None)
def _cuda_sms(index: int) -> int:
    import torch

    return torch.cuda.get_device_properties(index).multi_processor_count


def plan_num_splits(programs: int, max_seqlen_k: int, block_n: int, sms: int) -> int:
    """Splits for a grid of `programs` (batch x heads x query blocks) over keys up to `max_seqlen_k`."""
    if programs <= 0 or max_seqlen_k <= 0:
        return 1
    want = -(-2 * sms // programs)                            # ceil(2 * SMs / programs)
    most = max(1, max_seqlen_k // (MIN_TILES_PER_SPLIT * block_n))
    return max(1, min(want, most, MAX_SPLITS))
