"""Pick the device: a CUDA GPU when there is one, else the Triton interpreter on the CPU.

The interpreter must be switched on before Triton (and so fmha) is imported, hence here, at collection.
Tests marked `gpu` run only with a GPU (real sizes, bf16 + fp16); tests marked `cpu` only without one
(interpreter, fp16 — bf16 arithmetic is wrong in the interpreter — small shapes).
"""
import os

import pytest
import torch

ON_GPU = torch.cuda.is_available()
if not ON_GPU:
    os.environ["TRITON_INTERPRET"] = "1"


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    skip_cpu = pytest.mark.skip(reason="interpreter-only case; the gpu-marked twin runs on this machine")
    for item in items:
        if "gpu" in item.keywords and not ON_GPU:
            item.add_marker(skip_gpu)
        if "cpu" in item.keywords and ON_GPU:
            item.add_marker(skip_cpu)
