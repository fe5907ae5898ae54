"""FP8 KV-cache layouts of DeepSeek-V3.2 ("v32") and DeepSeek-V4 ("model1"), packed and unpacked in torch.

Each token's row of the paged cache `(num_blocks, page_size, 1, d)` becomes a row of bytes (uint8):

"v32", d = 576 (512 NoPE + 64 RoPE) → 656 bytes per token:
    bytes   0..511   the 512 NoPE values as float8_e4m3fn, each divided by its group's scale
    bytes 512..527   4 float32 scales, one per group of 128 NoPE values: scale = amax(|group|) / 448
    bytes 528..655   the 64 RoPE values as bfloat16, unchanged
"model1", d = 512 (448 NoPE + 64 RoPE) → 584 bytes per token:
    bytes   0..447   the 448 NoPE values as float8_e4m3fn, each divided by its group's scale
    bytes 448..575   the 64 RoPE values as bfloat16, unchanged
    bytes 576..582   7 UE8M0 scales (one byte each: scale = 2^(byte - 127)), one per group of 64 NoPE values,
                     the smallest power of two >= amax(|group|) / 448
    byte  583        zero padding (keeps the row 8-byte aligned)
A group that is all zeros gets the smallest scale (v32: 1 / 448; model1: byte 0) and packs to zeros.
Multi-byte fields are little-endian (the GPU's byte order), as `torch.Tensor.view(dtype)` reads them.
"""
from __future__ import annotations

import torch

E4M3_MAX = 448.0

# layout → (d, nope, rope, group, bytes per token)
LAYOUTS = {"v32": (576, 512, 64, 128, 656), "model1": (512, 448, 64, 64, 584)}


def _layout(layout):
    if layout not in LAYOUTS:
        raise ValueError(f"layout: expected one of {tuple(LAYOUTS)}, got {layout!r}")
    return LAYOUTS[layout]


def quantize_kv_cache(kv: torch.Tensor, layout: str) -> torch.Tensor:
    """bf16/fp16 `(..., d)` → packed uint8 `(..., bytes_per_token)` (see the module docstring)."""
    d, nope, rope, group, nbytes = _layout(layout)
    if not isinstance(kv, torch.Tensor):
        raise TypeError(f"kv: expected a torch.Tensor, got {type(kv).__name__}")
    if kv.dtype not in (torch.bfloat16, torch.float16):
        raise TypeError(f"kv: expected dtype bfloat16 or float16, got {str(kv.dtype).replace('torch.', '')}")
    if kv.dim() < 1 or kv.shape[-1] != d:
        raise ValueError(f"kv: expected a last dim of {d} for layout {layout!r}, got shape {tuple(kv.shape)}")
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
    out = torch.zeros(*lead, nbytes, dtype=torch.uint8, device=kv.device)
    out[..., :nope] = values
    if layout == "v32":
        out[..., nope:nope + scale_bytes.shape[-1]] = scale_bytes
        out[..., nope + scale_bytes.shape[-1]:] = rope_bytes
    else:
        out[..., nope:nope + 2 * rope] = rope_bytes
        out[..., nope + 2 * rope:nope + 2 * rope + nope // group] = scale_bytes
    return out


def dequantize_kv_cache(packed: torch.Tensor, layout: str, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """Packed uint8 (or float8_e4m3fn) `(..., bytes_per_token)` → `(..., d)` in `dtype` (bf16 by default; the
    oracles use fp32): NoPE values times their scales, RoPE as stored."""
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
    lead = packed.shape[:-1]
    groups = nope // group
    values = packed[..., :nope].contiguous().view(torch.float8_e4m3fn).float().reshape(*lead, groups, group)
    if layout == "v32":
        scale = packed[..., nope:nope + 4 * groups].contiguous().view(torch.float32)
        rope_bytes = packed[..., nope + 4 * groups:]
    else:
        rope_bytes = packed[..., nope:nope + 2 * rope]
        scale = torch.exp2(packed[..., nope + 2 * rope:nope + 2 * rope + groups].float() - 127)
    out = torch.empty(*lead, d, dtype=dtype, device=packed.device)
    out[..., :nope] = (values * scale.unsqueeze(-1)).reshape(*lead, nope).to(dtype)
    out[..., nope:] = rope_bytes.contiguous().view(torch.bfloat16).to(dtype)
    return out
