"""FP8 KV-cache layouts of DeepSeek-V3.2 ("v32") and DeepSeek-V4 ("model1"), packed and unpacked in torch; the
bytes are FlashMLA's, so a cache packed by either library is read by the other.

"v32", d = 576 (512 NoPE + 64 RoPE): each token's row of the paged cache `(num_blocks, page_size, 1, d)` becomes a
row of 656 bytes (uint8):
    bytes   0..511   the 512 NoPE values as float8_e4m3fn, each divided by its group's scale
    bytes 512..527   4 float32 scales, one per group of 128 NoPE values: scale = amax(|group|) / 448
    bytes 528..655   the 64 RoPE values as bfloat16, unchanged
"model1", d = 512 (448 NoPE + 64 RoPE): 584 bytes per token, laid out per page (block) of the cache, not per token:
the packed cache is a `(num_blocks, page_size, 1, 584)` uint8 view whose block b starts at byte b * stride(0)
(stride(1) = 584; quantize_kv_cache pads each block to a multiple of 576 bytes, as FlashMLA does) and holds
    bytes 0 .. page_size * 576 - 1            one 576-byte row per token, slot s at s * 576:
                                                  bytes   0..447   the 448 NoPE values as float8_e4m3fn, each
                                                                   divided by its group's scale
                                                  bytes 448..575   the 64 RoPE values as bfloat16, unchanged
    bytes page_size * 576 .. page_size * 584 - 1   8 bytes per token, slot s at page_size * 576 + s * 8:
                                                  bytes 0..6       7 UE8M0 scales (scale = 2^(byte - 127)), one per
                                                                   group of 64 NoPE values, the smallest power of
                                                                   two >= amax(|group|) / 448
                                                  byte  7          zero padding
So the view's "rows" are not tokens: index it only through these offsets (`dequantize_kv_cache` does).
A group that is all zeros gets the smallest scale (v32: 1 / 448; model1: byte 0) and packs to zeros.
Multi-byte fields are little-endian (the GPU's byte order), as `torch.Tensor.view(dtype)` reads them.
"""
from __future__ import annotations

import torch

E4M3_MAX = 448.0

# layout → (d, nope, rope, group, bytes per token)
LAYOUTS = {"v32": (576, 512, 64, 128, 656), "model1": (512, 448, 64, 64, 584)}
# model1's per-block geometry: a token's value row (448 e4m3 + 64 bf16), then its scale bytes (7 UE8M0 + pad).
MODEL1_ROW = 576
MODEL1_TAIL = 8


def _layout(layout):
    if layout not in LAYOUTS:
        raise ValueError(f"layout: expected one of {tuple(LAYOUTS)}, got {layout!r}")
    return LAYOUTS[layout]


def quantize_kv_cache(kv: torch.Tensor, layout: str) -> torch.Tensor:
    """bf16/fp16 → packed uint8 (see the module docstring): v32 `(..., 576)` → `(..., 656)`; model1 a paged cache
    `(num_blocks, page_size, 1, 512)` → `(num_blocks, page_size, 1, 584)` in per-block layout."""
    d, nope, rope, group, nbytes = _layout(layout)
    if not isinstance(kv, torch.Tensor):
        raise TypeError(f"kv: expected a torch.Tensor, got {type(kv).__name__}")
    if kv.dtype not in (torch.bfloat16, torch.float16):
        raise TypeError(f"kv: expected dtype bfloat16 or float16, got {str(kv.dtype).replace('torch.', '')}")
    if kv.dim() < 1 or kv.shape[-1] != d:
        raise ValueError(f"kv: expected a last dim of {d} for layout {layout!r}, got shape {tuple(kv.shape)}")
    if layout == "model1" and (kv.dim() != 4 or kv.shape[2] != 1):
        raise ValueError(f"kv: expected a (num_blocks, page_size, 1, {d}) paged cache for layout 'model1', got "
                         f"shape {tuple(kv.shape)}")
    lead = kv.shape[:-1]
    x = kv[..., :nope].float().reshape(*lead, nope // group, group)
    amax = x.abs().amax(-1, keepdim=True)
    if layout == "v32":
        scale = torch.where(amax > 0, amax, 1.0) / E4M3_MAX
        scale_bytes = scale.squeeze(-1).contiguous().view(torch.uint8)
    else:
        exponent = torch.ceil(torch.log2(torch.where(amax > 0, amax, 2.0 ** -127 * E4M3_MAX) / E4M3_MAX))
        exponent = exponent.clamp(-127, 127)
        scale = torch.exp2(exponent)
        scale_bytes = (exponent.squeeze(-1) + 127).to(torch.uint8)
    values = (x / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).reshape(*lead, nope).view(torch.uint8)
    rope_bytes = kv[..., nope:].to(torch.bfloat16).contiguous().view(torch.uint8)
    if layout == "v32":
        out = torch.zeros(*lead, nbytes, dtype=torch.uint8, device=kv.device)
        out[..., :nope] = values
        out[..., nope:nope + scale_bytes.shape[-1]] = scale_bytes
        out[..., nope + scale_bytes.shape[-1]:] = rope_bytes
        return out
    blocks, page = kv.shape[:2]
    row = MODEL1_ROW                                                   # nope + 2 * rope bytes of values
    padded = -(-page * nbytes // row) * row
    buf = torch.zeros(blocks, padded, dtype=torch.uint8, device=kv.device)
    rows = buf[:, :page * row].view(blocks, page, row)
    rows[..., :nope] = values.view(blocks, page, nope)
    rows[..., nope:] = rope_bytes.view(blocks, page, 2 * rope)
    buf[:, page * row:page * nbytes].view(blocks, page, nbytes - row)[..., :nope // group] = \
        scale_bytes.view(blocks, page, nope // group)
    return buf[:, :page * nbytes].view(blocks, page, 1, nbytes)


def model1_parts(packed: torch.Tensor):
    """(value rows `(num_blocks, page_size, 576)`, scale rows `(num_blocks, page_size, 8)`) of a packed model1
    cache `(num_blocks, page_size, 1, 584)` (stride(1) = 584, last dim contiguous): strided views of its blocks."""
    blocks, page = packed.shape[:2]
    base = packed.storage_offset()
    values = packed.as_strided((blocks, page, MODEL1_ROW), (packed.stride(0), MODEL1_ROW, 1), base)
    scales = packed.as_strided((blocks, page, MODEL1_TAIL), (packed.stride(0), MODEL1_TAIL, 1),
                               base + page * MODEL1_ROW)
    return values, scales


def dequantize_kv_cache(packed: torch.Tensor, layout: str, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """Packed uint8 (or float8_e4m3fn) → `(..., d)` in `dtype` (bf16 by default; the oracles use fp32): NoPE values
    times their scales, RoPE as stored. v32 `(..., 656)`; model1 a paged cache `(num_blocks, page_size, 1, 584)`
    in per-block layout (stride(1) = 584)."""
    d, nope, rope, group, nbytes = _layout(layout)
    if not isinstance(packed, torch.Tensor):
        raise TypeError(f"packed: expected a torch.Tensor, got {type(packed).__name__}")
    if isinstance(packed, torch.Tensor) and packed.dtype == torch.float8_e4m3fn:
        packed = packed.view(torch.uint8)
    if packed.dtype != torch.uint8:
        raise TypeError(f"packed: expected dtype uint8, got {str(packed.dtype).replace('torch.', '')}")
    if packed.dim() < 1 or packed.shape[-1] != nbytes:
        raise ValueError(f"packed: expected a last dim of {nbytes} bytes for layout {layout!r}, "
                         f"got shape {tuple(packed.shape)}")
    groups = nope // group
    if layout == "v32":
        lead = packed.shape[:-1]
        values = packed[..., :nope]
        scale = packed[..., nope:nope + 4 * groups].contiguous().view(torch.float32)
        rope_bytes = packed[..., nope + 4 * groups:]
    else:
        check_model1_cache("packed", packed)
        lead = packed.shape[:-1]
        rows, scale_rows = model1_parts(packed)
        values, rope_bytes = rows[..., :nope].unsqueeze(2), rows[..., nope:].unsqueeze(2)
        scale = torch.exp2(scale_rows[..., :groups].float() - 127).unsqueeze(2)
    values = values.contiguous().view(torch.float8_e4m3fn).float().reshape(*lead, groups, group)
    out = torch.empty(*lead, d, dtype=dtype, device=packed.device)
    out[..., :nope] = (values * scale.unsqueeze(-1)).reshape(*lead, nope).to(dtype)
    out[..., nope:] = rope_bytes.contiguous().view(torch.bfloat16).to(dtype)
    return out


def check_model1_cache(name: str, packed: torch.Tensor):
    """A model1 cache must be a `(num_blocks, page_size, 1, 584)` view of whole blocks in per-block layout:
    stride(1) = 584 bytes and the last dim contiguous, each block's page_size * 584 bytes before the next."""
    nbytes = MODEL1_ROW + MODEL1_TAIL
    if packed.dim() != 4 or packed.shape[2] != 1 or packed.stride(3) != 1 or packed.stride(1) != nbytes or (
            packed.shape[0] > 1 and packed.stride(0) < packed.shape[1] * nbytes):
        raise ValueError(f"{name}: a model1 FP8 cache is a (num_blocks, page_size, 1, 584) view of per-block rows "
                         f"(stride(1) 584, blocks page_size * 584 bytes or more apart; see quantize_kv_cache), got "
                         f"shape {tuple(packed.shape)} strides {tuple(packed.stride())}")
