"""Exact merging of attention computed over disjoint key sets (split-KV, cascade / shared prefixes,
context parallelism, two-source attention).

If `(o_i, lse_i)` is softmax attention of the same queries over key set K_i, then over the union:
    lse = log(sum_i e^{lse_i}),   o = sum_i e^{lse_i - lse} * o_i.
A part that saw no key (lse -inf) adds exactly 0, whatever its output holds (NaN too: SDPA's output for a row with
every key masked); if no part saw a key, o = 0 and lse = -inf. An LSE of +inf is
read as -inf: FlashMLA's API (`fmha.mla`) marks a row with no key so (output 0), and vLLM's merge reads it the same
way; a real sum of exponentials never reaches it (its scores would be infinite).
All arithmetic is fp32; the output takes the dtype of the first `o`.
"""
from __future__ import annotations

import torch

from . import _validate as V

__all__ = ["merge_attention_states", "merge_attention_states_list", "apply_attention_sink"]


def _check_parts(outs, lses, o_names, lse_names):
    """`o_names` / `lse_names`: each part's argument names in the caller's signature, for the messages."""
    if len(outs) != len(lses) or len(outs) == 0:
        raise ValueError(f"lses: expected one LSE per output ({len(outs)} outputs), got {len(lses)}")
    V.check_tensor(o_names[0], outs[0])
    o0 = outs[0]
    for o, lse, o_name, lse_name in zip(outs, lses, o_names, lse_names):
        V.check_tensor(o_name, o, dtypes=(torch.float16, torch.bfloat16, torch.float32), device=o0.device)
        V.check_tensor(lse_name, lse, dtypes=(torch.float32,), device=o0.device)
        if o.dim() < 1 or o.shape != o0.shape:
            raise ValueError(f"{o_name}: expected shape {tuple(o0.shape)} (all parts alike), got {tuple(o.shape)}")
        if o.dtype != o0.dtype:
            raise TypeError(f"{o_name}: expected dtype {o0.dtype} like {o_names[0]}, got {o.dtype}")
        if lse.shape != o.shape[:-1]:
            raise ValueError(f"{lse_name}: expected shape {tuple(o.shape[:-1])} ({o_name}'s shape without its last "
                             f"dim), got {tuple(lse.shape)}")


def merge_states(outs, lses):
    """The merge itself, no checks: outs `(*, d)` and lses `(*)` per part → (o in outs[0]'s dtype, lse)."""
    lse_all = torch.stack(list(lses))                       # (n, *)
    lse_all = torch.where(torch.isposinf(lse_all), -torch.inf, lse_all)     # fmha.mla's empty rows
    lse = torch.logsumexp(lse_all, dim=0)                   # -inf where every part is -inf
    safe = torch.where(torch.isneginf(lse), 0.0, lse)
    weights = torch.exp(lse_all - safe).unsqueeze(-1)       # e^{-inf} = 0 for empty parts
    parts = torch.stack(list(outs)).float()
    o = torch.where(weights == 0, 0.0, weights * parts).sum(0)      # 0 x NaN would be NaN; one pass for all parts
    return o.to(outs[0].dtype), lse


def merge_attention_states(o_a, lse_a, o_b, lse_b):
    """Merge two partial attention results over disjoint key sets.

    Args:
        o_a, o_b: `(*, head_dim)` partial outputs, same shape and dtype (fp16/bf16/fp32).
        lse_a, lse_b: `(*)` fp32 natural-log LSEs, shape = o's shape without the last dim. For fmha's
            `(batch, seqlen, heads, d)` outputs with `(batch, heads, seqlen)` LSEs, pass `lse.transpose(1, 2)`.

    Returns:
        `(o, lse)`: o in o_a's dtype, lse fp32; exact up to rounding, -inf (or +inf, `fmha.mla`'s empty row)
        handled on either side.
    """
    _check_parts([o_a, o_b], [lse_a, lse_b], ("o_a", "o_b"), ("lse_a", "lse_b"))
    return merge_states([o_a, o_b], [lse_a, lse_b])


def merge_attention_states_list(outs, lses):
    """The list form of `merge_attention_states`: any number of parts, same shapes as the pair form."""
    outs, lses = list(outs), list(lses)
    _check_parts(outs, lses, [f"outs[{i}]" for i in range(len(outs))], [f"lses[{i}]" for i in range(len(lses))])
    return merge_states(outs, lses)


def apply_attention_sink(out, lse, sinks):
    """Put per-head attention sinks on a merged (or any sink-free) result: out * e^lse / (e^lse + e^sink).

    The last step of an external merge: run each branch without sinks (`return_lse=True`), merge them with
    `merge_attention_states`, then call this once. The LSE is unchanged (it never includes the sink).

    Args:
        out: `(*, heads, d)` fp16/bf16/fp32.
        lse: `(*, heads)` fp32 (out's shape without its last dim); a row with LSE -inf (or +inf, `fmha.mla`'s
            empty row) keeps its output (0).
        sinks: `(heads,)` fp32; +inf silences a head, -inf changes nothing.

    Returns:
        the scaled output, in out's dtype.
    """
    _check_parts([out], [lse], ("out",), ("lse",))
    if out.dim() < 2:
        raise ValueError(f"out: expected (*, heads, d), got shape {tuple(out.shape)}")
    V.check_tensor("sinks", sinks)
    V.check_per_head("sinks", sinks, out.shape[-2], out.device)
    keep = torch.where(torch.isinf(lse), 1.0, torch.sigmoid(lse - sinks))     # +inf: fmha.mla's empty row
    return (out.float() * keep.unsqueeze(-1)).to(out.dtype)
