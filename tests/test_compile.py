"""The public ops are torch custom ops: torch.compile(fullgraph=True) traces them without graph breaks, with
static or dynamic shapes, and torch.export exports them with a dynamic batch."""
import warnings

import pytest
import torch

import fmha
from conftest import ON_GPU
from fmha.reference import attention_ref, attention_varlen_ref
from test_mla import _check
from utils import assert_close, assert_forward_only, assert_matches, assert_matches_fp8_p

DEV = "cuda" if ON_GPU else "cpu"
DT = torch.bfloat16 if ON_GPU else torch.float16
# On the CPU, aot_eager exercises dynamo + functionalisation of the op's mutated `out` without needing
# inductor's C++ toolchain; on the GPU the default backend runs.
BACKEND = "inductor" if ON_GPU else "aot_eager"
# Every case runs on the machine's target, so it is marked for it: the GPU suite (`-m gpu`) runs this file too.
pytestmark = pytest.mark.gpu if ON_GPU else pytest.mark.cpu


def test_compile_fullgraph():
    torch.manual_seed(0)
    q = torch.randn(2, 24, 4, 64, device=DEV, dtype=DT)
    k = torch.randn(2, 40, 2, 64, device=DEV, dtype=DT)
    v = torch.randn(2, 40, 2, 64, device=DEV, dtype=DT)

    def block(q, k, v):
        o, lse = fmha.attention(q * 1.5, k, v, causal=True, return_lse=True)
        return o.float().sum(-1) + lse.transpose(1, 2), o

    compiled = torch.compile(block, fullgraph=True, backend=BACKEND)
    y, o = compiled(q, k, v)
    ref, ref_lse = attention_ref(q * 1.5, k, v, causal=True)
    assert_close("out", o, ref, DT)
    torch.testing.assert_close(y, ref.sum(-1) + ref_lse.transpose(1, 2), atol=0.15, rtol=0.02)


def test_compile_kvcache_append_fullgraph():
    """A decode step that appends its new keys to a paged cache (k / v) and attends: one graph, the cache written
    in place, the output the oracle's over the old keys and the new one."""
    torch.manual_seed(1)
    page, hk, d = 16, 2, 64
    k_cache, v_cache = (torch.randn(6, page, hk, d, device=DEV, dtype=DT) for _ in range(2))
    table = torch.tensor([[4, 1], [0, 5]], dtype=torch.int32, device=DEV)
    lens = torch.tensor([20, 3], dtype=torch.int32, device=DEV)
    q = torch.randn(2, 1, 4, d, device=DEV, dtype=DT)
    k_new, v_new = (torch.randn(2, 1, hk, d, device=DEV, dtype=DT) for _ in range(2))

    def step(q, k_new, v_new):
        return fmha.attention_with_kvcache(q, k_cache, v_cache, lens, k=k_new, v=v_new, block_table=table)

    before = (k_cache.clone(), v_cache.clone())
    out = torch.compile(step, fullgraph=True, backend=BACKEND)(q, k_new, v_new)
    for i, n in enumerate(lens.tolist()):
        pages = table[i].long()
        old_k, old_v = (c[pages].flatten(0, 1)[:n] for c in before)
        k_i, v_i = torch.cat([old_k, k_new[i]])[None], torch.cat([old_v, v_new[i]])[None]
        assert torch.equal(k_cache[pages].flatten(0, 1)[n], k_new[i, 0])
        assert_close("out", out[i:i + 1], attention_ref(q[i:i + 1], k_i, v_i)[0], DT)


def test_compile_kvcache_leftpad_fullgraph():
    """cache_leftpad through the op: one graph over a contiguous cache whose sequences start at rows 3 and 0,
    the rows before them NaN; the output the oracle's over each sequence's rows from its start."""
    torch.manual_seed(2)
    hk, d = 2, 64
    k_cache, v_cache = (torch.randn(2, 24, hk, d, device=DEV, dtype=DT) for _ in range(2))
    k_cache[0, :3], v_cache[0, :3] = float("nan"), float("nan")
    lens = torch.tensor([20, 9], dtype=torch.int32, device=DEV)
    starts = torch.tensor([3, 0], dtype=torch.int32, device=DEV)
    q = torch.randn(2, 2, 4, d, device=DEV, dtype=DT)

    def step(q, starts):
        return fmha.attention_with_kvcache(q, k_cache, v_cache, lens, cache_leftpad=starts, causal=True)

    out = torch.compile(step, fullgraph=True, backend=BACKEND)(q, starts)
    for i, (s, n) in enumerate(zip(starts.tolist(), lens.tolist())):
        ref = attention_ref(q[i:i + 1], k_cache[i:i + 1, s:n], v_cache[i:i + 1, s:n], causal=True)[0]
        assert_close("out", out[i:i + 1], ref, DT)


def test_compile_varlen_paged_fullgraph():
    """Packed queries over a paged cache (block_table, seqused_k) through the op: one graph, the oracle's output
    on each sequence's used keys."""
    torch.manual_seed(3)
    page, hk, d = 16, 2, 64
    k_cache, v_cache = (torch.randn(6, page, hk, d, device=DEV, dtype=DT) for _ in range(2))
    table = torch.tensor([[4, 1], [0, 5]], dtype=torch.int32, device=DEV)
    used = torch.tensor([20, 3], dtype=torch.int32, device=DEV)
    cu_q = torch.tensor([0, 5, 6], dtype=torch.int32, device=DEV)
    q = torch.randn(6, 4, d, device=DEV, dtype=DT)

    def step(q):
        return fmha.attention_varlen(q, k_cache, v_cache, cu_q, None, 5, 32, causal=True, seqused_k=used,
                                     block_table=table)

    out = torch.compile(step, fullgraph=True, backend=BACKEND)(q)
    for i, (qs, qe) in enumerate(((0, 5), (5, 6))):
        keys, vals = (c[table[i].long()].flatten(0, 1)[:int(used[i])][None] for c in (k_cache, v_cache))
        assert_close("out", out[qs:qe], attention_ref(q[None, qs:qe], keys, vals, causal=True)[0][0], DT)


def test_compile_dynamic_shapes():
    """torch.compile(dynamic=True), as a serving engine compiles for every batch size: symbolic shapes (and floats:
    dynamo could not trace the checks' `math.isfinite` of the default softcap) through the validation and the plan,
    one graph run at two sizes. Dense attention, and an MLA decode layer that plans."""
    import fmha.mla as flash_mla
    from fmha.reference import mla_decode_ref

    torch.manual_seed(4)

    def block(q, k, v):
        return fmha.attention(q * 2, k, v, causal=True, return_lse=True)     # softcap 0.0: it failed the check

    def layer(q, cache, table, lens):
        meta, splits = flash_mla.get_mla_metadata(lens, q.shape[1] * q.shape[2], 1)
        return flash_mla.flash_mla_with_kvcache(q, cache, table, lens, 512, meta, splits)

    block, layer = (torch.compile(f, fullgraph=True, backend=BACKEND, dynamic=True) for f in (block, layer))
    for b, s_q, s_k in ((2, 24, 40), (3, 17, 33)):
        q = torch.randn(b, s_q, 4, 64, device=DEV, dtype=DT)
        k, v = (torch.randn(b, s_k, 2, 64, device=DEV, dtype=DT) for _ in range(2))
        out, lse = block(q, k, v)
        assert_matches(out, lse, attention_ref(q * 2, k, v, causal=True), DT)

        lens = torch.randint(0, 3 * 64, (b,), dtype=torch.int32, device=DEV)
        cache = torch.randn(3 * b, 64, 1, 576, device=DEV, dtype=DT)
        table = torch.randperm(3 * b, dtype=torch.int32, device=DEV).view(b, 3)
        q = torch.randn(b, 1, 16, 576, device=DEV, dtype=DT)
        _check(*layer(q, cache, table, lens), *mla_decode_ref(q, cache, table, lens, 512), DT)


def test_compile_sched_meta_dynamic():
    """FlashMLA's newer form under torch.compile(dynamic=True): a step takes `get_mla_metadata()`'s empty handle, and
    its first layer plans into it, the second reuses the plan. The handle's configuration was a frozen dataclass, which
    dynamo could not build from symbolic sizes (the second size, s_q 3, failed to compile)."""
    import fmha.mla as flash_mla
    from fmha.reference import mla_decode_ref

    torch.manual_seed(7)
    cache = torch.randn(9, 64, 1, 576, device=DEV, dtype=DT)
    table = torch.arange(9, dtype=torch.int32, device=DEV).view(3, 3)
    lens = torch.tensor([70, 0, 130], dtype=torch.int32, device=DEV)

    def step(q):
        sched, splits = flash_mla.get_mla_metadata()
        first = flash_mla.flash_mla_with_kvcache(q, cache, table, lens, 512, sched, splits, causal=True)
        second = flash_mla.flash_mla_with_kvcache(q * 2, cache, table, lens, 512, sched, splits, causal=True)
        return first, second

    step = torch.compile(step, fullgraph=True, backend=BACKEND, dynamic=True)
    for s_q in (2, 3):
        q = torch.randn(3, s_q, 16, 576, device=DEV, dtype=DT)
        for got, scale in zip(step(q), (1, 2)):
            _check(*got, *mla_decode_ref(q * scale, cache, table, lens, 512, causal=True), DT)


def test_export_dynamic_batch():
    """torch.export with a dynamic batch: dense attention, and an MLA decode layer that plans. The plan's choice
    of whole sequences (`schedule.runs_whole`, a host test on the batch size) is taken on the device for a symbolic
    batch: export failed on the guard it made. The exported layer's plan is the eager one at batch sizes on both
    sides of that choice: as many equal sequences as parts, and twice as many, go whole; half as many do not."""
    import fmha.mla as flash_mla
    from fmha.reference import mla_decode_ref
    from fmha.schedule import mla_num_parts, num_sms, runs_whole

    class Attention(torch.nn.Module):
        def forward(self, q, k, v):
            return fmha.attention(q * 2, k, v, causal=True, return_lse=True)

    class Layer(torch.nn.Module):
        def forward(self, q, cache, table, lens):
            meta, splits = flash_mla.get_mla_metadata(lens, q.shape[1] * q.shape[2], 1)
            out, lse = flash_mla.flash_mla_with_kvcache(q, cache, table, lens, 512, meta, splits)
            return out, lse, meta, splits

    torch.manual_seed(5)
    parts = mla_num_parts(16, 1, num_sms(torch.device(DEV)))
    sizes = (parts, 2 * parts, parts // 2 + 1)
    assert [runs_whole(n, parts) for n in sizes] == [True, True, False]
    batch = torch.export.Dim("batch", min=1, max=1024)
    q, k, v = (torch.randn(2, 24, n, 64, device=DEV, dtype=DT) for n in (4, 2, 2))
    attention = torch.export.export(Attention(), (q, k, v), dynamic_shapes=({0: batch},) * 3).module()
    q, k, v = (torch.randn(3, 24, n, 64, device=DEV, dtype=DT) for n in (4, 2, 2))
    out, lse = attention(q, k, v)
    assert_matches(out, lse, attention_ref(q * 2, k, v, causal=True), DT)

    cache = torch.randn(2 * parts, 64, 1, 576, device=DEV, dtype=DT)

    def inputs(lens):
        """(q, cache, block table, lengths) of len(lens) sequences, a page each."""
        table = torch.randperm(2 * parts, dtype=torch.int32, device=DEV)[:len(lens), None]
        q = torch.randn(len(lens), 1, 16, 576, device=DEV, dtype=DT)
        return q, cache, table, torch.tensor(lens, dtype=torch.int32, device=DEV)
    by_batch = ({0: batch}, None, {0: batch}, {0: batch})
    layer = torch.export.export(Layer(), inputs([70, 9]), dynamic_shapes=by_batch).module()
    for lens in ([40] * sizes[0], [33] * sizes[1], [64] * sizes[2], [0, 64, 5, 17, 64]):
        args = inputs(lens)
        out, lse, meta, splits = layer(*args)
        want = flash_mla.get_mla_metadata(args[3], 16, 1)
        assert torch.equal(meta, want[0]) and torch.equal(splits, want[1]), lens
        _check(out, lse, *mla_decode_ref(*args, 512), DT)      # (a sequence of no key: LSE +inf)


def test_export_symbolic_sizes():
    """Sizes read off tensors with dynamic dims are symbolic ints under torch.export, and the entry points take them
    where they take an int: get_mla_metadata's `s_q * h_q` and `topk`, attention_varlen's max_seqlen_q / _k. They
    were rejected (`TypeError: ... expected an int, got SymInt`). Each export, run at new sizes, gives the eager
    call's results bit for bit."""
    import fmha.mla as flash_mla

    class Decode(torch.nn.Module):          # dense MLA decode; s_q varies (speculative decoding's drafts)
        def forward(self, q, cache, table, lens):
            meta, splits = flash_mla.get_mla_metadata(lens, q.shape[1] * q.shape[2], 1)
            return flash_mla.flash_mla_with_kvcache(q, cache, table, lens, 512, meta, splits, causal=True)

    class Sparse(torch.nn.Module):          # token-sparse decode; topk varies too
        def forward(self, q, cache, indices, lens):
            meta, splits = flash_mla.get_mla_metadata(lens, q.shape[1] * q.shape[2], 1, num_heads_q=q.shape[2],
                                                      topk=indices.shape[-1])
            return flash_mla.flash_mla_with_kvcache(q, cache, None, lens, 512, meta, splits, indices=indices)

    class Varlen(torch.nn.Module):
        def forward(self, q, k, v, cu):
            return fmha.attention_varlen(q, k, v, cu, cu, q.shape[0], k.shape[0], causal=True, return_lse=True)

    g = torch.Generator().manual_seed(6)
    cache = torch.randn(6, 64, 1, 576, generator=g).to(DT).to(DEV)
    i32 = lambda t: t.to(torch.int32).to(DEV)           # noqa: E731

    def decode(b, s_q):
        return (torch.randn(b, s_q, 16, 576, generator=g).to(DT).to(DEV), cache,
                i32(torch.randint(0, 6, (b, 2), generator=g)), i32(torch.randint(0, 128, (b,), generator=g)))

    def sparse(b, s_q, topk):
        return (torch.randn(b, s_q, 16, 576, generator=g).to(DT).to(DEV), cache,
                i32(torch.randint(-1, 6 * 64, (b, s_q, topk), generator=g)), i32(torch.zeros(b)))

    def varlen(n):
        q, k, v = (torch.randn(12 * n, h, 64, generator=g).to(DT).to(DEV) for h in (4, 2, 2))
        return q, k, v, i32(torch.arange(0, 12 * n + 1, 12))

    Dim = torch.export.Dim
    b, s_q, topk = Dim("b", min=1, max=256), Dim("s_q", min=1, max=8), Dim("topk", min=1, max=4096)
    tokens, cu = Dim("tokens", min=2, max=4096), Dim("cu", min=2, max=64)
    for module, make, first, later, dims in (
            (Decode(), decode, (2, 2), ((3, 1), (1, 3)), ({0: b, 1: s_q}, None, {0: b}, {0: b})),
            (Sparse(), sparse, (2, 2, 40), ((3, 1, 64), (1, 3, 17)), ({0: b, 1: s_q}, None, {0: b, 1: s_q, 2: topk},
                                                                      {0: b})),
            (Varlen(), varlen, (2,), ((3,), (5,)), ({0: tokens},) * 3 + ({0: cu},))):
        exported = torch.export.export(module, make(*first), dynamic_shapes=dims).module()
        for sizes in later:
            args = make(*sizes)
            for got, want in zip(exported(*args), module(*args)):
                assert torch.equal(got, want), (type(module).__name__, sizes)


# The keys of `_public_calls`, one test_opcheck case each (the calls build tensors on the device, so not at import).
OPCHECK_CALLS = ("attention", "attention options", "attention fp8", "attention_varlen", "attention_with_kvcache",
                 "attention_with_kvcache append", "flash_mla_with_kvcache", "flash_mla_with_kvcache fp8",
                 "flash_mla_with_kvcache indices", "mla_decode", "flash_mla_sparse_fwd")


def _public_calls():
    """name -> (module, op handle, call): public calls on small inputs, each reaching the op `module.<handle>` (an
    `_ops.custom_op` handle) with the arguments that op is to be checked on."""
    import importlib

    import fmha.mla as M
    A = importlib.import_module("fmha.attention")       # the module; `fmha.attention` is the function
    g = torch.Generator().manual_seed(8)
    r = lambda *s: torch.randn(*s, generator=g).to(DT).to(DEV)          # noqa: E731
    i32 = lambda x: torch.tensor(x, dtype=torch.int32, device=DEV)      # noqa: E731
    q, k, v = r(2, 24, 4, 64), r(2, 40, 2, 64), r(2, 40, 2, 48)
    q8, k8, v8 = ((torch.randn(2, n, h, 64, generator=g) * 2).to(torch.float8_e4m3fn).to(DEV)
                  for n, h in ((24, 4), (40, 2), (40, 2)))
    kc, vc, table, lens = r(6, 16, 2, 64), r(6, 16, 2, 64), i32([[4, 1], [0, 5]]), i32([20, 3])
    cache, mtable, mlens = r(9, 64, 1, 576), i32([[0, 1, 2], [3, 4, 5], [6, 7, 8]]), i32([70, 0, 130])
    packed = M.quantize_kv_cache(torch.randn(9, 64, 1, 576, generator=g).bfloat16(), "v32").to(DEV)
    sparse = torch.randint(-1, 9 * 64, (3, 2, 40), generator=g, dtype=torch.int32).to(DEV)
    kv, rows = r(100, 1, 576), torch.randint(0, 100, (5, 1, 64), generator=g, dtype=torch.int32).to(DEV)
    cu = i32([0, 10, 24])
    return {
        "attention": (A, "_attention_fwd", lambda: fmha.attention(q, k, v, causal=True, return_lse=True)),
        "attention options": (A, "_attention_fwd", lambda: fmha.attention(
            q, k, v, window=(5, 0), sinks=r(4).float(), alibi_slopes=torch.rand(4, device=DEV), softcap=20.0)),
        "attention fp8": (A, "_attention_fwd", lambda: fmha.attention(
            q8, k8, v8, causal=True, q_descale=torch.rand(2, 2, device=DEV) + 0.5, return_lse=True)),
        "attention_varlen": (A, "_attention_fwd", lambda: fmha.attention_varlen(
            q[0], k[0, :24], v[0, :24], cu, cu, 14, 14, causal=True, return_lse=True)),
        "attention_with_kvcache": (A, "_attention_kvcache_fwd", lambda: fmha.attention_with_kvcache(
            r(2, 3, 4, 64), kc, vc, lens, block_table=table, causal=True, return_lse=True)),
        "attention_with_kvcache append": (A, "_attention_kvcache_fwd", lambda: fmha.attention_with_kvcache(
            r(2, 1, 4, 64), kc, vc, lens, k=r(2, 1, 2, 64), v=r(2, 1, 2, 64), block_table=table)),
        "flash_mla_with_kvcache": (M, "_mla_decode_fwd", lambda: M.flash_mla_with_kvcache(
            r(3, 2, 16, 576), cache, mtable, mlens, 512, *M.get_mla_metadata(mlens, 32, 1), causal=True)),
        "flash_mla_with_kvcache fp8": (M, "_mla_decode_fwd", lambda: M.flash_mla_with_kvcache(
            r(3, 1, 16, 576), packed, mtable, mlens, 512, *M.get_mla_metadata(mlens, 16, 1), is_fp8_kvcache=True)),
        "flash_mla_with_kvcache indices": (M, "_mla_decode_fwd", lambda: M.flash_mla_with_kvcache(
            r(3, 2, 16, 576), cache, None, mlens, 512, *M.get_mla_metadata(mlens, 32, 1, num_heads_q=16, topk=40),
            indices=sparse)),
        "mla_decode": (M, "_mla_decode_fwd", lambda: M.mla_decode(
            r(3, 16, 512), r(3, 16, 64), cache[..., :512], cache[..., 512:], mtable, mlens)),
        "flash_mla_sparse_fwd": (M, "_mla_sparse_prefill_fwd", lambda: M.flash_mla_sparse_fwd(r(5, 16, 576), kv, rows)),
    }


@pytest.mark.parametrize("name", OPCHECK_CALLS)
def test_opcheck(name, monkeypatch):
    """torch.library.opcheck on each op, with the arguments a public call passes it: the schema, the fake
    implementation against the real op (shapes, strides and dtypes of every result; a fake whose strides differed
    would let inductor read the results wrong) and AOT dispatch with dynamic shapes."""
    module, handle, call = _public_calls()[name]
    op, seen = getattr(module, handle), []

    def spy(*args):
        seen.append(args)
        return op(*args)
    monkeypatch.setattr(module, handle, spy)
    call()
    assert seen, f"{name} did not reach {handle}"
    for args in seen:
        checks = ("test_schema", "test_faketensor", "test_aot_dispatch_dynamic")
        if any(isinstance(a, torch.Tensor) and a.dtype == torch.float8_e4m3fn for a in args):
            checks = checks[1:]     # the schema check compares inputs with torch.allclose, which float8 lacks
        torch.library.opcheck(op.op, args, test_utils=checks)


def test_compile_fp8_fullgraph():
    """FP8 inputs and their descales go through the same op: traced as one graph (schema and fake
    implementation), the eager call's result bit for bit, within the FP8 bounds of the oracle's (on Hopper the
    Gluon kernel rounds P to e4m3: `utils.assert_matches_fp8_p`)."""
    f8 = torch.float8_e4m3fn
    torch.manual_seed(1)
    q, k, v = ((torch.randn(2, n, h, 64, device=DEV) * 2).to(f8) for n, h in ((24, 4), (40, 2), (40, 2)))
    descales = {n: torch.rand(2, 2, device=DEV) + 0.5 for n in ("q_descale", "k_descale", "v_descale")}

    def block(q, k, v, q_descale, k_descale, v_descale):
        return fmha.attention(q, k, v, causal=True, q_descale=q_descale * 2, k_descale=k_descale,
                              v_descale=v_descale, return_lse=True)

    out, lse = torch.compile(block, fullgraph=True, backend=BACKEND)(q, k, v, **descales)
    eager = block(q, k, v, **descales)
    assert out.dtype == torch.bfloat16
    assert torch.equal(out, eager[0]) and torch.equal(lse, eager[1])
    descales["q_descale"] = descales["q_descale"] * 2
    assert_matches_fp8_p(out, lse, attention_ref(q, k, v, causal=True, **descales), q, k, v, descales)


def test_compile_mla_fullgraph():
    """A layer that plans and runs MLA decode traces as one graph; with inductor too (on the GPU), whose torch 2.11
    failed on the plan's searches over slices of computed tensors (`schedule.plan_mla`)."""
    import fmha.mla as flash_mla
    from fmha.reference import mla_decode_ref

    torch.manual_seed(0)
    lens = torch.tensor([70, 0, 130], dtype=torch.int32, device=DEV)
    cache = torch.randn(9, 64, 1, 576, device=DEV, dtype=DT)
    table = torch.arange(9, dtype=torch.int32, device=DEV).view(3, 3)
    q = torch.randn(3, 1, 16, 576, device=DEV, dtype=DT)

    def layer(q):
        meta, splits = flash_mla.get_mla_metadata(lens, 16, 1)
        return flash_mla.flash_mla_with_kvcache(q * 2, cache, table, lens, 512, meta, splits)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out, lse = torch.compile(layer, fullgraph=True, backend=BACKEND)(q)
    # The plan's SM count is traced (on a GPU); dynamo warned at every compile while it was an lru_cache.
    assert not [w for w in caught if "lru_cache" in str(w.message)]
    ref, ref_lse = mla_decode_ref(q * 2, cache, table, lens, 512)
    assert_close("out", out, ref, DT)
    torch.testing.assert_close(lse, ref_lse, atol=2e-3, rtol=0)


def test_compile_forward_only():
    """Compiled calls (fullgraph) on inputs that require grad: the results of the no_grad graph, and a backward,
    traced with the graph, that raises naming the entry point when it runs (`utils.assert_forward_only`); before,
    the results silently had no gradient. A dense op that writes its `out` and returns an LSE, and the sparse
    prefill's three results."""
    import fmha.mla as flash_mla

    torch.manual_seed(2)
    q, k, v = (torch.randn(2, 24, n, 64, device=DEV, dtype=DT) for n in (4, 2, 2))
    attention = torch.compile(lambda q, k, v: fmha.attention(q, k, v, causal=True, return_lse=True), fullgraph=True,
                              backend=BACKEND)
    assert_forward_only(attention, "attention", q, k, v)
    kv = torch.randn(100, 1, 576, device=DEV, dtype=DT)
    indices = torch.randint(0, 100, (3, 1, 64), dtype=torch.int32, device=DEV)
    sparse = torch.compile(lambda q: flash_mla.flash_mla_sparse_fwd(q, kv, indices, 0.07), fullgraph=True,
                           backend=BACKEND)
    assert_forward_only(sparse, "flash_mla_sparse_fwd", torch.randn(3, 16, 576, device=DEV, dtype=DT))


def test_compile_dense_prefill_names():
    """FlashMLA's dense prefill name over a packed [k | v] tensor (`flash_attn_varlen_kvpacked_func`), traced whole:
    its argument checks under FlashMLA's names (`_validate.renamed`) add no graph break."""
    import fmha.mla as flash_mla

    torch.manual_seed(4)
    q = torch.randn(20, 4, 192, device=DEV, dtype=DT)
    kv = torch.randn(30, 2, 320, device=DEV, dtype=DT)
    cu_q, cu_k = (torch.tensor(c, dtype=torch.int32, device=DEV) for c in ([0, 8, 20], [0, 10, 30]))
    compiled = torch.compile(lambda q, kv: flash_mla.flash_attn_varlen_kvpacked_func(q * 1.5, kv, cu_q, cu_k, 12, 20,
                                                                                      192, causal=True),
                             fullgraph=True, backend=BACKEND)
    out, lse = compiled(q, kv)
    ref, ref_lse = attention_varlen_ref(q * 1.5, kv[..., :192], kv[..., 192:], cu_q, cu_k, causal=True)
    assert_close("out", out, ref, DT)
    torch.testing.assert_close(lse, ref_lse.T, atol=2e-3, rtol=0)


def test_compile_sparse_mla_fullgraph(monkeypatch):
    """Token-sparse decode (its plan taken inside the op) and sparse prefill, each planned and run in one traced
    graph, with and without topk lengths. Nothing of the kept plans may be traced: on a GPU their keeping asks
    whether the stream is capturing, which dynamo cannot trace (a graph break, an error with fullgraph)."""
    import fmha.mla as flash_mla
    from fmha import schedule
    from fmha.reference import mla_sparse_decode_ref, mla_sparse_prefill_ref

    def kept(*args):
        if torch.compiler.is_compiling():
            raise AssertionError("schedule._kept traced")
        return real(*args)
    real = schedule._kept
    monkeypatch.setattr(schedule, "_kept", kept)

    g = torch.Generator().manual_seed(3)
    b, s_q, h_q, topk, tokens = 2, 2, 16, 40, 130
    cache = torch.randn(3, 64, 1, 576, generator=g).to(DT).to(DEV)
    indices = torch.randint(-1, tokens, (b, s_q, topk), generator=g, dtype=torch.int32).to(DEV)
    length = torch.tensor([topk, 17], dtype=torch.int32, device=DEV)
    lens = torch.zeros(b, dtype=torch.int32, device=DEV)
    q = torch.randn(b, s_q, h_q, 576, generator=g).to(DT).to(DEV)
    kv = cache.view(-1, 1, 576)[:tokens]

    def layer(q, topk_length):
        meta, splits = flash_mla.get_mla_metadata(lens, s_q * h_q, 1, num_heads_q=h_q, topk=topk)
        out, lse = flash_mla.flash_mla_with_kvcache(q, cache, None, lens, 512, meta, splits, indices=indices,
                                                    topk_length=topk_length)
        prefill = flash_mla.flash_mla_sparse_fwd(q[:, 0], kv, indices[:, 0, None], topk_length=topk_length)
        return out, lse, prefill

    for topk_length in (None, length):
        out, lse, (p_out, p_max, p_lse) = torch.compile(layer, fullgraph=True, backend=BACKEND)(q, topk_length)
        ref, ref_lse = mla_sparse_decode_ref(q, cache, indices, 512, topk_length=topk_length)
        assert_close("out", out, ref, DT)
        torch.testing.assert_close(lse, ref_lse, atol=2e-3, rtol=0)
        p_ref, _, p_ref_lse = mla_sparse_prefill_ref(q[:, 0], kv, indices[:, 0, None], 512, topk_length=topk_length)
        assert_close("prefill out", p_out, p_ref, DT)
        torch.testing.assert_close(p_lse, p_ref_lse, atol=2e-3, rtol=0)


def test_eager_calls_skip_the_dispatcher_only_on_plain_tensors():
    """`fmha._ops.custom_op` runs plain eager calls directly (host time) and everything else through the op:
    a dispatch mode (fake tensors: shape propagation, export), tensors that require grad (autograd)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from fmha._ops import _direct
    plain = torch.randn(2, 3, device=DEV)
    assert _direct((plain, None, 3, 0.5))
    assert not _direct((plain.requires_grad_(),))
    with FakeTensorMode() as mode:
        fake = mode.from_tensor(torch.randn(2, 3))
        assert not _direct((fake,))

    # Under a fake mode the public function still works (through the op's fake implementation).
    with FakeTensorMode():
        q = torch.empty(1, 8, 2, 32, device=DEV, dtype=DT)
        out, lse = fmha.attention(q, q, q, causal=True, return_lse=True)
        assert out.shape == (1, 8, 2, 32) and lse.shape == (1, 2, 8)
