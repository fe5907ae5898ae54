"""`custom_op`: torch custom ops whose plain eager calls skip the dispatcher.

The public functions are torch custom ops so that `torch.compile(fullgraph=True)` traces them without graph
breaks. Going through the dispatcher costs tens of microseconds per call in eager mode (a mutating op's
ADInplaceOrView step re-binds every argument), which is more than a whole 1k-token prefill kernel. So an eager
call on plain tensors runs the function directly; under compilation, tracing (fake or functional tensors, a
dispatch mode) or autograd it goes through the op as before.

Triton launches on the current CUDA device. A call whose tensors live on another one (a model split over GPUs in
one process, e.g. `device_map="auto"`) runs with that device made current for its duration, as a native op's
device guard does.
"""
from __future__ import annotations

import functools

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode


def _direct(args) -> bool:
    if torch.compiler.is_compiling() or _get_current_dispatch_mode() is not None:
        return False
    for a in args:
        if isinstance(a, torch.Tensor) and (type(a) is not torch.Tensor or a.requires_grad):
            return False
    return True


def _other_device(args):
    """The device of the call's first tensor when it is a CUDA device other than the current one, else None."""
    for a in args:
        if isinstance(a, torch.Tensor):
            if a.device.type == "cuda" and a.get_device() != torch.cuda.current_device():
                return a.device
            return None
    return None


def custom_op(name, *, mutates_args):
    """Like `torch.library.custom_op(name, mutates_args=...)`; the result also has `register_fake` and `op`."""
    def wrap(fn):
        op = torch.library.custom_op(name, mutates_args=mutates_args)(fn)

        @functools.wraps(fn)
        def call(*args):
            if torch.compiler.is_compiling():
                return op(*args)
            device = _other_device(args)
            if device is None:
                return fn(*args) if _direct(args) else op(*args)
            with torch.cuda.device(device):
                return fn(*args) if _direct(args) else op(*args)
        call.op = op
        call.register_fake = op.register_fake
        return call
    return wrap
