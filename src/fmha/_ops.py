"""`custom_op`: torch custom ops whose plain eager calls skip the dispatcher.

The public functions are torch custom ops so that `torch.compile(fullgraph=True)` traces them without graph
breaks. Going through the dispatcher costs tens of microseconds per call in eager mode (a mutating op's
ADInplaceOrView step re-binds every argument), which is more than a whole 1k-token prefill kernel. So an eager
call on plain tensors runs the function directly; under compilation, tracing (fake or functional tensors, a
dispatch mode) or autograd it goes through the op as before.

Triton launches on the current CUDA device. A call whose tensors live on another one (a model split over GPUs in
one process, e.g. `device_map="auto"`) runs with that device made current for its duration, as a native op's
device guard does.

The kernels are forward-only. `forward_only` marks a public entry point's results, so that a backward through them
raises instead of silently giving its inputs no gradient.
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


class _NoBackward(torch.autograd.Function):
    """Outputs that join the graph of the inputs requiring grad, with a backward that raises (`forward_only`)."""

    @staticmethod
    def forward(ctx, name, outputs, *inputs):
        ctx.name = name
        return tuple(o.detach() for o in outputs)

    @staticmethod
    def backward(ctx, *grads):
        raise RuntimeError(f"fmha.{ctx.name} has no backward: fmha's kernels compute the forward pass only. Call it "
                           "under torch.no_grad() or torch.inference_mode(), or detach its inputs.")


def forward_only(fn):
    """An entry point whose results, in an eager call with grad mode on and a tensor argument that requires grad,
    are tensors whose backward raises, naming `fn`: without this they carry no gradient at all and a loss through
    them would silently leave the inputs' share out. Same values and storage (an `out=` tensor's). Calls under
    no_grad / inference_mode, on inputs that need no grad, or being compiled return the results unchanged."""
    @functools.wraps(fn)
    def call(*args, **kwargs):
        result = fn(*args, **kwargs)
        if torch.is_grad_enabled() and (_needs_grad(args) or _needs_grad(kwargs.values())):
            return result if torch.compiler.is_compiling() else _marked(fn.__name__, result, args, kwargs)
        return result
    return call


def _needs_grad(values):
    for a in values:
        if isinstance(a, torch.Tensor) and a.requires_grad:
            return True
    return False


def _marked(name, result, args, kwargs):
    """`result` (a tensor or a tuple) with its floating tensors through `_NoBackward`."""
    inputs = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor) and a.requires_grad]
    single = isinstance(result, torch.Tensor)
    outs = (result,) if single else tuple(result)
    floating = [isinstance(o, torch.Tensor) and o.is_floating_point() for o in outs]
    wrapped = iter(_NoBackward.apply(name, [o for o, f in zip(outs, floating) if f], *inputs))
    outs = tuple(next(wrapped) if f else o for o, f in zip(outs, floating))
    return outs[0] if single else outs
