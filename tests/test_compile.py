"""The public ops are torch custom ops: torch.compile(fullgraph=True) traces them without graph breaks."""
import torch

import fmha
from conftest import ON_GPU
from fmha.reference import attention_ref
from utils import assert_close

DEV = "cuda" if ON_GPU else "cpu"
DT = torch.bfloat16 if ON_GPU else torch.float16
# On the CPU, aot_eager exercises dynamo + functionalisation of the op's mutated `out` without needing
# inductor's C++ toolchain; on the GPU the default backend runs.
BACKEND = "inductor" if ON_GPU else "aot_eager"


def test_compile_fullgraph():
    torch.manual_seed(0)
    q = torch.randn(2, 24, 4, 64, device=DEV, dtype=DT)
    k = torch.randn(2, 40, 2, 64, device=DEV, dtype=DT)
    v = torch.randn(2, 40, 2, 64, device=DEV, dtype=DT)

    def block(q, k, v):
        o, lse = fmha.attention(q * 1.5, k, v, causal=True, return_lse=True)
        return o.float().sum(-1) + lse.transpose(1, 2), o

    compiled = torch.compile(block, fullgraph=True, backend=BACKEND)
    y, o = compiled(q, k, v)
    ref, ref_lse = attention_ref(q * 1.5, k, v, causal=True)
    assert_close("out", o, ref, DT)
    torch.testing.assert_close(y, ref.sum(-1) + ref_lse.transpose(1, 2), atol=0.15, rtol=0.02)


def test_custom_op_registered():
    assert hasattr(torch.ops.fmha, "attention_fwd")
    torch.library.opcheck(torch.ops.fmha.attention_fwd.default, (
        torch.randn(1, 8, 2, 32, device=DEV, dtype=DT), torch.randn(1, 8, 2, 32, device=DEV, dtype=DT),
        torch.randn(1, 8, 2, 32, device=DEV, dtype=DT), torch.empty(1, 8, 2, 32, device=DEV, dtype=DT),
        None, None, 8, 8, 0.2, -1, 0, 0.0, None, None), test_utils=("test_schema", "test_faketensor"))
