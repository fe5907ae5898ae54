"""fmha: fused attention kernels for LLM inference on NVIDIA Hopper (Triton).

Public API (see each function's docstring for shapes and options):
    attention, attention_varlen    fused prefill attention, padded or packed (varlen) batches
    reference                      fp32 oracles for every op (the tests' ground truth)

Kernels run on CUDA tensors, or on CPU tensors under the Triton interpreter (set TRITON_INTERPRET=1
before importing fmha).
"""
from . import reference
from .attention import attention, attention_varlen

__all__ = ["attention", "attention_varlen", "reference"]
__version__ = "0.1.0"
