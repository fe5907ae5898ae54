import sys, torch
sys.path.insert(0, "tests")
from test_attention import _laid_out
from fmha.kernels import forward_sm90
for layout in ("bhsd", "fused", "shared", "one-head"):
    q, k, v = _laid_out(layout, 2, 700, 8, 2, 128, torch.bfloat16, "cuda")
    print(layout, [t.stride() for t in (q, k)], "gluon" if forward_sm90.supported(q, k, v) else "portable")
