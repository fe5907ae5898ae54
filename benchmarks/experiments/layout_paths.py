"""Which prefill kernel each of `test_input_layouts`' layouts takes on this GPU (the Gluon kernel where
`forward_sm90.supported` accepts its strides for TMA, else the portable one), with q's and k's strides.

    PYTHONPATH=src python3 benchmarks/experiments/layout_paths.py
"""
import sys

import torch

sys.path.insert(0, "tests")
from test_attention import _laid_out  # noqa: E402
from fmha.kernels import forward_sm90  # noqa: E402

for layout in ("bhsd", "fused", "shared", "one-head"):
    q, k, v = _laid_out(layout, 2, 700, 8, 2, 128, torch.bfloat16, "cuda")
    print(layout, [t.stride() for t in (q, k)], "gluon" if forward_sm90.supported(q, k, v) else "portable")
