"""`custom_op`: torch custom ops whose plain eager calls skip the dispatcher.

The public functions are torch custom ops so that `torch.compile(fullgraph=True)` traces them without graph
breaks. Going through the dispatcher costs tens of microseconds per call in eager mode (a mutating op's
ADInplaceOrView step re-binds every argument), which is more than a whole 1k-token prefill kernel. So an eager
call on plain tensors runs the function directly; under compilation, tracing (fake or functional tensors, a
dispatch mode) or autograd it goes through the op as before.
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


def custom_op(name, *, mutates_args):
    """Like `torch.library.custom_op(name, mutates_args=...)`; the result also has `register_fake` and `op`."""
    def wrap(fn):
        op = torch.library.custom_op(name, mutates_args=mutates_args)(fn)

        @functools.wraps(fn)
        def call(*args):
            return fn(*args) if _direct(args) else op(*args)
        call.op = op
        call.register_fake = op.register_fake
        return call
    return wrap
