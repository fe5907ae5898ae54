"""Bad input raises TypeError/ValueError naming the argument, before any launch, writing nothing."""
import pytest
import torch

import fmha
from conftest import ON_GPU

DEV = "cuda" if ON_GPU else "cpu"
DT = torch.float16
# Every case runs on the machine's target, so it is marked for it: the GPU suite (`-m gpu`) runs this file too.
pytestmark = pytest.mark.gpu if ON_GPU else pytest.mark.cpu


def qkv(b=1, sq=8, sk=8, hq=4, hk=2, d=64, dv=None, dtype=DT):
    dv = dv or d
    return (torch.randn(b, sq, hq, d, device=DEV, dtype=dtype), torch.randn(b, sk, hk, d, device=DEV, dtype=dtype),
            torch.randn(b, sk, hk, dv, device=DEV, dtype=dtype))


def _bad(kind, match, fn, *args, **kwargs):
    with pytest.raises(kind, match=match):
        fn(*args, **kwargs)


def test_dtype_and_type_errors():
    q, k, v = qkv()
    _bad(TypeError, "q: expected dtype", fmha.attention, q.float(), k, v)
    _bad(TypeError, "k: expected dtype", fmha.attention, q, k.bfloat16(), v)
    _bad(TypeError, "q: expected a torch.Tensor", fmha.attention, q.tolist(), k, v)
    _bad(TypeError, "window", fmha.attention, q, k, v, window=(1.5, 0))
    _bad(TypeError, "causal", fmha.attention, q, k, v, causal=1)
    _bad(TypeError, "sinks: expected dtype", fmha.attention, q, k, v, sinks=torch.zeros(4, device=DEV, dtype=DT))
    _bad(TypeError, "softcap", fmha.attention, q, k, v, softcap="3")


def test_fp8_errors():
    """FP8 inputs: k and v share a dtype, an FP8 q needs FP8 k and v, a descale only for an FP8 tensor, as a
    (batch, heads_k) fp32 tensor; an FP8 q's output is bf16, fp16 or fp32."""
    q, k, v = qkv()
    q8, k8, v8 = (t.to(torch.float8_e4m3fn) for t in (q, k, v))
    ds = torch.ones(1, 2, device=DEV)
    _bad(TypeError, "k: expected dtype", fmha.attention, q8, k, v)
    _bad(TypeError, "v: expected dtype", fmha.attention, q, k8, v)
    _bad(TypeError, "q_descale: only for a float8_e4m3fn q", fmha.attention, q, k8, v8, q_descale=ds)
    _bad(TypeError, "k_descale: only for a float8_e4m3fn k", fmha.attention, q, k, v, k_descale=ds)
    _bad(ValueError, r"v_descale: expected shape \(1, 2\)", fmha.attention, q, k8, v8, v_descale=torch.ones(2, 1, device=DEV))
    _bad(TypeError, "k_descale: expected dtype", fmha.attention, q8, k8, v8, k_descale=ds.double())
    _bad(ValueError, "q_descale: expected a 2-D", fmha.attention, q8, k8, v8, q_descale=ds[0])
    _bad(TypeError, "out: expected dtype", fmha.attention, q8, k8, v8, out=torch.empty_like(q8))
    cu = torch.tensor([0, 8], dtype=torch.int32, device=DEV)
    _bad(ValueError, "k_descale: expected shape", fmha.attention_varlen, q8[0], k8[0], v8[0], cu, cu, 8, 8,
         k_descale=torch.ones(2, 2, device=DEV))
    _bad(ValueError, "v_descale: expected shape", fmha.attention_with_kvcache, q, k8, v8,
         torch.full((1,), 8, dtype=torch.int32, device=DEV), v_descale=torch.ones(1, 3, device=DEV))


def test_shape_errors():
    q, k, v = qkv()
    _bad(ValueError, "q: expected a 4-D", fmha.attention, q[0], k, v)
    _bad(ValueError, "heads_k must divide", fmha.attention, *qkv(hq=4, hk=3))
    _bad(ValueError, "k: head_dim must equal", fmha.attention, q, k[..., :32], v)
    _bad(ValueError, "v: leading dims", fmha.attention, q, k, v[:, :4])
    _bad(ValueError, "k: batch", fmha.attention, q, torch.cat([k, k]), torch.cat([v, v]))
    _bad(ValueError, "head_dim must be a multiple of 8", fmha.attention, *qkv(d=20))
    _bad(ValueError, "head_dim must be a multiple of 8", fmha.attention, *qkv(d=320))
    _bad(ValueError, "last dimension must be contiguous", fmha.attention, q.transpose(-1, -2).contiguous().transpose(-1, -2), k, v)
    _bad(ValueError, "alibi_slopes: expected shape", fmha.attention, q, k, v, alibi_slopes=torch.zeros(2, device=DEV))
    _bad(ValueError, "window", fmha.attention, q, k, v, window=(-2, 0))
    _bad(ValueError, "softmax_scale", fmha.attention, q, k, v, softmax_scale=-1.0)
    for value in (float("inf"), float("nan")):        # neither scales nor caps a score: NaN outputs or no cap at all
        _bad(ValueError, "softmax_scale: expected a finite positive", fmha.attention, q, k, v, softmax_scale=value)
        _bad(ValueError, "softcap: expected a finite", fmha.attention, q, k, v, softcap=value)
    _bad(ValueError, "softcap: expected a finite value >= 0", fmha.attention, q, k, v, softcap=-0.5)
    _bad(ValueError, "out: expected shape", fmha.attention, q, k, v, out=torch.empty(1, 8, 4, 32, device=DEV, dtype=DT))


def test_varlen_errors():
    q, k, v = (t[0] for t in qkv())
    cu = torch.tensor([0, 8], dtype=torch.int32, device=DEV)
    _bad(TypeError, "cu_seqlens_q: expected dtype", fmha.attention_varlen, q, k, v, cu.long(), cu, 8, 8)
    _bad(ValueError, "cu_seqlens_k: expected length 2", fmha.attention_varlen, q, k, v, cu,
         torch.tensor([0, 4, 8], dtype=torch.int32, device=DEV), 8, 8)
    _bad(TypeError, "max_seqlen_q: expected an int", fmha.attention_varlen, q, k, v, cu, cu, 8.0, 8)
    _bad(ValueError, "q: expected a 3-D", fmha.attention_varlen, q[None], k, v, cu, cu, 8, 8)
    used = torch.tensor([8], dtype=torch.int32, device=DEV)
    _bad(TypeError, "seqused_k: expected dtype", fmha.attention_varlen, q, k, v, cu, cu, 8, 8, seqused_k=used.long())
    _bad(ValueError, "seqused_k: expected shape", fmha.attention_varlen, q, k, v, cu, cu, 8, 8,
         seqused_k=torch.cat([used, used]))
    _bad(TypeError, "cu_seqlens_k: expected a torch.Tensor", fmha.attention_varlen, q, k, v, cu, None, 8, 8,
         seqused_k=used)
    # A paged cache beside packed queries (block_table): 4-D k / v, each sequence's key count from seqused_k or
    # cu_seqlens_k.
    kc, vc = (torch.randn(3, 16, 2, 64, device=DEV, dtype=DT) for _ in range(2))
    table = torch.zeros(1, 2, dtype=torch.int32, device=DEV)
    _bad(ValueError, "k: expected a 4-D", fmha.attention_varlen, q, k, v, cu, None, 8, 8, seqused_k=used,
         block_table=table)
    _bad(TypeError, "cu_seqlens_k: expected a torch.Tensor", fmha.attention_varlen, q, kc, vc, cu, None, 8, 8,
         block_table=table)
    _bad(ValueError, "block_table: expected", fmha.attention_varlen, q, kc, vc, cu, None, 8, 8, seqused_k=used,
         block_table=table.t())
    _bad(TypeError, "block_table: expected dtype", fmha.attention_varlen, q, kc, vc, cu, cu, 8, 8,
         block_table=table.long())


def test_error_writes_nothing():
    q, k, v = qkv()
    out = torch.full_like(q, 7.0)
    with pytest.raises(ValueError):
        fmha.attention(q, k, v, out=out, alibi_slopes=torch.zeros(3, device=DEV))
    assert (out == 7.0).all()


@pytest.mark.skipif(ON_GPU, reason="on a GPU machine CPU tensors are the wrong device")
def test_cpu_tensor_needs_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    _bad(ValueError, "q: expected a CUDA tensor", fmha.attention, *qkv())


@pytest.mark.skipif(not ON_GPU, reason="needs a CUDA GPU")
def test_device_mismatch():
    q, k, v = qkv()
    _bad(ValueError, "k: expected a tensor on", fmha.attention, q, k.cpu(), v)
