"""fmha: fused attention kernels for LLM inference on NVIDIA Hopper (Triton).

Public API (see each function's docstring for shapes and options):
    attention, attention_varlen    fused prefill attention, padded or packed (varlen) batches
    attention_with_kvcache         decode / chunked prefill against a contiguous or paged KV cache, split-KV
    merge_attention_states[_list]  exact merge of partial results over disjoint key sets
    apply_attention_sink           the sink on a merged result (external merges: branches run without sinks)
    mla                            `import fmha.mla as flash_mla`: DeepSeek MLA decode, sparse, FP8 (FlashMLA's API)
    reference                      fp32 oracles for every op (the tests' ground truth)

Numeric options (window bounds, scales, lengths, split counts) take Python numbers or numpy scalars, as torch's
own ops do. The kernels compute the forward pass only. Called with inputs that require grad (grad mode on; eager or
compiled), an entry point returns tensors whose backward raises a RuntimeError naming it, rather than tensors that
silently give those inputs no gradient.

Kernels run on CUDA tensors. On a machine with no CUDA device, importing fmha switches Triton to its
CPU interpreter (TRITON_INTERPRET=1, which must be set before Triton compiles anything), so the same
kernels run on CPU tensors there: slowly, for tests and for `fmha run`'s small default case.
"""
import os as _os

import torch as _torch

if not _torch.cuda.is_available():
    _os.environ.setdefault("TRITON_INTERPRET", "1")
from . import reference
from .attention import attention, attention_varlen, attention_with_kvcache
from .merge import apply_attention_sink, merge_attention_states, merge_attention_states_list

__all__ = ["attention", "attention_varlen", "attention_with_kvcache", "merge_attention_states",
           "merge_attention_states_list", "apply_attention_sink", "reference"]
__version__ = "0.1.0"
