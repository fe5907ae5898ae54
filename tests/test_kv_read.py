"""The pure-read yardstick of `fmha bench decode` (`kernels.kv_read`): it must read every word of the cache once,
in any layout, or the bench's "ours / read" would compare against a read that skipped something."""
import pytest
import torch

from fmha.bench import paged_copy
from fmha.kernels.kv_read import kv_read, xor_fold
from utils import TARGETS


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("page", [None, 16, 64])
@pytest.mark.parametrize("whole_row,splits", [(False, 1), (False, 2), (True, 1)])
def test_kv_read_reads_every_word(target, page, whole_row, splits):
    device, dtype = target
    b, keys, heads, d = 2, 256, 4, 64
    k = torch.randn(b, keys, heads, d, device=device).to(dtype)
    v = torch.randn(b, keys, heads, d, device=device).to(dtype)
    k_cache, v_cache, table = (k, v, None) if page is None else paged_copy(page, k, v)
    call = kv_read(k_cache, v_cache, table, keys, whole_row=whole_row, block_n=32, splits=splits)
    want = xor_fold(k) ^ xor_fold(v)
    assert xor_fold(call()) == want
    # One flipped bit in one key row changes the fold: the check can fail.
    k_cache.view(torch.int16).view(-1)[d * heads * 3 + 5] ^= 1
    assert xor_fold(call()) != want


def test_xor_fold():
    t = torch.tensor([1, 2, 4, 8, 16], dtype=torch.int32)
    assert xor_fold(t) == 31
    assert xor_fold(torch.tensor([5, 5], dtype=torch.int32)) == 0
