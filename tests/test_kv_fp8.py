"""FP8 KV-cache layouts (fmha.mla.quantize_kv_cache / dequantize_kv_cache): byte layout, round trip, bad input.
Pure torch: these run on the CPU (and anywhere torch does)."""
import pytest
import torch

import fmha.mla as flash_mla
from fmha._kv_fp8 import LAYOUTS


def _kv(layout, seed=0):
    d = LAYOUTS[layout][0]
    g = torch.Generator().manual_seed(seed)
    kv = (torch.randn(5, 16, 1, d, generator=g) * torch.rand(5, 16, 1, 1, generator=g) * 4).to(torch.bfloat16)
    kv[1, 3] = 0                                       # an all-zero token packs to zeros
    kv[2, 4, 0, :64] = 0                               # and an all-zero group
    return kv


@pytest.mark.parametrize("layout", ["v32", "model1"])
def test_round_trip(layout):
    d, nope, rope, group, nbytes = LAYOUTS[layout]
    kv = _kv(layout)
    packed = flash_mla.quantize_kv_cache(kv, layout)
    assert packed.dtype == torch.uint8 and packed.shape == (*kv.shape[:-1], nbytes)
    back = flash_mla.dequantize_kv_cache(packed, layout)
    assert back.dtype == torch.bfloat16 and back.shape == kv.shape
    assert torch.equal(back[..., nope:], kv[..., nope:])               # RoPE stored exactly
    x, y = kv[..., :nope].float(), back[..., :nope].float()
    amax = x.reshape(*x.shape[:-1], -1, group).abs().amax(-1).repeat_interleave(group, -1)
    # e4m3 keeps 3 mantissa bits (relative rounding error <= 2^-4), plus its subnormal step near zero, plus
    # bf16 rounding of the result; a power-of-two scale (model1) can leave up to 2x more headroom.
    bound = x.abs() / 16 + amax / 448 * 2 ** -9 * (2 if layout == "model1" else 1) + x.abs() / 256
    assert ((x - y).abs() <= bound + 1e-30).all()
    assert (y[1, 3] == 0).all()
    # Unpacked values survive another round trip unchanged; for v32 even the bytes do (its scale is exactly
    # amax / 448, while model1's power of two may halve when the group's largest value rounded down).
    again = flash_mla.quantize_kv_cache(back, layout)
    assert torch.equal(flash_mla.dequantize_kv_cache(again, layout), back)
    if layout == "v32":
        assert torch.equal(again, packed)


def test_v32_bytes():
    kv = _kv("v32", seed=1)
    packed = flash_mla.quantize_kv_cache(kv, "v32")
    scales = packed[..., 512:528].contiguous().view(torch.float32)
    amax = kv[..., :512].float().reshape(*kv.shape[:-1], 4, 128).abs().amax(-1)
    torch.testing.assert_close(scales, torch.where(amax > 0, amax, 1.0) / 448, rtol=0, atol=0)
    assert torch.equal(packed[..., 528:].contiguous().view(torch.bfloat16), kv[..., 512:])
    first = packed[..., :512].contiguous().view(torch.float8_e4m3fn).float()
    assert first.abs().amax().item() == 448.0                        # each group's largest value maps to 448


def test_model1_bytes():
    """FlashMLA's per-block layout: each page is page_size 576-byte rows (448 e4m3 values, 64 bf16 RoPE values),
    then 8 bytes per token (7 UE8M0 scales and a zero), the block padded to a multiple of 576 bytes."""
    kv = _kv("model1", seed=2)
    blocks, page = kv.shape[:2]
    packed = flash_mla.quantize_kv_cache(kv, "model1")
    assert packed.stride() == (-(-page * 584 // 576) * 576, 584, 584, 1)
    flat = packed.as_strided((blocks, packed.stride(0)), (packed.stride(0), 1))
    rows = flat[:, :page * 576].reshape(blocks, page, 576)
    tail = flat[:, page * 576:page * 584].reshape(blocks, page, 8)
    assert torch.equal(rows[..., 448:].contiguous().view(torch.bfloat16), kv[:, :, 0, 448:])
    scale = torch.exp2(tail[..., :7].float() - 127)
    amax = kv[:, :, 0, :448].float().reshape(blocks, page, 7, 64).abs().amax(-1)
    nonzero = amax > 0
    assert (scale[nonzero] * 448 >= amax[nonzero]).all() and (scale[nonzero] * 224 < amax[nonzero]).all()
    assert (tail[..., :7][~nonzero] == 0).all() and (tail[..., 7] == 0).all()
    values = rows[..., :448].contiguous().view(torch.float8_e4m3fn).float().reshape(blocks, page, 7, 64)
    torch.testing.assert_close((values * scale[..., None]).reshape(blocks, page, 448),
                               flash_mla.dequantize_kv_cache(packed, "model1", torch.float32)[:, :, 0, :448])


def test_bad_input():
    with pytest.raises(ValueError, match="layout"):
        flash_mla.quantize_kv_cache(_kv("v32"), "v4")
    with pytest.raises(ValueError, match="kv: expected a last dim of 512"):
        flash_mla.quantize_kv_cache(_kv("v32"), "model1")
    with pytest.raises(TypeError, match="kv: expected dtype"):
        flash_mla.quantize_kv_cache(_kv("v32").float(), "v32")
    with pytest.raises(TypeError, match="packed: expected dtype uint8"):
        flash_mla.dequantize_kv_cache(torch.zeros(2, 656), "v32")
    with pytest.raises(ValueError, match="packed: expected a last dim of 584"):
        flash_mla.dequantize_kv_cache(torch.zeros(2, 656, dtype=torch.uint8), "model1")
    with pytest.raises(ValueError, match="kv: expected a .num_blocks, page_size, 1, 512. paged cache"):
        flash_mla.quantize_kv_cache(_kv("model1")[:, :, 0], "model1")
    with pytest.raises(ValueError, match="packed: a model1 FP8 cache is"):       # per-token rows: not the layout
        flash_mla.dequantize_kv_cache(torch.zeros(4, 16, 1, 584, dtype=torch.uint8)[:, ::2], "model1")
