"""Sliding-window prefill (with and without sinks), softcap and ALiBi on the Gluon kernel, against the portable kernel
that ran these calls before and against FlexAttention with a sliding-window block mask, in one process.

    PYTHONPATH=src python3 benchmarks/probe_window.py [--models gpt-oss ...] [--seqs 1024 ...]
        [--tiles 128,4,2,232,2[,pp] ...] [--versions A.py ...] [--out window.json]

Shapes are today's windowed models at 16k tokens: gpt-oss (d = 64, 64 query heads over 8, window 128, sinks),
a Mistral-style layer (d = 128, 32 over 8, window 4096), a Gemma-3-style local layer (d = 256, 16 over 8, window
1024), a Gemma-2-style one (d = 256, 16 over 8, window 4096, softcap 50), and an MPT / BLOOM-style causal layer
with ALiBi (d = 128, 32 heads, the ALiBi paper's slopes), as b sequences of s. TFLOP/s count the
pairs the window lets through. Ours is checked against the portable kernel (and FlexAttention where there is no
sink; FlexAttention has no sink term, so with sinks its row is the same window without them: a lower bound on what
it would cost; the softcap or ALiBi is its score_mod). The ALiBi row also has torch SDPA with the bias as a float
mask (`sdpa_bias`, what HF's MPT does). `--tiles` adds rows of the Gluon kernel with other tile configs
(BLOCK_N, STAGES, Q_BUFS, consumer registers, consumer warpgroups; `,pp` for ping-pong on), named `gluon-<config>`;
`--versions` rows of other copies of `kernels/forward_sm90.py` (e.g. `git show REV:src/fmha/kernels/forward_sm90.py
> base.py`) with their own tiles, named after the file.
"""
import argparse
import os

import torch

import fmha
from fmha.bench import attention_flops, load_module_copy, probe_row, save_sweep
from fmha.cli import _alibi_slopes as alibi_slopes
from fmha.kernels.forward import attention_forward

# (name, head_dim, heads_q, heads_k, window, sinks, softcap, ALiBi)
MODELS = [("gpt-oss", 64, 64, 8, (128, 0), True, 0.0, False), ("mistral", 128, 32, 8, (4096, 0), False, 0.0, False),
          ("gemma3-local", 256, 16, 8, (1024, 0), False, 0.0, False),
          ("gemma2-local", 256, 16, 8, (4096, 0), False, 50.0, False),
          ("mpt-alibi", 128, 32, 32, (-1, 0), False, 0.0, True)]


def portable(q, k, v, window, sinks, softcap, slopes):
    out = q.new_empty(*q.shape[:3], v.shape[-1])
    lse = torch.empty(q.shape[0], q.shape[2], q.shape[1], dtype=torch.float32, device=q.device)

    def call():
        attention_forward(q, k, v, out, lse, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None,
                          max_seqlen_k=None, softmax_scale=None, window=window, softcap=softcap, alibi_slopes=slopes,
                          sinks=sinks, backend="triton")
        return out
    return call


def sdpa_bias(q, k, v, slopes):
    """ALiBi as HF's MPT runs it: torch SDPA with the causal ALiBi bias as a float mask, (1, h, s, s) bf16
    (memory-efficient or cuDNN backend, torch's pick)."""
    s = q.shape[1]
    rel = torch.arange(s, device=q.device)[None, :] - torch.arange(s, device=q.device)[:, None]      # j - i
    bias = (slopes[:, None, None] * rel.clamp(max=0)).masked_fill(rel > 0, float("-inf")).to(q.dtype)[None]
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
    return lambda: torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, attn_mask=bias).transpose(1, 2)


def flex_call(q, k, v, window, softcap, slopes):
    """Compiled FlexAttention: SPEC.md's window as a block mask (a bound of -1: none), the softcap or ALiBi as its
    score_mod (which sees the scaled score, as SPEC.md's ALiBi does)."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    flex = torch.compile(flex_attention, dynamic=False)
    sq, sk = q.shape[1], k.shape[1]
    left, right = (sq + sk if x < 0 else x for x in window)

    def visible(b, h, i, j):
        d = j - i - (sk - sq)
        return (d <= right) & (d >= -left)
    mask = create_block_mask(visible, None, None, sq, sk)
    score_mod = None
    if softcap > 0:
        def score_mod(score, b, h, i, j):
            return softcap * torch.tanh(score / softcap)
    if slopes is not None:
        def score_mod(score, b, h, i, j):
            return score - slopes[h] * (i + sk - sq - j).abs()
    qt, kt, vt = (t.transpose(1, 2).contiguous() for t in (q, k, v))
    return lambda: flex(qt, kt, vt, block_mask=mask, score_mod=score_mod,
                        enable_gqa=q.shape[2] != k.shape[2]).transpose(1, 2)


def gluon_tiles(q, k, v, window, sinks, softcap, slopes, spec=None, module=None):
    """The Gluon kernel (`module`, a copy of `forward_sm90`, or the package's) with the tile config `spec`
    ("128,4,2,232,2" or "...,pp"; None: its own choice)."""
    from fmha.kernels import forward_sm90
    module = module or forward_sm90
    fields = spec.split(",") if spec else []
    tiles = tuple(int(x) for x in fields[:5]) or None
    out = q.new_empty(*q.shape[:3], v.shape[-1])
    lse = torch.empty(q.shape[0], q.shape[2], q.shape[1], dtype=torch.float32, device=q.device)

    def call():
        module.attention_forward_sm90(q, k, v, out, lse, causal=window[1] >= 0, softmax_scale=q.shape[-1] ** -0.5,
                                      window=window, sinks=sinks, softcap=softcap, alibi_slopes=slopes, tiles=tiles,
                                      pingpong=True if fields[5:] == ["pp"] else None if tiles is None else False)
        return out
    return call


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--seqs", type=int, nargs="*", default=[1024, 4096, 16384])
    p.add_argument("--models", nargs="*", default=[m[0] for m in MODELS])
    p.add_argument("--tiles", nargs="*", default=[])
    p.add_argument("--versions", nargs="*", default=[])
    p.add_argument("--out", default=None)
    a = p.parse_args()
    versions = {os.path.basename(f): load_module_copy(f) for f in a.versions}
    torch._dynamo.config.cache_size_limit = 4096
    rows = []
    for name, d, hq, hk, window, with_sinks, softcap, alibi in MODELS:
        if name not in a.models:
            continue
        for s in a.seqs:
            b = 16384 // s
            torch.manual_seed(0)
            q = torch.randn(b, s, hq, d, device="cuda", dtype=torch.bfloat16)
            k, v = (torch.randn(b, s, hk, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
            sinks = torch.randn(hq, device="cuda") if with_sinks else None
            slopes = alibi_slopes(hq).cuda() if alibi else None
            flops = attention_flops(b, s, s, hq, d, d, window=window)
            impls = {"ours": lambda: fmha.attention(q, k, v, window=window, sinks=sinks, softcap=softcap,
                                                    alibi_slopes=slopes),
                     "ours-triton": portable(q, k, v, window, sinks, softcap, slopes),
                     **({"sdpa-bias": sdpa_bias(q, k, v, slopes)} if alibi else {}),
                     "flex": flex_call(q, k, v, window, softcap, slopes),
                     **{f"gluon-{spec}": gluon_tiles(q, k, v, window, sinks, softcap, slopes, spec)
                        for spec in a.tiles},
                     **{name: gluon_tiles(q, k, v, window, sinks, softcap, slopes, module=module)
                        for name, module in versions.items()}}
            row = dict(model=name, d=d, hq=hq, hk=hk, b=b, s=s, window=list(window), sinks=with_sinks, softcap=softcap,
                       alibi=alibi)
            # FlexAttention has no sink term: with sinks its output is not comparable.
            peers = [] if with_sinks else ["flex"] + (["sdpa-bias"] if alibi else [])
            probe_row(rows, row, impls, flops,
                      compare=["ours-triton", *peers, *(f"gluon-{t}" for t in a.tiles), *versions])
    if a.out:
        save_sweep(a.out, rows)


if __name__ == "__main__":
    main()
