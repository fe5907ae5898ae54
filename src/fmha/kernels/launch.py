"""`launch`: a Triton or Gluon kernel launched without the JIT's per-call binding of its arguments.

`kernel[grid](*args, **meta)` binds every argument through Triton's specializer, builds a cache key and checks the
kernel's globals on each call: 30-70 us of host time for our kernels' 25-50 arguments on the device's hosts, more
than a short prefill's or a decode step's kernel runs. Once a compile exists for arguments of one class
(`_arg_class`, at least as fine as Triton's specialization), `launch` launches that compiled kernel directly, and
calls its launcher itself (`_direct`): Triton's runner around it, and its driver check of each tensor's address, cost
another 2-15 us a decode or prefill call and 20-50 us an MLA decode call on the device's hosts
(`benchmarks/results/history/probe_host_ab_launch_*.json`, two processes).
"""
from __future__ import annotations

import torch
from triton import knobs
from triton.runtime.jit import JITFunction


def _arg_class(a):
    """What Triton's JIT specializes a kernel argument on (`native_specialize_impl`), or None for a kind of argument
    this module does not know: an int's width, divisibility by 16 and whether it is 1; a tensor's dtype and 16-byte
    alignment; a tensor descriptor's dtype and box (a Gluon descriptor's layout follows from them, `sm90.descriptor`);
    a float's or None's type alone."""
    kind = type(a)
    if kind is torch.Tensor:                  # the common case first
        return (a.dtype, a.data_ptr() % 16 == 0)
    if kind is int:
        return (a == 1, a % 16 == 0, -(1 << 31) <= a < (1 << 31))
    if kind is float or a is None:
        return kind
    if isinstance(a, torch.Tensor):
        return (a.dtype, a.data_ptr() % 16 == 0)
    if hasattr(a, "block_shape") and hasattr(a, "base"):
        return (a.base.dtype, tuple(a.block_shape))
    return None


_COMPILED = {}
# While a list (`fmha run -v`), every launch appends (kernel name, grid, meta) to it: what a call really ran.
RECORD = None


def launch(fn, grid, args, meta, fixed=None):
    """`fn[grid](*args, **meta)`: `args` are the kernel's runtime arguments in order (tensors, ints, floats, None,
    tensor descriptors), `meta` its constexprs (those left out take their defaults) and options. The first call of
    an argument class compiles through the JIT; later ones launch the compiled kernel directly (`_direct`).
    Arguments of a kind `_arg_class` does not know, and the interpreter, take the JIT's own path every time. (The
    prefill's binding cost 10-20 us of an eager call's 100-240 us; NOTES.md, thirty-ninth and fortieth sessions.)
    `fixed` = (classes of the last arguments, tuple(meta.items())), made once by a caller whose last arguments and
    meta do not change between calls (`fixed_classes`: a launch plan's scalars)."""
    if RECORD is not None:
        RECORD.append((getattr(fn, "__name__", repr(fn)), tuple(grid), dict(meta)))
    if not isinstance(fn, JITFunction):       # the interpreter's
        fn[grid](*args, **meta)
        return
    if fixed is not None:
        tail, items = fixed
        classes = (*map(_arg_class, args[:len(args) - len(tail)]), *tail)
    else:
        classes = tuple(map(_arg_class, args))
        items = tuple(meta.items())
    if None in classes:
        fn[grid](*args, **meta)
        return
    device = torch.cuda.current_device()
    key = (fn, device, classes, items)
    hit = _COMPILED.get(key)
    if hit is None:
        kernel = fn[grid](*args, **meta)
        _COMPILED[key] = (kernel, tuple(meta.get(p.name, p.default) for p in fn.params[len(args):]))
        return
    kernel, constexprs = hit
    if _hooked(knobs.runtime.launch_enter_hook) or _hooked(knobs.runtime.launch_exit_hook):
        kernel[(*grid, 1, 1)[:3]](*args, *constexprs)  # a profiler's hooks (proton): Triton's own runner calls them
        return
    _direct(kernel, grid, device, args, constexprs)


# Shared memory the driver keeps for each resident program (cudaDevAttrReservedSharedMemoryPerBlock: 1 KB since
# sm_80), on top of the kernel's own.
RESERVED_SHARED_PER_PROGRAM = 1024


def programs_per_sm(fn, grid, args, meta):
    """How many programs of `fn` compiled for these arguments one SM holds at once: its threads, registers and
    shared memory against the device's. The compile is the one `fn[grid](*args, **meta)` makes (Triton's JIT keeps
    it for that launch); it is loaded, not launched."""
    kernel = fn.warmup(*args, grid=grid, **meta)
    kernel._init_handles()                   # loads the module: n_regs
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    threads = 32 * kernel.metadata.num_warps
    return max(1, min(props.max_threads_per_multi_processor // threads,
                      props.regs_per_multiprocessor // (kernel.n_regs * threads),
                      props.shared_memory_per_multiprocessor
                      // (kernel.metadata.shared + RESERVED_SHARED_PER_PROGRAM)))


def _hooked(hook):
    """Whether a Triton launch hook is set: a `HookChain` (Triton 3.6 always has one) holding calls, or a
    function."""
    return bool(getattr(hook, "calls", hook))


def _direct(kernel, grid, device, args, constexprs):
    """What `kernel[grid](*args, *constexprs)` does with no launch hooks set, for less host time: the compiled
    launcher called on the current stream with no launch metadata (Triton builds a dict of it each launch, and calls
    its empty hook chains) and each tensor passed as its address. Given a tensor, Triton's launcher
    asks the driver (`cuPointerGetAttribute`) whether the address is a device one, a call per tensor argument; our
    entries check every tensor's device before they launch, and this kernel was first launched through the JIT
    with tensors of this argument class."""
    gx, gy, gz = (*grid, 1, 1)[:3]
    kernel.run(gx, gy, gz, torch._C._cuda_getCurrentRawStream(device), kernel.function, kernel.packed_metadata,
               None, None, None, *[a.data_ptr() if type(a) is torch.Tensor else a for a in args], *constexprs)


_COUNTERS = {}


def zeroed_counter(device, words):
    """At least `words` int32 counters, zeroed, for kernels that leave every counter they touch zeroed when they
    finish (the Gluon prefill's causal schedule, the portable kernel's split merge): one buffer per (device,
    stream), which launches on that stream take in turn, so a call costs no memset launch (8-12 us of host time).
    While the stream is being captured into a CUDA graph, a fresh zeroed one instead: the graph replays its memset,
    and no replay shares counters with eager launches or other graphs."""
    if device.type != "cuda" or torch.cuda.is_current_stream_capturing():
        return torch.zeros(words, dtype=torch.int32, device=device)
    from ..schedule import outside_graph_pools

    key = (device.index, torch._C._cuda_getCurrentRawStream(device.index))
    counter = _COUNTERS.get(key)
    if counter is None or counter.numel() < words:
        if counter is not None:
            # A larger buffer replaces a smaller one, which launches queued on this stream may still be using: it
            # was allocated on another thread's stream (`outside_graph_pools`), so the allocator is told to wait
            # for this stream's work before handing its block out again.
            counter.record_stream(torch.cuda.current_stream(device))
        zeros = lambda: torch.zeros(max(words, 64), dtype=torch.int32, device=device)       # noqa: E731
        counter = _COUNTERS[key] = outside_graph_pools(zeros, device)
    return counter


class Plans(dict):
    """Launch plans (or routes) by call key, for callers that make a call's launch once per key of shapes, strides
    and options and bind each call's tensors to it. Emptied when `limit` keys are held: a server's shapes come and
    go, and a plan costs little to make again."""

    def __init__(self, limit=1024):
        super().__init__()
        self.limit = limit

    def keep(self, key, plan):
        """`plan` under `key` (emptying the dict first when it is full); returns `plan`."""
        if len(self) >= self.limit:
            self.clear()
        self[key] = plan
        return plan


def cdiv(a, b):
    """ceil(a / b) of ints, for grids: `triton.cdiv` is a constexpr function, ~2.5 us a host call (one to five a
    launch)."""
    return -(-a // b)


def next_pow2(n):
    """The least power of two >= n (1 for n <= 1), for tile widths; `triton.next_power_of_2` costs as `cdiv`
    says."""
    return 1 << (max(int(n), 1) - 1).bit_length()


def prev_pow2(n):
    """The greatest power of two <= n (n >= 1)."""
    return 1 << (int(n).bit_length() - 1)


def dense(*vectors):
    """The 1-D tensors (or None) `vectors`, each with unit stride: the kernels read per-sequence and per-head
    arguments (lengths, starts, window bounds, slopes, sinks) as dense arrays, so a strided view of one (a column
    of a larger table) goes as a copy."""
    return tuple(t if t is None or t.stride(0) == 1 else t.contiguous() for t in vectors)


def fixed_classes(tail, meta):
    """`launch`'s `fixed` for calls whose arguments end with `tail` and whose meta is `meta`, each time."""
    return tuple(map(_arg_class, tail)), tuple(meta.items())
