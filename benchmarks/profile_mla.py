"""One MLA decode call for a profiler (`ncu --kernel-name regex:mla_decode_sm90 --launch-skip 2 --launch-count 1 ...`):
b=128, s_k=8192, h_q=128, s_q=1, page 64, bf16; three calls, the first compiles. `benchmarks/NOTES.md` has what
ncu said."""
import torch

import fmha.mla as flash_mla
from fmha.bench import paged_copy


def main():
    torch.manual_seed(0)
    b, sk, hq, sq = 128, 8192, 128, 1
    q = torch.randn(b, sq, hq, 576, device="cuda", dtype=torch.bfloat16)
    kv = torch.randn(b, sk, 1, 576, device="cuda", dtype=torch.bfloat16)
    cache, table = paged_copy(64, kv)
    lens = torch.full((b,), sk, dtype=torch.int32, device="cuda")
    meta, splits = flash_mla.get_mla_metadata(lens, sq * hq, 1)
    for _ in range(3):
        flash_mla.flash_mla_with_kvcache(q, cache, table, lens, 512, meta, splits)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
