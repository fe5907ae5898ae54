"""One dense MLA decode call for a profiler (`ncu --kernel-name regex:mla_decode_sm90 --launch-skip 2
--launch-count 1 ...`): b=128, page 64, bf16, by default s_k=8192, h_q=128, s_q=1; three calls, the first compiles.
Usage: PYTHONPATH=src python3 benchmarks/profile_mla.py [s_k h_q s_q] [--peer]. `--peer`: FlashMLA's
`flash_mla_with_kvcache` (`benchmarks/peers/fetch_peers.py`) on the same inputs instead (its split kernel:
`ncu --kernel-name regex:flash_fwd_splitkv_mla ...`). `benchmarks/NOTES.md` has what ncu said."""
import sys

import torch

import fmha.mla
from fmha.bench import paged_copy


def main():
    args = [int(a) for a in sys.argv[1:] if not a.startswith("--")]
    sk, hq, sq = args if args else (8192, 128, 1)
    impl = fmha.mla
    if "--peer" in sys.argv:
        import flash_mla as impl
    torch.manual_seed(0)
    b = 128
    q = torch.randn(b, sq, hq, 576, device="cuda", dtype=torch.bfloat16)
    kv = torch.randn(b, sk, 1, 576, device="cuda", dtype=torch.bfloat16)
    cache, table = paged_copy(64, kv)
    lens = torch.full((b,), sk, dtype=torch.int32, device="cuda")
    meta = impl.get_mla_metadata(lens, sq * hq, 1)
    for _ in range(3):
        impl.flash_mla_with_kvcache(q, cache, table, lens, 512, *meta, causal=sq > 1)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
