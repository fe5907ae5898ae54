"""torch.library.opcheck on every fmha op, with the arguments the public entry points pass it: schema, fake
implementation (shapes, strides, dtypes against the real op's results), and AOT dispatch with dynamic shapes.
A fake whose strides differ from the real op's would let inductor read the outputs wrong. Runs on the CPU
(interpreter) or a GPU."""
import importlib

import torch

import fmha
import fmha.mla as M

A = importlib.import_module("fmha.attention")      # the module; `fmha.attention` is the function
CHECKS = ("test_schema", "test_faketensor", "test_aot_dispatch_dynamic")


def captured(module, name, call):
    """The (op, args) of each call `call()` makes to `module.name` (an op handle from `_ops.custom_op`)."""
    handle, seen = getattr(module, name), []

    def spy(*args):
        seen.append(args)
        return handle(*args)
    setattr(module, name, spy)
    try:
        call()
    finally:
        setattr(module, name, handle)
    return [(handle.op, args) for args in seen]


def main():
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    dt = torch.bfloat16 if dev == "cuda" else torch.float16
    g = torch.Generator().manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=g).to(dt).to(dev)          # noqa: E731
    i32 = lambda x: torch.tensor(x, dtype=torch.int32, device=dev)      # noqa: E731
    q, k, v = r(2, 24, 4, 64), r(2, 40, 2, 64), r(2, 40, 2, 48)
    kc, vc = r(6, 16, 2, 64), r(6, 16, 2, 64)
    table, lens = i32([[4, 1], [0, 5]]), i32([20, 3])
    cache, mtable, mlens = r(9, 64, 1, 576), torch.arange(9, dtype=torch.int32, device=dev).view(3, 3), i32([70, 0, 130])
    sidx = torch.randint(-1, 9 * 64, (3, 2, 40), generator=g, dtype=torch.int32).to(dev)
    kv, pidx = r(100, 1, 576), torch.randint(0, 100, (5, 1, 64), generator=g, dtype=torch.int32).to(dev)
    cu = i32([0, 10, 24])
    calls = {
        "attention": (A, "_attention_fwd", lambda: fmha.attention(q, k, v, causal=True, return_lse=True)),
        "attention window + sinks": (A, "_attention_fwd", lambda: fmha.attention(
            q, k, v, window=(5, 0), sinks=torch.randn(4, device=dev), softcap=20.0)),
        "attention_varlen": (A, "_attention_fwd", lambda: fmha.attention_varlen(
            q[0], k[0, :24], v[0, :24], cu, cu, 14, 14, causal=True, return_lse=True)),
        "attention_with_kvcache": (A, "_attention_kvcache_fwd", lambda: fmha.attention_with_kvcache(
            r(2, 3, 4, 64), kc, vc, lens, block_table=table, causal=True, return_lse=True)),
        "attention_with_kvcache append": (A, "_attention_kvcache_fwd", lambda: fmha.attention_with_kvcache(
            r(2, 1, 4, 64), kc, vc, lens, k=r(2, 1, 2, 64), v=r(2, 1, 2, 64), block_table=table)),
        "flash_mla_with_kvcache": (M, "_mla_decode_fwd", lambda: M.flash_mla_with_kvcache(
            r(3, 2, 16, 576), cache, mtable, mlens, 512, *M.get_mla_metadata(mlens, 32, 1), causal=True)),
        "flash_mla_with_kvcache indices": (M, "_mla_decode_fwd", lambda: M.flash_mla_with_kvcache(
            r(3, 2, 16, 576), cache, None, mlens, 512, *M.get_mla_metadata(mlens, 32, 1, num_heads_q=16, topk=40),
            indices=sidx)),
        "mla_decode": (M, "_mla_decode_fwd", lambda: M.mla_decode(
            r(3, 16, 512), r(3, 16, 64), cache[..., :512], cache[..., 512:], mtable, mlens)),
        "flash_mla_sparse_fwd": (M, "_mla_sparse_prefill_fwd", lambda: M.flash_mla_sparse_fwd(r(5, 16, 576), kv, pidx)),
    }
    print(f"torch {torch.__version__}, {dev}")
    for name, (module, handle, call) in calls.items():
        for op, args in captured(module, handle, call):
            try:
                torch.library.opcheck(op, args, test_utils=CHECKS)
                print(f"  {name:32s} ok")
            except Exception as e:                  # noqa: BLE001 (the experiment reports every failure)
                print(f"  {name:32s} FAIL {type(e).__name__}: {str(e).splitlines()[0][:200]}")


if __name__ == "__main__":
    main()
