"""Which public calls compile with inductor when their tensors are views (slices, unbind, split) of tensors the
graph computes? Each case: the compiled result against the eager one on the same inputs, or the error.
`--fix MODE` patches the modules' op handles first (MODE `contiguous`: q-like views made contiguous under compile;
re-making them with as_strided is no way round: dynamo cannot trace `storage_offset()`), to try a way round inductor's `NotImplementedError: SliceView`
(pytorch/pytorch#185201) before changing src."""
import argparse
import importlib
import traceback

import torch

import fmha
import fmha.mla as M

A = importlib.import_module("fmha.attention")      # the module; `fmha.attention` is the function


def patch(mode):
    def remake(t):
        if not isinstance(t, torch.Tensor) or not torch.compiler.is_compiling() or t.is_contiguous():
            return t
        return t.contiguous()

    def wrapped(fn, positions):
        def call(*args):
            args = [remake(a) if i in positions else a for i, a in enumerate(args)]
            return fn(*args)
        return call
    M._mla_decode_fwd = wrapped(M._mla_decode_fwd, {0, 1})
    M._mla_sparse_prefill_fwd = wrapped(M._mla_sparse_prefill_fwd, {0, 1})
    A._attention_fwd = wrapped(A._attention_fwd, {0, 1, 2})
    A._attention_kvcache_fwd = wrapped(A._attention_kvcache_fwd, {0})


def cases(dev, dt):
    g = torch.Generator(device="cpu").manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=g).to(dt).to(dev)          # noqa: E731
    x = r(2, 40, 3, 4, 64)
    yield "attention qkv.unbind", lambda x: fmha.attention(*(x * 2).unbind(2), causal=True), (x,)
    yield "attention q[..., :64] of 96", lambda q, k, v: fmha.attention((q * 2)[..., :64], k, v), \
        (r(2, 24, 4, 96), r(2, 40, 2, 64), r(2, 40, 2, 64))
    yield "attention q.transpose", lambda q, k, v: fmha.attention((q * 2).transpose(1, 2), k, v), \
        (r(2, 4, 24, 64), r(2, 40, 2, 64), r(2, 40, 2, 64))
    kc, vc = r(6, 16, 2, 64), r(6, 16, 2, 64)
    table = torch.tensor([[4, 1], [0, 5]], dtype=torch.int32, device=dev)
    lens = torch.tensor([20, 3], dtype=torch.int32, device=dev)
    yield "kvcache q slice", lambda q: fmha.attention_with_kvcache((q * 2)[..., :64], kc, vc, lens,
                                                                   block_table=table), (r(2, 1, 4, 96),)
    kc2, vc2 = r(6, 16, 2, 64), r(6, 16, 2, 64)
    yield "kvcache append k, v", lambda q, kn, vn: fmha.attention_with_kvcache(
        q, kc2, vc2, lens, k=kn, v=vn, block_table=table), (r(2, 1, 4, 64), r(2, 1, 2, 64), r(2, 1, 2, 64))
    cache = r(9, 64, 1, 576)
    mtable = torch.arange(9, dtype=torch.int32, device=dev).view(3, 3)
    mlens = torch.tensor([70, 0, 130], dtype=torch.int32, device=dev)

    def mla(q):
        meta, splits = M.get_mla_metadata(mlens, 16, 1)
        return M.flash_mla_with_kvcache(q * 2, cache, mtable, mlens, 512, meta, splits)
    yield "flash_mla_with_kvcache q*2", mla, (r(3, 1, 16, 576),)

    def mla_graph_input(q):
        meta, splits = M.get_mla_metadata(mlens, 16, 1)
        return M.flash_mla_with_kvcache(q, cache, mtable, mlens, 512, meta, splits)
    yield "flash_mla_with_kvcache q (input)", mla_graph_input, (r(3, 1, 16, 576),)

    def split(q):
        q_nope, q_pe = (q * 2).split([512, 64], -1)
        return M.mla_decode(q_nope, q_pe, cache[..., :512], cache[..., 512:], mtable, mlens)
    yield "mla_decode split", split, (r(3, 1, 16, 576),)
    sidx = torch.randint(-1, 9 * 64, (3, 2, 40), generator=g, dtype=torch.int32).to(dev)

    def sparse_decode(q):
        meta, splits = M.get_mla_metadata(mlens, 2 * 16, 1, num_heads_q=16, topk=40)
        return M.flash_mla_with_kvcache(q, cache, None, mlens, 512, meta, splits, indices=sidx)
    yield "flash_mla_with_kvcache indices", sparse_decode, (r(3, 2, 16, 576),)
    kv = r(100, 1, 576)
    idx = torch.randint(0, 100, (5, 1, 64), generator=g, dtype=torch.int32).to(dev)
    yield "flash_mla_sparse_fwd q*2", lambda q: M.flash_mla_sparse_fwd(q * 2, kv, idx), (r(5, 16, 576),)
    if dev == "cuda":
        f8 = torch.float8_e4m3fn
        q8, k8, v8 = ((r(2, n, h, 64).float() * 2).to(f8) for n, h in ((24, 4), (40, 2), (40, 2)))
        ds = [torch.rand(2, 2, generator=g).to(dev) + 0.5 for _ in range(3)]
        yield "attention fp8 + descales", lambda q, k, v, a, b, c: fmha.attention(
            q, k, v, causal=True, q_descale=a * 2, k_descale=b, v_descale=c, return_lse=True), (q8, k8, v8, *ds)
    yield "flash_mla_sparse_fwd q (input)", lambda q: M.flash_mla_sparse_fwd(q, kv, idx), (r(5, 16, 576),)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--fix", choices=("none", "contiguous"), default="none")
    p.add_argument("--backend", default="inductor")
    p.add_argument("--dynamic", action="store_true", help="torch.compile(dynamic=True): symbolic shapes")
    p.add_argument("--mode", default=None, help="torch.compile's mode, e.g. reduce-overhead (CUDA graphs)")
    p.add_argument("--calls", type=int, default=1, help="calls per case, each on fresh values of its float inputs "
                   "(3 with CUDA graphs: warm-up, record, replay)")
    a = p.parse_args()
    if a.fix != "none":
        patch(a.fix)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    dt = torch.bfloat16 if dev == "cuda" else torch.float16
    print(f"torch {torch.__version__}, fix {a.fix}, backend {a.backend}, dynamic {a.dynamic}, mode {a.mode}, {dev}")
    for name, fn, args in cases(dev, dt):
        torch._dynamo.reset()
        compiled = torch.compile(fn, fullgraph=True, backend=a.backend, dynamic=a.dynamic or None, mode=a.mode)
        diffs = []
        try:
            for call in range(a.calls):
                if call:
                    args = tuple(t.clone().normal_() if t.is_floating_point() and t.element_size() > 1 else t
                                 for t in args)
                got = compiled(*args)
                got = [t.clone() for t in (got if isinstance(got, (tuple, list)) else (got,))]
                eager = fn(*args)
                eager = eager if isinstance(eager, (tuple, list)) else (eager,)
                diffs.append(max((x.float() - y.float()).abs().nan_to_num(0).max().item()
                                 for x, y in zip(eager, got)))
        except Exception as e:                      # noqa: BLE001 (the experiment reports every failure)
            last = traceback.format_exception_only(type(e), e)[-1].strip()[:160]
            print(f"  {name:36s} FAIL after {len(diffs)} calls: {last}")
            continue
        print(f"  {name:36s} ok, max |compiled - eager| per call {' '.join(f'{d:.3g}' for d in diffs)}")


if __name__ == "__main__":
    main()
