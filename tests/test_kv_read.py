"""The pure-read yardstick of `fmha bench decode` (`kernels.kv_read`): it must read every word of the cache once,
in any layout, or the bench's "ours / read" would compare against a read that skipped something. And the bench's
FP8-cache column: its cache, its bytes and its ratios."""
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


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("page", [None, 16])
def test_bench_fp8_cache_row(target, page, monkeypatch):
    """`fmha bench decode`'s FP8-cache column (`bench._fp8_cache_row`), every call timed at a fixed 1 ms: the FP8
    cache must hold the row's keys in the bf16 cache's page order (else the oracle check fails and the row says so),
    its bytes count K and V at one byte a value, its ratios are tokens a second, and its read is whole."""
    import fmha
    from fmha import bench

    device, dtype = target
    monkeypatch.setattr(bench, "bench_gpu_graph", lambda fn: (fn(), 1e-3)[1])
    monkeypatch.setattr(bench, "_heat", lambda fns: None)
    b, hq, hk, keys, d = 2, 4, 2, 256, 64
    q = torch.randn(b, 1, hq, d, device=device).to(dtype)
    k = torch.randn(b, keys, hk, d, device=device).to(dtype)
    v = torch.randn(b, keys, hk, d, device=device).to(dtype)
    seqlens = torch.full((b,), keys, dtype=torch.int32, device=device)
    table = None if page is None else paged_copy(page, k, v)[2]
    nbytes = (2 * k.numel() + 2 * q.numel()) * 2
    row = {"ours_gbps": nbytes / 2e-3 / 1e9, "cudnn_gbps": nbytes / 4e-3 / 1e9}     # bf16 calls of 2 ms and 4 ms
    bench._fp8_cache_row(row, q, k, v, seqlens, table, page, nbytes)
    assert "ours-fp8_error" not in row and "read-fp8_error" not in row, row
    nbytes8 = 2 * k.numel() + 2 * q.numel() * 2
    assert row["ours-fp8_gbps"] == pytest.approx(nbytes8 / 1e-3 / 1e9)
    assert row["ours-fp8_vs_ours"] == pytest.approx(2.0)
    assert row["ours-fp8_vs_cudnn"] == pytest.approx(4.0)
    assert row["ours-fp8_vs_read-fp8"] == pytest.approx(1.0)
    # A kernel that answers wrongly is reported, not timed.
    monkeypatch.setattr(fmha, "attention_with_kvcache", lambda q, *a, **kw: torch.zeros_like(q) + 1)
    row = {}
    bench._fp8_cache_row(row, q, k, v, seqlens, table, page, nbytes)
    assert "disagrees" in row["ours-fp8_error"] and "ours-fp8_gbps" not in row
