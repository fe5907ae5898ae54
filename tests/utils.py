"""Helpers shared by the tests: targets (cpu/gpu), poisoned inputs, and the comparison against the oracle."""
import pytest
import torch

# One parameter per target; each test runs the same cases on both, at the target's sizes.
TARGETS = [
    pytest.param(("cpu", torch.float16), marks=pytest.mark.cpu, id="cpu-fp16"),
    pytest.param(("cuda", torch.float16), marks=pytest.mark.gpu, id="gpu-fp16"),
    pytest.param(("cuda", torch.bfloat16), marks=pytest.mark.gpu, id="gpu-bf16"),
]

# Tolerances, stated once: |ours - oracle| <= ATOL + RTOL * |oracle| on outputs, LSE_ATOL on the LSE.
ATOL = {torch.float16: 4e-3, torch.bfloat16: 3e-2}
RTOL = {torch.float16: 1e-2, torch.bfloat16: 3e-2}
LSE_ATOL = 2e-3


def poisoned(shape, valid, dtype, device, *, pad_rows=7, pad_cols=8, dim=1, scale=1.0):
    """A random tensor of `shape` living inside a NaN-filled buffer that is larger along `dim` (rows the
    kernel must not read) and along the last dim (columns past head_dim it must not read).

    `valid` is the number of real rows along `dim`; rows [valid, shape[dim]) are NaN too.
    """
    big = list(shape)
    big[dim] += pad_rows
    big[-1] += pad_cols
    # FP8 buffers are filled in fp32 and converted whole (conversion is the one float8 op every device has).
    make = torch.float32 if dtype.itemsize == 1 else dtype
    buf = torch.full(big, float("nan"), dtype=make, device=device)
    view = buf[tuple(slice(0, s) for s in shape)]
    index = [slice(None)] * len(shape)
    index[dim] = slice(0, valid)
    view[tuple(index)] = (torch.randn(view[tuple(index)].shape, device=device) * scale).to(dtype).to(make)
    return buf.to(dtype)[tuple(slice(0, s) for s in shape)]


def assert_close(name, ours, ref, dtype):
    ours = ours.float()
    assert not torch.isnan(ours).any(), f"{name}: NaN in output"
    err = (ours - ref).abs()
    bound = ATOL[dtype] + RTOL[dtype] * ref.abs()
    worst = (err - bound).max().item() if err.numel() else 0.0
    assert worst <= 0, f"{name}: max abs err {err.max().item():.3e} exceeds tolerance"
    if ref.numel() and ref.abs().max() > 0:
        cos = torch.nn.functional.cosine_similarity(ours.flatten().double(), ref.flatten().double(), dim=0)
        assert 1 - cos.item() < 1e-4, f"{name}: cos diff {1 - cos.item():.2e}"


def assert_lse_close(ours, ref):
    assert torch.equal(torch.isneginf(ours), torch.isneginf(ref)), "lse: -inf rows differ from the oracle"
    finite = torch.isfinite(ref)
    assert torch.isfinite(ours[finite]).all(), "lse: non-finite where the oracle is finite"
    if finite.any():
        err = (ours[finite] - ref[finite]).abs().max().item()
        assert err <= LSE_ATOL, f"lse: max abs err {err:.3e}"


def assert_matches(got, lse, oracle, dtype):
    """`oracle` is the (out, lse) pair from fmha.reference."""
    ref, ref_lse = oracle
    assert_close("out", got, ref, dtype)
    assert_lse_close(lse, ref_lse)
