"""Where a program of the Gluon MLA kernel spends its time, phase by phase: a copy of `kernels/mla_decode_sm90.py`
with clock stamps (`%clock64`, and `%globaltimer` at a program's start and end to convert cycles to ns) written
by each warpgroup at fixed points of every sequence piece, run on `fmha bench sparse`'s decode rows. Usage:
    PYTHONPATH=src python3 benchmarks/probe_timeline.py [--out F.json] [--rows 0 2 3]
prints, per row, the median over programs of each phase (ns) for each warpgroup and the first two pieces, and
the kernel's span (first start to last end, globaltimer). The stamps add ~200 SASS instructions, so the phases
are of a slightly different binary; they say where the time goes, not what the package's kernel takes.

Points (P): 0 piece start, 1 Q buffer free (warpgroup 0), 2 first loads issued, 3 Q landed, 4 first tile's
scores, 5 first pair done, 6 last pair done, 7 after the loop, 8 row sums added, 9 output store issued,
10 store waited, 11 Q buffer released, 16 top of the piece loop; 12 / 13 globaltimer at the program's start / end,
14 / 15 the clock there. Under ncu (`--launch-skip 3 --launch-count 1`: the package's call, then the stamped ones)
each stamp's `CS2R SR_CLOCKLO` and the store after it (offset 8 x P) mark its point in the SASS, so the source
page's samples can be summed phase by phase (NOTES.md, twenty-second session)."""
import argparse
import os
import statistics
import tempfile

import torch

import fmha.kernels.mla_decode_sm90 as own
import fmha.mla as ours_mla
from fmha.bench import SPARSE_DECODE_CASES, load_module_copy, save_sweep, sparse_decode_inputs, use_mla_kernels

# The SM's cycle counter and the global nanosecond timer, as Gluon functions (also `probe_prefill_timeline`'s).
CLOCKS = '''@gluon.jit
def _clock():
    return gl.inline_asm_elementwise("mov.u64 $0, %clock64;", "=l", [], dtype=gl.int64, is_pure=False, pack=1)


@gluon.jit
def _gtime():
    return gl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=gl.int64, is_pure=False, pack=1)


'''
HELPERS = CLOCKS + '''@gluon.jit
def _stamp(STAMP, w, WG: gl.constexpr, P: gl.constexpr):
    gl.store(STAMP + ((gl.program_id(0) * 4 + gl.minimum(w, 3)) * 2 + WG) * 24 + P, _clock())


'''
ENTRY = "    _stamp(STAMP, 0, WG, {c})\n    gl.store(STAMP + ((gl.program_id(0) * 4) * 2 + WG) * 24 + {g}, _gtime())\n"
# (text in the kernel, text to put after it): each must occur exactly once.
EDITS = [
    ("    staged = 0                    # partial pieces so far (handoff 6's phase)\n", ENTRY.format(c=14, g=12)),
    ("        blk = 0\n        split = 0\n", ENTRY.format(c=15, g=13)),
    ("    while (remaining > 0) & (b < batch):\n", "        _stamp(STAMP, w, WG, 16)\n"),
    ("        if take > 0:\n", "            _stamp(STAMP, w, WG, 0)\n"),
    ("                _load_q(q_lat_desc, q_rope_desc, q_lat, q_rope, q_ready, q_free, b, row0, w, HAS_ROPE)\n",
     "                _stamp(STAMP, w, WG, 1)\n"),
    ("            # Causal (bottom-right): query i sees keys j <= seqlen - seqlen_q + i.\n",
     "            _stamp(STAMP, w, WG, 2)\n"),
    ("            mbarrier.wait(q_ready, w & 1)\n", "            _stamp(STAMP, w, WG, 3)\n"),
    ("                    s = _mask(warpgroup_mma_wait(0, deps=(s_tok,)), n0, full, seqlen, last_visible, qk_scale_log2,\n"
     "                              key_ok, s_layout, SPARSE)\n",
     "                    if i == 0:\n                        _stamp(STAMP, w, WG, 4)\n"),
    ("                        s = _mask(warpgroup_mma_wait(0, deps=(s_tok,)), n1, full, seqlen, last_visible,\n"
     "                                  qk_scale_log2, key_ok, s_layout, SPARSE)\n",
     "                        if i == 0:\n                            _stamp(STAMP, w, WG, 4)\n"),
    ("                pairs += 1\n", "                if i == 0:\n                    _stamp(STAMP, w, WG, 5)\n"
                                   "                if i + 2 >= take:\n                    _stamp(STAMP, w, WG, 6)\n"),
    ("                c += gl.minimum(take - i, 2)\n                pairs += 1\n                if i == 0:\n"
     "                    _stamp(STAMP, w, WG, 5)\n                if i + 2 >= take:\n"
     "                    _stamp(STAMP, w, WG, 6)\n", "\n            _stamp(STAMP, w, WG, 7)\n"),
    ("            l_i = l_i + rows_smem.index(5 - WG).load(row_s)\n", "            _stamp(STAMP, w, WG, 8)\n"),
    ("                                                q_lat.index(WG).reshape(o_desc.block_type.shape))\n",
     "                _stamp(STAMP, w, WG, 9)\n"),
    ("                                 mask=offs_m < rows_per_k)\n                tma.store_wait(0)\n",
     "                _stamp(STAMP, w, WG, 10)\n"),
    ("            _signal(q_free)\n", "            _stamp(STAMP, w, WG, 11)\n"),
]
PHASES = [("start", None, 14, 16), ("top", None, 16, 0), ("q_free", 0, 0, 1), ("issue", 0, 1, 2), ("q_ready", None, 2, 3),
          ("scores0", None, 3, 4), ("pair0", None, 3, 5), ("pairs", None, 5, 6), ("sums", None, 7, 8),
          ("store", None, 8, 9), ("store_wait", None, 9, 10), ("release", None, 10, 11)]


def add_stamps(src, anchor, helpers, start, end, edits):
    """Kernel source `src` with `helpers` put before `anchor`, and each edit (old, new[, "before"]) made in the text
    from `start` to `end` (one function): new after old, or before it, where old occurs exactly once."""
    assert src.count(anchor) == 1
    src = src.replace(anchor, helpers + anchor)
    i, j = src.index(start), src.index(end)
    part = src[i:j]
    for old, new, *where in edits:
        assert part.count(old) == 1, old
        part = part.replace(old, new + old if where == ["before"] else old + new)
    return src[:i] + part + src[j:]


def stamped_source():
    """The package's kernel with the stamps added to the consumers (an extra STAMP pointer after X_VALID in the
    kernel's arguments, at the end of the `outs` the consumers unpack; the launcher allocates it and keeps the last
    one in STAMPS). Stamp 1 follows warpgroup 0's Q load (the Q-free wait and the TMA issue); with the loading
    warpgroup (`uses_loader`) the consumers issue no loads, so phases "q_free" and "issue" do not exist there."""
    src = add_stamps(open(own.__file__).read(), "@gluon.jit\ndef _score_part(", HELPERS, "def _consumer(",
                     "def mla_decode_sm90_kernel(", EDITS)
    old = "SPLIT_OFFSETS, SINKS, MAX_LOGITS"
    assert src.count(old) == 2                        # packed into `outs` by the kernel, unpacked by the consumer
    src = src.replace(old, old + ", STAMP")
    old = "X_VALID,\n                           batch,"
    assert src.count(old) == 1                        # the kernel's signature
    src = src.replace(old, "X_VALID, STAMP,\n                           batch,")
    old = "second_base, valid_lens, max_logits, *x_args,"
    assert src.count(old) == 1
    src = src.replace(old, old + " _stamp_buffer(metadata.shape[0] * cdiv(rows_per_k, rows)),")
    return src + '''

STAMPS = {}


def _stamp_buffer(programs):
    STAMPS["last"] = torch.zeros(programs, 4, 2, 24, dtype=torch.int64, device="cuda")
    return STAMPS["last"]
'''


def load_source(name, source):
    """`source` (a changed copy of a module of `fmha.kernels`) imported as that package's module `name`."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, name + ".py")
        open(path, "w").write(source)
        return load_module_copy(path)


def phases(st):
    """Medians over programs of each phase (ns) per piece (0, 1) and warpgroup, and the kernel's span."""
    st = st.cpu().long()
    started = st[:, 0, :, 13] > 0
    ns_per_cycle = statistics.median(((st[:, 0, 0, 13] - st[:, 0, 0, 12]).double()
                                      / (st[:, 0, 0, 15] - st[:, 0, 0, 14]).double())[started[:, 0]].tolist())
    out = dict(span_us=(st[:, 0, :, 13][started].max() - st[:, 0, :, 12][started].min()).item() / 1e3,
               ns_per_cycle=ns_per_cycle)
    for w in (0, 1):
        for wg in (0, 1):
            ran = (st[:, w, wg, 11] > 0) & started[:, wg]
            if not ran.any():
                continue
            for name, only, a, b in PHASES:
                if only is not None and only != wg:
                    continue
                a_t = st[:, 0, wg, a] if a == 14 else st[:, w, wg, a]
                if a == 14 and w > 0:        # from the last piece's release instead of the program's start
                    a_t, name = st[:, w - 1, wg, 11], "gap"
                d = ((st[:, w, wg, b] - a_t).double() * ns_per_cycle)[ran]
                out[f"w{w}_wg{wg}_{name}"] = statistics.median(d.tolist())
            d = ((st[:, 0, wg, 15] - st[:, w, wg, 11]).double() * ns_per_cycle)[ran & (st[:, w + 1, wg, 11] == 0)]
            if len(d):
                out[f"w{w}_wg{wg}_end"] = statistics.median(d.tolist())
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=None)
    p.add_argument("--rows", type=int, nargs="*", default=list(range(len(SPARSE_DECODE_CASES))))
    args = p.parse_args()
    stamped = load_source("mla_decode_sm90_stamped", stamped_source())
    rows = []
    for i in args.rows:
        case = SPARSE_DECODE_CASES[i]
        name, b, hq, sq, d, layout, topk, page, extra_topk, extra_page = case
        q, cache, lens, sink, kw = sparse_decode_inputs(case, torch.Generator(device="cuda").manual_seed(0))
        meta, splits = ours_mla.get_mla_metadata(lens, sq * hq, 1, num_heads_q=hq, topk=topk, is_fp8_kvcache=True)
        run = lambda: ours_mla.flash_mla_with_kvcache(q, cache, None, lens, 512, meta, splits,  # noqa: E731
                                                      attn_sink=sink, **kw)
        ref = run()[0]
        package = use_mla_kernels(stamped)
        try:
            for _ in range(5):
                got = run()[0]
            torch.cuda.synchronize()
        finally:
            use_mla_kernels(*package)
        assert (got.float() - ref.float()).abs().max().item() < 2e-2
        row = dict(case=name, b=b, hq=hq, topk=topk, extra_topk=extra_topk, **phases(stamped.STAMPS["last"]))
        rows.append(row)
        print(f"{name} b={b} h_q={hq}: span {row['span_us']:.1f} us, {row['ns_per_cycle']:.3f} ns/cycle")
        for w in (0, 1):
            for wg in (0, 1):
                items = [(k.split("_", 2)[2], v) for k, v in row.items() if k.startswith(f"w{w}_wg{wg}_")]
                if items:
                    print(f"  piece {w} wg{wg}: " + ", ".join(f"{k} {v / 1e3:.2f}" for k, v in items) + " (us)")
    if args.out:
        save_sweep(args.out, rows)


if __name__ == "__main__":
    main()
