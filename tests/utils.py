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


def poison(t):
    """Fill `t` with NaN, or with 0xFF bytes for a one-byte dtype (e4m3's NaN; packed FP8 caches)."""
    if t.element_size() == 1:
        t.view(torch.uint8).fill_(0xFF)
    else:
        t.fill_(float("nan"))


def paged_packed(page_size, k, v, cu_seqlens, perm=None):
    """Packed keys and values `(total, heads_k, d)` of the sequences `cu_seqlens` (int32, `(batch + 1,)`) as
    paged caches, pages shuffled (`bench.paged_copy`, `perm` as there): `(k_cache, v_cache, block_table)`, each
    sequence's pages padded with NaN past its keys (pages for at least one key)."""
    from fmha.bench import paged_copy
    lens = (cu_seqlens[1:] - cu_seqlens[:-1]).tolist()
    logical = [torch.full((len(lens), max(max(lens), 1), *t.shape[1:]), float("nan"), device=t.device).to(t.dtype)
               for t in (k, v)]
    for i, n in enumerate(lens):
        for whole, t in zip(logical, (k, v)):
            whole[i, :n] = t[cu_seqlens[i]:cu_seqlens[i + 1]]
    return paged_copy(page_size, *logical, perm=perm)


def garbled_table(table, seqlens, page_size):
    """A copy of the block table `table` (int32, `(batch, max_pages)`) whose entries past each sequence's last page
    (all of a sequence of length 0's) hold indices of no page: 2^31 - 1, -1, -2^31, 2^20 in turn, as engines leave
    padding columns. A kernel may read none of them as a page."""
    table = table.clone()
    junk = torch.tensor([2 ** 31 - 1, -1, -2 ** 31, 2 ** 20], dtype=torch.int32, device=table.device)
    for i, n in enumerate(seqlens):
        used = -(-int(n) // page_size)
        rest = table.shape[1] - used
        table[i, used:] = junk.repeat(-(-rest // 4))[:rest]
    return table


def far_pages(table, *caches, past=2 ** 31):
    """Paged `caches` (same shape and dtype, sharing `table`) moved into one buffer at offsets past `past` elements:
    returns views of it, one a cache, whose pages `shift + j` hold page j of the original, the shifted table, and
    `shift`. Each view's used pages then start more than 2^31 elements from its base, where a 32-bit offset
    product wraps. Views overlap (view i starts i pages-per-cache in), so the buffer is only `shift` pages more
    than the caches. On the GPU the leading pages are poisoned (NaN, or 0xFF bytes: e4m3's NaN); on the CPU
    they are left unallocated (never touched: a wrapped read finds zeros, or faults)."""
    pages, dtype, device = caches[0].shape[0], caches[0].dtype, caches[0].device
    shift = -(-past // caches[0][0].numel())
    buf = torch.empty((shift + len(caches) * pages,) + tuple(caches[0].shape[1:]), dtype=dtype, device=device)
    if device.type == "cuda":
        poison(buf[:shift])
    views = []
    for i, cache in enumerate(caches):
        buf[shift + i * pages: shift + (i + 1) * pages] = cache
        views.append(buf[i * pages: i * pages + shift + pages])
    return views, (table + shift if table is not None else None), shift


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


def assert_lse_close(ours, ref, atol=LSE_ATOL):
    assert torch.equal(torch.isneginf(ours), torch.isneginf(ref)), "lse: -inf rows differ from the oracle"
    finite = torch.isfinite(ref)
    assert torch.isfinite(ours[finite]).all(), "lse: non-finite where the oracle is finite"
    if finite.any():
        err = (ours[finite] - ref[finite]).abs().max().item()
        assert err <= atol, f"lse: max abs err {err:.3e}, bound {atol:.3e}"


def spy(monkeypatch, module, name, record=lambda args, kwargs: 1):
    """Replace `module.name` (a kernel's launcher) by a wrapper that calls it and appends `record(args, kwargs)` to
    the list returned, so a test can assert which kernel a call reached."""
    calls = []
    launch = getattr(module, name)

    def counted(*args, **kwargs):
        calls.append(record(args, kwargs))
        return launch(*args, **kwargs)
    monkeypatch.setattr(module, name, counted)
    return calls


def assert_forward_only(call, name, *inputs):
    """`call(*inputs)` with each input requiring grad gives the values it gives under no_grad, each floating result
    in the inputs' graph, and a backward through them raises naming `fmha.<name>` (fmha has no backward kernels:
    without that error a loss through the results would silently give the inputs no gradient)."""
    with torch.no_grad():
        plain = call(*inputs)
    plain = (plain,) if isinstance(plain, torch.Tensor) else tuple(plain)
    assert not any(t.requires_grad for t in plain)
    marked = call(*(t.detach().requires_grad_() for t in inputs))
    marked = (marked,) if isinstance(marked, torch.Tensor) else tuple(marked)
    assert len(marked) == len(plain)
    for ours, ref in zip(marked, plain):
        assert ours.requires_grad and ours.grad_fn is not None
        torch.testing.assert_close(ours.detach(), ref, atol=0, rtol=0, equal_nan=True)
    loss = sum(t.float().nan_to_num(0.0, 0.0, 0.0).sum() for t in marked)
    with pytest.raises(RuntimeError, match=f"fmha.{name} has no backward"):
        loss.backward()


def assert_matches(got, lse, oracle, dtype):
    """`oracle` is the (out, lse) pair from fmha.reference."""
    ref, ref_lse = oracle
    assert_close("out", got, ref, dtype)
    assert_lse_close(lse, ref_lse)


def assert_matches_fp8_p(got, lse, oracle, q, k, v, descales, softmax_scale=None):
    """FP8 q, k, v against the fp32 oracle `oracle` (on the descaled values), with bounds for the Gluon kernel's FP8
    math, which hold for the portable kernel's (fp16 P, exact widening) too; from the Gluon kernel's two roundings:
    - Hopper's e4m3 wgmma accumulates with about 14 bits of mantissa (DeepSeek-V3's report, section 3.3.2), so a
      score of head_dim / 32 accumulation steps is within (head_dim / 32) 2^-13 of the sum of its |q_i k_i| (a
      factor of 2 of slack) times the scale: `slack`, the largest such over the call. The LSE moves by at most
      that (on top of the usual bound), each output by about 2 slack max |v|.
    - P (FlashAttention-3's): scaled into (0, 256] and rounded to e4m3, within 2^-4 of itself where normal (from
      2^-6), within 2^-10 below that, and a row's sum is at least 256: each output within (2^-4 + keys 2^-18)
      max |v| of the attention of its rounded scores (its weights sum to 1), plus bf16's rounding of the output.
    The cosine bound is the bf16 one relaxed to what the rounding of P allows. Packed sequences (3-D q, k, v):
    bounded as one batch of all of them, each descale at its largest over the sequences."""
    ref, ref_lse = oracle
    if q.dim() == 3:
        q, k, v = (t.unsqueeze(0) for t in (q, k, v))
        descales = {n: t.amax(0, keepdim=True) for n, t in descales.items()}
    b, sk, hk, d = k.shape
    group = q.shape[2] // hk
    ones = torch.ones(b, hk, device=q.device)
    q_d, k_d, v_d = (descales.get(n, ones) for n in ("q_descale", "k_descale", "v_descale"))
    scale = softmax_scale if softmax_scale is not None else d ** -0.5
    qa = q.float().abs() * q_d.repeat_interleave(group, 1)[:, None, :, None]
    ka = (k.float().abs() * k_d[:, None, :, None]).repeat_interleave(group, 2)
    largest = lambda t: t.amax().item() if t.numel() else 0.0        # noqa: E731 (no queries or no keys: 0)
    slack = d / 32 * 2.0 ** -13 * scale * largest(torch.einsum("bihd,bjhd->bhij", qa, ka))
    got = got.float()
    assert not torch.isnan(got).any(), "out: NaN in output"
    v_max = largest((v.float() * v_d[:, None, :, None]).abs())
    bound = (2.0 ** -4 + sk * 2.0 ** -18 + 2 * slack) * v_max + 2.0 ** -7 * ref.abs()
    err = (got - ref).abs()
    assert (err <= bound).all(), f"out: max abs err {err.max().item():.3e}, bound {bound.min().item():.3e}"
    if ref.numel() and ref.abs().max() > 0:      # as `assert_close`: no cosine of an empty or all-zero output
        cos = torch.nn.functional.cosine_similarity(got.flatten().double(), ref.flatten().double(), dim=0)
        assert 1 - cos.item() < 1e-3, f"out: cos diff {1 - cos.item():.2e}"
    assert_lse_close(lse, ref_lse, atol=LSE_ATOL + slack)
