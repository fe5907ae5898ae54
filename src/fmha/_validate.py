"""Input checks shared by every entry point.

Each check raises `TypeError` (wrong type or dtype) or `ValueError` (wrong shape, device, stride, value)
naming the argument and what was expected. Checks look at metadata only (no host synchronisation), and
they all run before any kernel launches, so a failed call writes nothing.
"""
from __future__ import annotations

import contextlib
import math
import numbers
import os

import torch

HALF_DTYPES = (torch.float16, torch.bfloat16)
FP8 = torch.float8_e4m3fn
QKV_DTYPES = HALF_DTYPES + (FP8,)
MAX_HEAD_DIM = 256
EXTRA_HEAD_DIMS = (512, 576)   # DeepSeek-V4 (512) and MLA's 576 (= 512 latent + 64 RoPE)


def interpreting() -> bool:
    """True when Triton runs kernels in its CPU interpreter (`TRITON_INTERPRET=1`)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def check_tensor(name, t, *, ndim=None, dtypes=None, device=None, optional=False):
    if t is None:
        if optional:
            return
        raise TypeError(f"{name}: expected a torch.Tensor, got None")
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if ndim is not None and t.dim() != ndim:
        raise ValueError(f"{name}: expected a {ndim}-D tensor, got shape {tuple(t.shape)}")
    if dtypes is not None and t.dtype not in dtypes:
        names = ", ".join(str(d).replace("torch.", "") for d in dtypes)
        raise TypeError(f"{name}: expected dtype in ({names}), got {str(t.dtype).replace('torch.', '')}")
    if device is not None and t.device != device:
        raise ValueError(f"{name}: expected a tensor on {device}, got one on {t.device}")


def check_device(name, t):
    """Kernels run on CUDA; CPU tensors are accepted only under the Triton interpreter."""
    if t.is_cuda:
        return
    if t.device.type == "cpu" and interpreting():
        return
    raise ValueError(f"{name}: expected a CUDA tensor (CPU tensors need TRITON_INTERPRET=1), got device {t.device}")


def check_last_dim_contiguous(name, t):
    if t.numel() > 0 and t.stride(-1) != 1:
        raise ValueError(f"{name}: the last dimension must be contiguous (stride 1), got strides {tuple(t.stride())}")


def check_head_dim(name, d):
    if d in EXTRA_HEAD_DIMS or (d % 8 == 0 and 8 <= d <= MAX_HEAD_DIM):
        return
    raise ValueError(f"{name}: head_dim must be a multiple of 8 up to {MAX_HEAD_DIM}, or one of "
                     f"{EXTRA_HEAD_DIMS}; got {d}")


def check_qkv(q, k, v, *, varlen: bool, check_batch: bool = True, paged: bool = False, names=("q", "k", "v")):
    """q/k/v on one device, heads_q % heads_k == 0, matching head_dim_qk. dtypes: all fp16 or all bf16; all
    float8_e4m3fn; or fp16/bf16 q with float8_e4m3fn k and v (an FP8 KV cache). `paged`: k and v are paged
    caches (4-D) beside packed (varlen) queries. `names`: the three arguments' names in the caller's signature
    (`attention_with_kvcache`'s k_cache / v_cache)."""
    nq, nk, nv = names
    ndim = 3 if varlen else 4
    check_tensor(nq, q, ndim=ndim, dtypes=QKV_DTYPES)
    check_device(nq, q)
    device = q.device
    kv_ndim = 4 if paged else ndim
    check_tensor(nk, k, ndim=kv_ndim, dtypes=(FP8,) if q.dtype == FP8 else (q.dtype, FP8), device=device)
    check_tensor(nv, v, ndim=kv_ndim, dtypes=(k.dtype,), device=device)
    check_last_dim_contiguous(nq, q)
    check_last_dim_contiguous(nk, k)
    check_last_dim_contiguous(nv, v)
    *_, hq, dqk = q.shape
    hk = k.shape[-2]
    if k.shape[-1] != dqk:
        raise ValueError(f"{nk}: head_dim must equal {nq}'s ({dqk}), got {k.shape[-1]}")
    if v.shape[:-1] != k.shape[:-1]:
        raise ValueError(f"{nv}: leading dims must equal {nk}'s {tuple(k.shape[:-1])}, got {tuple(v.shape[:-1])}")
    if not varlen and check_batch and k.shape[0] != q.shape[0]:
        raise ValueError(f"{nk}: batch must equal {nq}'s ({q.shape[0]}), got {k.shape[0]}")
    if hk == 0 or hq % hk != 0:
        raise ValueError(f"{nk}: heads_k must divide heads_q ({hq}), got {hk}")
    check_head_dim(nq, dqk)
    check_head_dim(nv, v.shape[-1])


def check_descales(q, k, v, descales, batch, names=("q", "k", "v")):
    """`descales` = (q_descale, k_descale, v_descale) (FlashAttention-3's names): each None (1) or a
    `(batch, heads_k)` fp32 tensor that multiplies its float8_e4m3fn tensor's values (q's per query-head group),
    allowed only with one. `names`: q, k and v's names in the caller's signature."""
    heads_k = k.shape[-2]
    for name, t, x, of in zip(("q_descale", "k_descale", "v_descale"), descales, (q, k, v), names):
        if t is None:
            continue
        if x.dtype != FP8:
            raise TypeError(f"{name}: only for a float8_e4m3fn {of}, which is {str(x.dtype).replace('torch.', '')}")
        check_tensor(name, t, ndim=2, dtypes=(torch.float32,), device=q.device)
        if tuple(t.shape) != (batch, heads_k):
            raise ValueError(f"{name}: expected shape ({batch}, {heads_k}) (batch, heads_k), got {tuple(t.shape)}")


def check_options(q, *, window, softmax_scale, softcap, alibi_slopes, sinks, batch):
    """`window` is (left, right) ints, or with `left` a `(batch,)` int32 tensor: one left bound per sequence."""
    hq = q.shape[-2]
    plain_int = lambda w: isinstance(w, int) and not isinstance(w, bool)      # noqa: E731 (not `is_int`: no SymInt)
    if not (isinstance(window, (tuple, list)) and len(window) == 2 and plain_int(window[1])
            and (plain_int(window[0]) or isinstance(window[0], torch.Tensor))):
        raise TypeError(f"window: expected (left, right) ints, left optionally a (batch,) int32 tensor; "
                        f"got {window!r}")
    if isinstance(window[0], torch.Tensor):
        left = window[0]
        if left.dtype != torch.int32 or left.dim() != 1 or left.shape[0] != batch:
            raise ValueError(f"window: a per-sequence left bound must be a ({batch},) int32 tensor, got "
                             f"{left.dtype} {tuple(left.shape)}")
        check_tensor("window", left, device=q.device)
        # Values < -1 are not checked here (that would synchronise with the GPU); the kernel reads any
        # negative entry as unbounded.
    elif window[0] < -1:
        raise ValueError(f"window: each bound must be >= 0, or -1 for unbounded; got {tuple(window)}")
    if window[1] < -1:
        raise ValueError(f"window: each bound must be >= 0, or -1 for unbounded; got {tuple(window)}")
    check_softmax_scale(softmax_scale)
    if not isinstance(softcap, (int, float)) or isinstance(softcap, bool):
        raise TypeError(f"softcap: expected a float, got {type(softcap).__name__}")
    # Comparisons only: NaN fails both, and dynamo cannot trace `math.isfinite` under dynamic shapes.
    if not 0 <= softcap < math.inf:
        raise ValueError(f"softcap: expected a finite value >= 0 (0 disables it), got {softcap}")
    for name, t in (("alibi_slopes", alibi_slopes), ("sinks", sinks)):
        check_per_head(name, t, hq, q.device)


def check_softmax_scale(softmax_scale, name="softmax_scale"):
    """None (the default scale) or a finite positive number; `name` is the argument's (flash_mla_sparse_fwd's
    sm_scale)."""
    if softmax_scale is None:
        return
    if not isinstance(softmax_scale, (int, float)) or isinstance(softmax_scale, bool):
        raise TypeError(f"{name}: expected a float or None, got {type(softmax_scale).__name__}")
    if not 0 < softmax_scale < math.inf:        # as softcap's check: NaN fails, and dynamo traces it
        raise ValueError(f"{name}: expected a finite positive value, got {softmax_scale}")


def check_per_sequence(name, t, batch, device):
    """A `(batch,)` int32 tensor: one value per sequence (lengths, starts, cache rows)."""
    check_tensor(name, t, ndim=1, dtypes=(torch.int32,), device=device)
    if t.shape[0] != batch:
        raise ValueError(f"{name}: expected shape ({batch},), got {tuple(t.shape)}")


def check_block_table(t, batch, device, columns="max_pages"):
    """A `(batch, columns)` int32 block table whose rows are contiguous."""
    check_tensor("block_table", t, ndim=2, dtypes=(torch.int32,), device=device)
    if t.shape[0] != batch or t.stride(1) != 1:
        raise ValueError(f"block_table: expected a row-contiguous ({batch}, {columns}) tensor, got shape "
                         f"{tuple(t.shape)} strides {tuple(t.stride())}")


def check_per_head(name, t, heads_q, device):
    """An optional fp32 `(heads_q,)` tensor: one value per query head (ALiBi slopes, sinks)."""
    check_tensor(name, t, ndim=1, dtypes=(torch.float32,), device=device, optional=True)
    if t is not None and t.shape[0] != heads_q:
        raise ValueError(f"{name}: expected shape ({heads_q},) (one per query head), got {tuple(t.shape)}")


def check_out(out, shape, dtypes, device):
    """`out` in one of `dtypes` (q's, for fp16/bf16 q), or fp32 (full-precision partial results for an external
    merge)."""
    if out is None:
        return
    check_tensor("out", out, dtypes=(*dtypes, torch.float32), device=device)
    if tuple(out.shape) != tuple(shape):
        raise ValueError(f"out: expected shape {tuple(shape)}, got {tuple(out.shape)}")
    check_last_dim_contiguous("out", out)


def check_cu_seqlens(name, cu, batch_plus_one=None, device=None):
    check_tensor(name, cu, ndim=1, dtypes=(torch.int32,), device=device)
    if cu.shape[0] < 2:
        raise ValueError(f"{name}: expected length batch + 1 >= 2, got {cu.shape[0]}")
    if batch_plus_one is not None and cu.shape[0] != batch_plus_one:
        raise ValueError(f"{name}: expected length {batch_plus_one} (batch + 1), got {cu.shape[0]}")
    if not cu.is_contiguous():
        raise ValueError(f"{name}: expected a contiguous tensor")


@contextlib.contextmanager
def renamed(names):
    """A caller of another entry point under its own argument names: a TypeError / ValueError raised inside whose
    message starts `old:` (or `old[i]:`) with `old` in `names` is raised again starting `names[old]` instead."""
    try:
        yield
    except (TypeError, ValueError) as e:
        head, colon, rest = str(e).partition(":")
        base = head.split("[", 1)[0]
        if colon and base in names:
            raise type(e)(names[base] + head[len(base):] + colon + rest) from None
        raise


def python_number(value):
    """A numpy scalar (np.int64, np.float32, ...) as the Python int or float it holds, as torch's own ops and
    FlashAttention's read one; any other value as it is, for the checks to judge (bools, np.bool_ and 0-d tensors
    are no numbers here: a tensor would need a host synchronisation)."""
    if isinstance(value, (bool, int, float, torch.SymInt, torch.SymFloat)) or not isinstance(value, numbers.Real):
        return value
    return int(value) if isinstance(value, numbers.Integral) else float(value)


def is_int(value) -> bool:
    """A Python int, or torch.export's symbolic one (a size read off a tensor with a dynamic dim); not a bool."""
    return isinstance(value, (int, torch.SymInt)) and not isinstance(value, bool)


def check_int(name, value):
    """`value` as an int (`is_int`'s, a numpy integer taken as the int it holds: `python_number`); TypeError naming
    `name` for anything else."""
    value = python_number(value)
    if not is_int(value):
        raise TypeError(f"{name}: expected an int, got {type(value).__name__}")
    return value


def check_max_seqlen(name, value):
    """A sequence-length bound: an int >= 0 (`check_int`), returned as one."""
    value = check_int(name, value)
    if value < 0:
        raise ValueError(f"{name}: expected >= 0, got {value}")
    return value
