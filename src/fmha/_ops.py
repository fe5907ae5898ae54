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


@torch.library.custom_op("fmha::no_backward", mutates_args=())
def _no_backward(like: torch.Tensor, name: str) -> torch.Tensor:
    """The gradient, shaped like `like`, of an input of fmha entry point `name`, which has none: it raises when a
    backward pass runs it. An op, not a raise in `_NoBackward.backward`, so that a compiled graph's backward is traced
    (with the fake below) and raises only when it runs, as the eager one does."""
    raise RuntimeError(f"fmha.{name} has no backward: fmha's kernels compute the forward pass only. Call it under "
                       "torch.no_grad() or torch.inference_mode(), or detach its inputs.")


@_no_backward.register_fake
def _(like, name):
    return torch.empty_like(like)


class _NoBackward(torch.autograd.Function):
    """Outputs that join the graph of the inputs requiring grad, with a backward that raises (`forward_only`):
    `apply(name, n, *outputs, *inputs)`, the first n tensors the outputs."""

    @staticmethod
    def forward(ctx, name, n, *tensors):
        ctx.name = name
        ctx.n = n
        ctx.inputs = [(t.shape, t.dtype) for t in tensors[n:]]
        return tuple(o.detach() for o in tensors[:n])

    @staticmethod
    def backward(ctx, *grads):
        like = grads[0]
        return (None, None, *[None] * ctx.n,
                *[_no_backward(like.new_empty(shape, dtype=dtype), ctx.name) for shape, dtype in ctx.inputs])


def forward_only(fn):
    """An entry point whose results, in a call with grad mode on and a tensor argument that requires grad, are
    tensors whose backward raises, naming `fn`: without this they carry no gradient at all and a loss through
    them would silently leave the inputs' share out. Same values and storage (an `out=` tensor's). Compiled, the
    backward is traced and raises when it runs. Calls under no_grad / inference_mode or on inputs that need no grad
    return the results unchanged."""
    @functools.wraps(fn)
    def call(*args, **kwargs):
        result = fn(*args, **kwargs)
        if torch.is_grad_enabled() and (_needs_grad(args) or _needs_grad(kwargs.values())):
            return _marked(fn.__name__, result, args, kwargs)
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
    marked = [o.detach() for o, f in zip(outs, floating) if f]    # (the op's own "no formula" node: cut off)
    wrapped = iter(_NoBackward.apply(name, len(marked), *marked, *inputs))
    outs = tuple(next(wrapped) if f else o for o, f in zip(outs, floating))
    return outs[0] if single else outs
