"""Host-side pieces shared by the Gluon kernels for Hopper (`forward_sm90`, `fp8_decode_sm90`, `mla_decode_sm90`,
`sparse_decode_sm90`): whether they may run, the device's compute capability and whether a tensor is on Hopper, TMA
descriptors built without the constructor's checks, and 2-CTA cluster launches of kernels compiled for one CTA (plain
launches: `launch.launch`). Gluon is imported only when a descriptor is built: the portable paths (and the
interpreter) never import it here."""
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


def on_hopper(t) -> bool:
    """Whether tensor t is on an sm_90 GPU, where the Gluon kernels run."""
    return t.is_cuda and capability(t.device.index)[0] == 9


def offsets_64(*tensors) -> bool:
    """Whether any of `tensors` spans more than 2^31 elements from its first to one past its last: a kernel's
    offsets into it must be 64-bit then (each stride may fit int32 while its product with an index does not)."""
    return any(t.numel() and sum((n - 1) * st for n, st in zip(t.shape, t.stride())) + 1 > 2**31 for t in tensors)


@functools.lru_cache(maxsize=None)
def smem_layout(block, dtype):
    """The shared-memory layout of a TMA box `block` (a tuple: (1, rows, d), or (1, rows, 1, d)) of torch dtype
    `dtype`."""
    from triton.experimental.gluon import language as gl
    gl_dtype = {torch.float16: gl.float16, torch.bfloat16: gl.bfloat16, torch.float32: gl.float32,
                torch.float8_e4m3fn: gl.float8e4nv}[dtype]
    return gl.NVMMASharedLayout.get_default_for(list(block), gl_dtype)


def descriptor(t, view, block):
    """A Gluon TensorDescriptor over tensor t seen as `view` = (shape, strides), box `block` = [1, rows, d] (or
    [1, rows, 1, d] over a 4-D view), without the constructor's checks: the caller's view function has made them
    (16-byte alignment, unit last stride), and on a slow host they cost more than the kernel of a short call."""
    return descriptor_in(t, box(t, view, block))


def box(t, view, block):
    """(view, block, shared-memory layout) of a descriptor over t (`descriptor`'s arguments), for a launch plan to
    keep and `descriptor_in` to use."""
    return view, block, smem_layout(tuple(block), t.dtype)


@functools.lru_cache(maxsize=None)
def _descriptor_type():
    """Gluon's TensorDescriptor class, imported once (an import statement costs ~1 us a call, four a launch)."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    return TensorDescriptor


def descriptor_in(t, box):
    """`descriptor` of t in `box` = (view, block, layout), its shared-memory layout found beforehand (a launch plan
    keeps it)."""
    desc = object.__new__(_descriptor_type())
    (desc.shape, desc.strides), desc.block_shape, desc.layout = box
    desc.base, desc.padding = t, "zero"
    return desc


def shared_offsets(kernel, names):
    """The shared-memory offsets that Triton gave the allocations `names` (their Gluon variables' names) of the
    compiled Gluon kernel `kernel`: the NVIDIA backend's passes up to its allocator (the first five of `make_llir`)
    run again on the kernel's TTGIR, and each `local_alloc`'s `allocation.offset` is read."""
    import re
    import tempfile
    from triton._C.libtriton import ir, nvidia, passes
    from triton.backends.nvidia.compiler import get_ptx_version_from_options
    ctx = ir.context()
    ir.load_dialects(ctx)
    nvidia.load_dialects(ctx)
    with tempfile.NamedTemporaryFile("w", suffix=".ttgir") as f:
        f.write(kernel.asm["ttgir"])
        f.flush()
        mod = ir.parse_mlir_module(f.name, ctx)
    mod.context = ctx
    pm = ir.pass_manager(ctx)
    passes.ttgpuir.add_combine_tensor_select_and_if(pm)
    passes.ttgpuir.add_allocate_warp_groups(pm)
    passes.convert.add_scf_to_cf(pm)
    passes.gluon.add_inliner(pm)
    arch = kernel.metadata.target.arch
    nvidia.passes.ttgpuir.add_allocate_shared_memory_nv(pm, arch, get_ptx_version_from_options(kernel.metadata, arch))
    pm.run(mod, "shared_offsets")
    found = dict(re.findall(r"%(\w+) = ttg.local_alloc \{allocation.offset = (\d+) : i32\}", str(mod)))
    return tuple(int(found[n]) for n in names)


_PAIR_OFFSETS = {}


def launch_pairs(fn, names, grid, args, kw):
    """Launch the Gluon kernel `fn` over `grid` = (programs,) as clusters of two CTAs (programs 2k and 2k + 1), with
    constexprs CLUSTER = True and SMEM = the shared-memory offsets of its allocations `names(constexprs)` (`kw`'s
    constexprs: the names may depend on them), which its inline PTX addresses by hand. The offsets come from a first
    compile with SMEM zeros (`shared_offsets`; the inline PTX allocates nothing, so the layout does not move).
    Compiled for two CTAs, every Gluon layout would need a CTA layout; the kernel is compiled for one, and each
    compile's launch metadata (warps, CTAs, shared memory) is told two: Triton's launcher then launches grid[0] // 2
    clusters of two. Every such compile checks that its offsets are the SMEM it was given. (NOTES.md, sixteenth and
    thirty-second sessions.)"""
    if not getattr(fn, "_fmha_pairs", False):
        _compile_pairs(fn, names)
    key = (fn, tuple(sorted(kw.items())))
    offsets = _PAIR_OFFSETS.get(key)
    if offsets is None:
        draft = fn.warmup(*args, grid=grid, CLUSTER=True, SMEM=(0,) * len(names(kw)), **kw)
        offsets = _PAIR_OFFSETS[key] = shared_offsets(draft, names(kw))
    fn[(grid[0] // 2,)](*args, CLUSTER=True, SMEM=offsets, **kw)


def _compile_pairs(fn, names):
    """Every compile of `fn` with CLUSTER and real SMEM offsets checks them and gets launch metadata for two CTAs.
    The JIT takes its compile function from `create_binder`, run once per device (its `device_caches`' default
    factory), so the hook is installed there as well as now."""
    from triton.compiler import compile as compile_one

    def compile_pair(src, *a, **k):
        kernel = compile_one(src, *a, **k)
        const = {fn.arg_names[i[0]]: getattr(v, "value", v) for i, v in src.constants.items() if len(i) == 1}
        smem = const.get("SMEM")
        if const.get("CLUSTER") and smem is not None and any(smem):
            if shared_offsets(kernel, names(const)) != tuple(smem):
                raise RuntimeError(f"{fn.__name__}: shared memory moved between compiles")
            warps, _, shared = kernel.packed_metadata
            kernel.packed_metadata = (warps, 2, shared)
        return kernel
    make = fn.device_caches.default_factory

    def create_binder():
        caches = make()
        fn.compile = compile_pair
        return caches
    fn.device_caches.default_factory = create_binder
    fn.compile = compile_pair
    fn._fmha_pairs = True
