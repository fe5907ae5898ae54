"""Where a work item of the Gluon prefill kernel spends its time, phase by phase: a copy of
`kernels/forward_sm90.py` with clock stamps (`%clock64`; `%globaltimer` at a consumer's start and end, to turn
cycles into ns) written by each consumer warpgroup at fixed points of its first ITEMS - 1 work items (later items
all write the last slot). Usage:
    PYTHONPATH=src python3 benchmarks/probe_prefill_timeline.py [--cases gpt-oss d64-1k-causal ...] [--fp8]
        [--out F.json]
prints, per case and consumer warpgroup, the median over programs and over items 1 .. ITEMS - 3 (the first item's
start and the last slot left out) of each phase, in ns, and the kernel's span. The stamps add instructions and
stores, so the phases are of a slightly different binary; they say where an item's time goes, not what the
package's kernel takes. `--fp8`: q, k and v in e4m3 (the same values in bf16 for the output's dtype).

Points (P), in a consumer warpgroup's item: 0 its index read (the loop's top), 6 its bounds worked out (before the
first key tile), 1 the first key tile landed, 2 the first scores waited for, 3 the main loop done, 4 the last P·V
waited for, 5 the output and LSE stores issued. 12 / 13 globaltimer at the consumer's start / end, 14 / 15 the
clock there (item slot 0). Phases: `q_wait` (5 of the item before -> 0: the next item's Q and index), `bounds`
(0 -> 6), `k0_wait` (6 -> 1), `s0` (1 -> 2), `loop` (2 -> 3), `tail` (3 -> 4), `epilogue` (4 -> 5), `item` (0 -> 0
of the next item). The producer warp stamps its own points (7-9, below) in the same item slots, warpgroup slot 3.
"""
import argparse
import statistics

import torch

import fmha.kernels.forward_sm90 as own
from fmha.bench import save_sweep
from probe_timeline import CLOCKS, add_stamps, load_source

ITEMS = 16                        # item slots a program (the last one rewritten by every later item)
SLOTS = 4                         # warpgroup slots an item (up to three consumers)
POINTS = 16

HELPERS = CLOCKS + f'''@gluon.jit
def _stamp(STAMP, w, WG: gl.constexpr, P: gl.constexpr):
    gl.store(STAMP + ((gl.program_id(0) * {ITEMS} + gl.minimum(w, {ITEMS - 1})) * {SLOTS} + WG) * {POINTS} + P,
             _clock())


@gluon.jit
def _stamp_time(STAMP, WG: gl.constexpr, C: gl.constexpr, G: gl.constexpr):
    _stamp(STAMP, 0, WG, C)
    gl.store(STAMP + (gl.program_id(0) * {ITEMS} * {SLOTS} + WG) * {POINTS} + G, _gtime())


'''
# (text in the consumer, text to add, "before" or "after" it): each text must occur exactly once in `_consumer`.
EDITS = [
    ("    kv = 0                        # the producer's counters, kept in step\n",
     "    _stamp_time(STAMP, WG, 14, 12)\n", "before"),
    ("        b, h0, hk, m_start, lo, n_tiles, sq, sk, row_q, row_k, tb, lead = _known_fields(\n",
     "        _stamp(STAMP, w, WG, 0)\n", "before"),
    ("        q0 = QK_PARTS * (WGS * qb + WG)         # this warpgroup's Q parts\n",
     "        _stamp(STAMP, w, WG, 6)\n", "after"),
    ("        if n_full > 0:\n            slot = kv % STAGES\n"
     "            mbarrier.wait(k_ready.index(slot), (kv // STAGES) & 1)\n",
     "            _stamp(STAMP, w, WG, 1)\n", "after"),
    ("            s = warpgroup_mma_wait(0, deps=(s_tok,))\n", "            _stamp(STAMP, w, WG, 2)\n", "after"),
    ("            c = kv + n_full - 1\n", "            _stamp(STAMP, w, WG, 3)\n", "before"),
    ("        _skip_tiles(k_ready, k_empty, v_ready, v_empty, kv + n_mine, kv + n_tiles, STAGES)\n",
     "        _stamp(STAMP, w, WG, 4)\n", "before"),
    ("        gl.store(lse_ptrs, lse, mask=q_pos < sq)\n", "        _stamp(STAMP, w - 1, WG, 5)\n", "after"),
    ("        t, item = _read_item(items.index(qb), 4)\n", "    _stamp_time(STAMP, WG, 15, 13)\n", "after"),
]
# The producer's stamps (warpgroup slot 3) in `_load_item`: 7 its item's fields worked out (after the counter), 8 the
# Q buffer free and the item posted, 9 every key tile's load issued (each after its ring slot freed up).
PRODUCER_EDITS = [
    ("     page_size, STAMP) = args\n", "    _stamp(STAMP, w, 3, 7)\n", "after"),
    ("    _post_item(items.index(qb), t, item, gl.num_warps())\n", "    _stamp(STAMP, w, 3, 8)\n", "after"),
    ("    return kv, w + 1\n", "    _stamp(STAMP, w, 3, 9)\n", "before"),
]
PHASES = [("bounds", 0, 6), ("k0_wait", 6, 1), ("s0", 1, 2), ("loop", 2, 3), ("tail", 3, 4), ("epilogue", 4, 5)]
# name -> (b, s, heads_q, heads_k, d, window, sinks): gpt-oss's window layer, and issue 2's short rows
CASES = {"gpt-oss": (4, 4096, 64, 8, 64, (128, 0), True), "d64-1k-causal": (16, 1024, 32, 32, 64, (-1, 0), False),
         "d64-1k-full": (16, 1024, 32, 32, 64, (-1, -1), False),
         "d128-1k-causal": (16, 1024, 16, 16, 128, (-1, 0), False),
         "d128-1k-full": (16, 1024, 16, 16, 128, (-1, -1), False),
         "d128-4k-full": (4, 4096, 16, 16, 128, (-1, -1), False),
         "d256-1k-causal": (16, 1024, 8, 8, 256, (-1, 0), False),
         "d256-1k-full": (16, 1024, 8, 8, 256, (-1, -1), False)}


def stamped_source():
    """The package's kernel with the stamps added to the consumers: a STAMP pointer after V_DESCALE in the kernel's
    arguments and at the end of the `shared` tuple; the launcher allocates it (`_stamp_buffer`) and keeps the last
    one in STAMPS."""
    src = add_stamps(open(own.__file__).read(), "@gluon.jit\ndef _softmax_tile(", HELPERS, "def _consumer(",
                     "def attn_fwd_sm90_kernel(", EDITS)
    for old, new, count in [("V_DESCALE,\n     group) = shared", "V_DESCALE,\n     group, STAMP) = shared", 1),
                            ("K_DESCALE, V_DESCALE, group)\n", "K_DESCALE, V_DESCALE, group, STAMP)\n", 1),
                            # the producer's tuple and its three unpackings
                            ("stride_bt, page_size)\n", "stride_bt, page_size, STAMP)\n", 1),
                            ("     page_size) = args\n", "     page_size, STAMP) = args\n", 1),
                            # (named: `_` is reassigned as an int in the producer's loop)
                            ("SEQLENS, _, _, _) = args", "SEQLENS, _, _, _, _stamp_ptr) = args", 2),
                            ("V_DESCALE, seqlen_q,\n", "V_DESCALE, STAMP, seqlen_q,\n", 1),
                            # `_Plan.bind`'s arguments: the buffer after the descales, before the plan's scalars
                            ("alibi_slopes, *scales, *self.scalars)",
                             "alibi_slopes, *scales, _stamp_buffer(self.grid[0]), *self.scalars)", 1)]:
        assert src.count(old) == count, old
        src = src.replace(old, new)
    src = add_stamps(src, "@gluon.jit\ndef _first_with_rows(", "", "def _load_item(", "def _first_with_rows(",
                     PRODUCER_EDITS)
    return src + f'''

STAMPS = {{}}


def _stamp_buffer(programs):
    STAMPS["last"] = torch.zeros(programs, {ITEMS}, {SLOTS}, {POINTS}, dtype=torch.int64, device="cuda")
    return STAMPS["last"]
'''


def phases(st, wgs):
    """Medians (ns) of each phase per consumer warpgroup over programs and items 1 .. ITEMS - 3, and the span."""
    st = st.cpu().long()
    ran = st[:, 0, 0, 13] > 0
    ns = statistics.median(((st[ran, 0, 0, 13] - st[ran, 0, 0, 12]).double()
                            / (st[ran, 0, 0, 15] - st[ran, 0, 0, 14]).double()).tolist())
    out = dict(span_us=(st[ran, 0, :wgs, 13].max() - st[ran, 0, :wgs, 12].min()).item() / 1e3, ns_per_cycle=ns)
    for wg in range(wgs):
        for name, a, b in PHASES + [("q_wait", 5, 0), ("item", 0, 0)]:
            vals = []
            for w in range(1, ITEMS - 2):
                a_t = st[:, w - 1, wg, a] if name == "q_wait" else st[:, w, wg, a]
                b_t = st[:, w + 1, wg, b] if name == "item" else st[:, w, wg, b]
                ok = ran & (a_t > 0) & (b_t > 0) & (st[:, w + 1, wg, 0] > 0)
                vals += ((b_t - a_t).double() * ns)[ok].tolist()
            if vals:
                out[f"wg{wg}_{name}"] = statistics.median(vals)
    # The producer: `p_fields` (its last item's tiles issued -> the next item's fields: the counter and
    # `_work_item`), `p_q_free` (7 -> 8), `p_tiles` (8 -> 9); `p_lead`: how long before a consumer warpgroup 0
    # reads an item's index the producer posted it.
    for name, a, b in [("p_fields", 9, 7), ("p_q_free", 7, 8), ("p_tiles", 8, 9), ("p_lead", 8, 0)]:
        vals = []
        for w in range(1, ITEMS - 2):
            a_t = st[:, w - 1, 3, a] if name == "p_fields" else st[:, w, 3, a]
            b_t = st[:, w, 0, b] if name == "p_lead" else st[:, w, 3, b]
            ok = ran & (a_t > 0) & (b_t > 0)
            vals += ((b_t - a_t).double() * ns)[ok].tolist()
        if vals:
            out[name] = statistics.median(vals)
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--cases", nargs="*", default=list(CASES))
    p.add_argument("--fp8", action="store_true")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    stamped = load_source("forward_sm90_stamped", stamped_source())
    rows = []
    for name in args.cases:
        b, s, hq, hk, d, window, with_sinks = CASES[name]
        torch.manual_seed(0)
        q = torch.randn(b, s, hq, d, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(b, s, hk, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        if args.fp8:
            q, k, v = (t.to(torch.float8_e4m3fn) for t in (q, k, v))
        sinks = torch.randn(hq, device="cuda") if with_sinks else None
        outs = []
        for module in (own, stamped):
            out = torch.full(q.shape, float("nan"), device="cuda", dtype=torch.bfloat16)
            lse = torch.empty(b, hq, s, device="cuda")
            for _ in range(3):
                module.attention_forward_sm90(q, k, v, out, lse, causal=window[1] >= 0, softmax_scale=d ** -0.5,
                                              window=window, sinks=sinks)
            torch.cuda.synchronize()
            outs.append(out.float())
        assert (outs[0] - outs[1]).abs().max().item() < 1e-2, "the stamped kernel disagrees with the package's"
        wgs = own.choose_tiles(d, window[1] >= 0, s, window[0])[4]
        row = dict(case=name, fp8=args.fp8, b=b, s=s, hq=hq, hk=hk, d=d, window=list(window), sinks=with_sinks, wgs=wgs,
                   **phases(stamped.STAMPS["last"], wgs))
        rows.append(row)
        print(f"{name}: span {row['span_us']:.1f} us, {row['ns_per_cycle']:.3f} ns/cycle")
        for wg in range(wgs):
            items = [(key.split("_", 1)[1], val) for key, val in row.items() if key.startswith(f"wg{wg}_")]
            print(f"  wg{wg}: " + ", ".join(f"{key} {val:.0f}" for key, val in items) + " (ns)")
        print("  producer: " + ", ".join(f"{key[2:]} {val:.0f}" for key, val in row.items() if key.startswith("p_"))
              + " (ns)")
    if args.out:
        save_sweep(args.out, rows)


if __name__ == "__main__":
    main()
