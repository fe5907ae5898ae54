"""Split-KV planning: how many programs share one sequence's keys. Pure Python, unit-testable on CPU.

Decode-like calls have few (batch, head, query-block) programs; without splitting, most SMs idle while a
few walk the whole cache. The planner splits keys until the grid fills one wave of 8 warps per SM (two 4-warp
programs), but never into chunks shorter than a few key tiles (each split costs a partial write and a merge).
It uses only shapes (the cache capacity, not `cache_seqlens`), so it needs no host synchronisation.
"""
from __future__ import annotations

import threading

MAX_SPLITS = 64
# The most key splits a caller may force (`attention_with_kvcache(num_splits=n)`): the portable kernel numbers
# them along its launch grid's third axis, which holds 65535 programs.
MAX_FORCED_SPLITS = 65535
MIN_TILES_PER_SPLIT = 4
WARPS_PER_SM = 8       # a wave's warps an SM: two 4-warp programs (decode tiles fit two an SM), four 2-warp ones


def num_sms(device) -> int:
    """Multiprocessors of `device` (a torch.device); the interpreter pretends to be a 4-SM GPU so that
    automatic splits get exercised on the CPU."""
    if device.type != "cuda":
        return 4
    return _cuda_sms(device.index if device.index is not None else 0)


_SMS: dict = {}


def _cuda_sms(index: int) -> int:
    """Kept in a dict, not `functools.lru_cache`: a compiled layer that plans traces this, and dynamo warns at
    every compile that it ignores an lru_cache wrapper."""
    sms = _SMS.get(index)
    if sms is None:
        import torch

        sms = _SMS[index] = torch.cuda.get_device_properties(index).multi_processor_count
    return sms


def counted_per_sm(num_warps: int) -> int:
    """The programs of `num_warps` warps an SM runs at once as `plan_num_splits` counts them where it is not told."""
    return max(2, WARPS_PER_SM // num_warps)


def plan_num_splits(programs: int, max_seqlen_k: int, block_n: int, sms: int, num_warps: int = 4,
                    per_sm: int | None = None) -> int:
    """Splits for a grid of `programs` (batch x heads x query blocks) of `num_warps` warps each over keys up to
    `max_seqlen_k`; `per_sm`: the programs an SM runs at once where the warp count does not say it (a persistent
    kernel's work items, one program an SM: 1)."""
    if programs <= 0 or max_seqlen_k <= 0:
        return 1
    # At most one wave of WARPS_PER_SM, and of two programs at least, per SM: 288 4-warp programs on 264 slots run a
    # second, nearly empty wave. `benchmarks/tune_decode.py --splits` (results/sweep_splits_h100.json): b=4,
    # sk=131072 at 9 splits ran at 0.67x the speed of 8 splits.
    want = (per_sm or counted_per_sm(num_warps)) * sms // programs
    most = max(1, max_seqlen_k // (MIN_TILES_PER_SPLIT * block_n))
    return max(1, min(want, most, MAX_SPLITS))


# ----------------------------------------------------------------------------------------------------------
# MLA decode: FlashMLA-style balanced tile scheduler.

SCHED_BLOCK = 64       # keys per scheduling unit; every MLA kernel key tile divides it
SCHED_FIELDS = 8       # ints per part in the metadata (FlashMLA's TileSchedulerMetaDataSize)
MLA_BLOCK_M = 64       # packed query rows per program: wgmma's M


def mla_num_parts(rows_per_head_k: int, heads_k: int, sms: int) -> int:
    """Parts (programs along the key axis) so that parts x heads_k x query blocks covers every SM once."""
    m_blocks = -(-max(rows_per_head_k, 1) // MLA_BLOCK_M)
    return max(1, sms // (heads_k * m_blocks))


# A batch whose sequences all have the same length is planned in whole sequences when that costs at most this
# much balance (the longest part against an equal share): 128 sequences on 66 parts run 2 a part (1.03x the
# share), 128 on 132 parts one each (4 parts idle), and write no partial result, where equal shares would cut
# most sequences in two (fp32 partials and their merge, and a second pipeline fill for each piece).
WHOLE_SEQUENCE_SLACK = 1.1


def runs_whole(sequences, num_parts: int, device=None):
    """Whether `plan_mla` gives `sequences` of one common, non-zero length to `num_parts` parts whole (a host
    decision: the callers that know every length is the same, the token-sparse ones, then skip the combine).
    A symbolic `sequences` (torch.export with a dynamic batch) gets a 0-d bool tensor on `device` instead, so
    that no guard is put on the batch."""
    if not sequences > 0:
        return False
    if not isinstance(sequences, int):
        import torch

        sequences = torch.ones((), dtype=torch.int64, device=device) * sequences
    return -(-sequences // num_parts) * num_parts <= WHOLE_SEQUENCE_SLACK * sequences


# What starting a sequence costs a part, in key blocks of work (loading the piece's Q, the pipeline's fill and
# drain, writing its output or partial): parts are cut to equal shares of blocks plus this per sequence, as
# FlashMLA's scheduler does with the same 5 blocks. `benchmarks/probe_mla.py --varlen --overheads 0 2 5`
# (`history/probe_plan_varlen_h100_6d73bbb.json`, b=128, lengths around 8192): +0.7..+1.1% at 5 against 0 on all four
# cases (h_q 128 / 32 / 16, s_q 1 and 2), +0.2..+0.6% at 2. Equal-length batches mostly go whole (above).
PIECE_OVERHEAD = 5


def plan_mla(cache_seqlens, num_parts: int, piece_overhead: int = PIECE_OVERHEAD):
    """Give every part the same work: the batch's key blocks are laid end to end, each sequence preceded by
    `piece_overhead` blocks' worth of cost, and cut into `num_parts` equal runs of that cost, so a long sequence
    spans several parts and a part may finish one sequence and start the next (a cut inside a sequence's
    overhead starts the part at that sequence). When every sequence has the same length (as in every
    token-sparse call), parts take whole sequences instead if the longest part stays within
    WHOLE_SEQUENCE_SLACK of an equal share; some parts may then have nothing to do. That is decided on the
    device too. Pure torch on `cache_seqlens`' device: no host synchronisation, CUDA-graph safe.

    Returns:
        metadata `(num_parts, SCHED_FIELDS)` int32, per part: [first batch, first block within it, number of
            blocks, split index of the first batch, 0, 0, 0, 0].
        split_offsets `(batch + 1,)` int32: batch b's partial results are rows `split_offsets[b]` up to
            `split_offsets[b + 1]` of the split buffers (a batch run whole by one part has one "split" and
            writes its output directly; a zero-length batch has none).
    """
    import torch

    device = cache_seqlens.device
    n = cache_seqlens.shape[0]
    blocks = (cache_seqlens.to(torch.int64) + SCHED_BLOCK - 1) // SCHED_BLOCK
    # The sorted sequences searched are whole tensors, never slices of ones computed here: inductor (torch 2.11)
    # fails on a slice of a computed buffer passed to searchsorted (`NotImplementedError: SliceView`,
    # pytorch/pytorch#185201), which a compiled layer that plans hits.
    ends = torch.cumsum(blocks, 0)                 # ends[b]: the flat block after sequence b's last
    cum = torch.nn.functional.pad(ends, (1, 0))     # cum[b]: sequence b's first flat block; cum[n] the total
    total = cum[-1]
    # Cost: each non-empty sequence's blocks after its overhead; part p's cut at cost p * share.
    cost_ends = torch.cumsum(blocks + piece_overhead * (blocks > 0), 0)
    cost = torch.nn.functional.pad(cost_ends, (1, 0))
    share = torch.clamp((cost[-1] + num_parts - 1) // num_parts, min=1)
    whole = -(-n // num_parts)                     # sequences a part takes when they go whole
    parts = torch.arange(num_parts + 1, dtype=torch.int64, device=device)
    at = torch.minimum(parts * share, cost[-1])
    seq = torch.searchsorted(cost_ends, at, right=True).clamp(max=max(n - 1, 0))
    cuts = torch.minimum(cum[seq] + torch.clamp(at - cost[seq] - piece_overhead, min=0), cum[seq + 1]) if n else at
    fits = runs_whole(n, num_parts, device)      # a tensor for a symbolic batch (export), decided on the device
    if isinstance(fits, torch.Tensor) or fits:
        longest = blocks.max()
        go_whole = (blocks.min() == longest) & (longest > 0) & fits
        cuts = torch.where(go_whole, torch.minimum(parts * whole * longest, total), cuts)
    start, end = cuts[:-1], cuts[1:]              # the last cut is `total` either way
    # The batch holding flat block `start`: the first b with ends[b] > start (skips empty batches).
    batch = torch.searchsorted(ends, cuts, right=True)[:-1].clamp(max=max(n - 1, 0))
    first_block = start - cum[batch]
    # The part holding a block: the last one starting at or before it (parts before it may be empty). Searched
    # among all the cuts: the last, `total`, is past every block but a trailing empty sequence's start, and
    # that sequence's part is never read (it has no splits and holds no part's start).
    def part_of(block):
        return torch.searchsorted(cuts, block, right=True) - 1
    first_part = part_of(ends - blocks)
    last_part = part_of(ends - 1)
    splits = torch.where(blocks > 0, last_part - first_part + 1, 0)
    split_offsets = torch.zeros_like(cum)
    split_offsets[1:] = torch.cumsum(splits, 0)
    meta = torch.zeros(num_parts, SCHED_FIELDS, dtype=torch.int64, device=device)
    meta[:, 0] = batch
    meta[:, 1] = first_block
    meta[:, 2] = end - start
    if n:
        meta[:, 3] = torch.where(end > start, parts[:-1] - first_part[batch], 0)
    return meta.to(torch.int32), split_offsets.to(torch.int32)


def uniform_lengths(tokens: int, length: int, device):
    """A `(tokens,)` int32 tensor of `length`s, made once per (tokens, length, device) and kept (see
    `uniform_plan`)."""
    import torch

    return _kept(("lengths", tokens, length, device),
                 lambda: torch.full((tokens,), length, dtype=torch.int32, device=device), device)


def uniform_plan(tokens: int, length: int, num_parts: int, device):
    """(lengths, metadata, split_offsets) for `tokens` rows of `length` keys each (token-sparse calls: every query
    token plans the same topk), `plan_mla`'s result. It depends on host integers only, so it is made once per
    (tokens, length, parts, device) and kept: later calls, CUDA-graph captures included, launch nothing for it (a
    sparse decode step otherwise spends ~15 small kernels here, in every layer)."""
    def make():
        lengths = uniform_lengths(tokens, length, device)
        return (lengths, *plan_mla(lengths, num_parts))
    return _kept(("plan", tokens, length, num_parts, device), make, device)


_KEPT: dict = {}


def _kept(key, make, device):
    """make()'s result, kept under `key`. Made during CUDA-graph capture it is not kept: capture only records
    the kernels that would fill it, so it holds nothing outside the graph's replays. Otherwise it is made
    outside any graph's memory pool (`outside_graph_pools`), since it outlives the call."""
    import torch

    if key in _KEPT:
        return _KEPT[key]
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        return make()
    value = outside_graph_pools(make, device) if device.type == "cuda" else make()
    if len(_KEPT) < 256:
        _KEPT[key] = value
    return value


_OUTSIDE = "fmha-outside-graph-pools"


def outside_graph_pools(make, device):
    """make()'s result (CUDA tensors on `device` that outlive the call), allocated in no CUDA graph's private
    memory pool. torch.compile's CUDA graphs (mode="reduce-overhead") route the calling thread's allocations to
    their pool during warm-up runs, and refuse a block there that stays alive untracked ("tensor(s) in the
    cudagraph pool not tracked as outputs"); a side stream does not escape the routing. A thread of its own
    does; its stream is synchronised before the result is handed over."""
    import torch

    if threading.current_thread().name == _OUTSIDE:          # already outside (a nested make)
        return make()
    made, failed = [], []

    def work():
        try:
            with torch.cuda.device(device):
                made.append(make())
                torch.cuda.current_stream().synchronize()
        except BaseException as e:                           # handed to the caller's thread
            failed.append(e)
    worker = threading.Thread(target=work, name=_OUTSIDE)
    worker.start()
    worker.join()
    if failed:
        raise failed[0]
    return made[0]
