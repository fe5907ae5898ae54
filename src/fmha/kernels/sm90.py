"""Host-side pieces shared by the Gluon kernels for Hopper (`forward_sm90`, `mla_decode_sm90`): whether they may
run, the device's compute capability, and TMA descriptors built without the constructor's checks. Gluon is
imported only when a descriptor is built: the portable paths (and the interpreter) never import it here."""
from __future__ import annotations

import functools
import os

import torch


def gluon_enabled() -> bool:
    """The Gluon paths are on unless the environment says FMHA_GLUON=0."""
    return os.environ.get("FMHA_GLUON", "1") != "0"


@functools.lru_cache(maxsize=None)
def capability(index):
    return torch.cuda.get_device_capability(index)


@functools.lru_cache(maxsize=None)
def smem_layout(rows, d, dtype):
    """The shared-memory layout of a (1, rows, d) TMA box of torch dtype `dtype`."""
    from triton.experimental.gluon import language as gl
    gl_dtype = {torch.float16: gl.float16, torch.bfloat16: gl.bfloat16, torch.float32: gl.float32}[dtype]
    return gl.NVMMASharedLayout.get_default_for([1, rows, d], gl_dtype)


def descriptor(t, view, block):
    """A Gluon TensorDescriptor over tensor t seen as `view` = (shape, strides), box `block` = [1, rows, d],
    without the constructor's checks: the caller's view function has made them (16-byte alignment, unit last
    stride), and on a slow host they cost more than the kernel of a short call."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    shape, strides = view
    desc = object.__new__(TensorDescriptor)
    desc.base, desc.shape, desc.strides, desc.block_shape, desc.padding = t, shape, strides, block, "zero"
    desc.layout = smem_layout(block[1], block[2], t.dtype)
    return desc
