"""The barrier protocol of the Gluon FP8 decode (`fmha.kernels.fp8_decode_sm90`, one consumer; the experiment's
kernel at commit 342f4f2 had an optional second one), simulated on the CPU: each partition (producer, widener, one
or two consumers) as a generator that yields its mbarrier waits and arrivals in the kernel's order, run under random
interleavings over random items (0-5 key tiles each). A run fails on a deadlock (no partition can move) or on a
wait that passes while its slot holds another tile than the waiter's (a parity wait passes when the slot is two
phases behind as well as when it is done).

    python3 benchmarks/experiments/fp8_gluon_decode_protocol.py

Expected: every (RAW_STAGES, W_STAGES, CONSUMERS) runs clean except two consumers with W_STAGES = 1, which must fail
(the reason the experiment's `fp8_decode` asserted W_STAGES >= 2 there): the widener's V_c waits for V_{c-1}, which the
other consumer frees only with its next Q·Kᵀ, whose K the widener writes after V_c; and with one slot a consumer that
skips the other's tile can pass the slot's parity wait while the slot is two phases behind. At W_STAGES >= 2 a
consumer's waits stay within one phase of their tile: within an item its previous tile is two back, and across items Q's
barrier (consumer 0 writes the next item's Q only after both have done this item's Q·Kᵀ) orders them.
"""
import random


class Barrier:
    """An mbarrier: `count` arrivals complete a phase; wait(parity) passes once the phase of that parity is done
    (the current phase's parity differs), as try_wait.parity."""

    def __init__(self, count):
        self.count, self.pending, self.done = count, 0, 0

    def arrive(self):
        self.pending += 1
        if self.pending == self.count:
            self.pending = 0
            self.done += 1

    def passes(self, parity):
        return (self.done & 1) != parity


def producer(bars, slots, tiles, R):
    c = 0
    for n in tiles:
        for i in range(n):
            s = c % R
            yield ("wait", bars["raw_empty"][s], ((c // R) & 1) ^ 1, None)
            assert slots["raw"][s] in (None, "free"), ("raw slot reused before release", c)
            slots["raw"][s] = c
            yield ("arrive", bars["raw_ready"][s])
            c += 1


def widener(bars, slots, tiles, R, W):
    c = 0
    for n in tiles:
        for i in range(n):
            s, ws = c % R, c % W
            yield ("wait", bars["raw_ready"][s], (c // R) & 1, ("raw", s, c))
            yield ("wait", bars["k_empty"][ws], ((c // W) & 1) ^ 1, None)
            assert slots["k"][ws] in (None, "free"), ("K slot reused before release", c)
            slots["k"][ws] = c
            yield ("arrive", bars["k_ready"][ws])
            yield ("wait", bars["v_empty"][ws], ((c // W) & 1) ^ 1, None)
            assert slots["v"][ws] in (None, "free"), ("V slot reused before release", c)
            slots["v"][ws] = c
            yield ("arrive", bars["v_ready"][ws])
            slots["raw"][s] = "free"
            yield ("arrive", bars["raw_empty"][s])
            c += 1


def consumer(bars, slots, tiles, W, C, g):
    c = 0
    for w, n in enumerate(tiles):
        if C == 2:
            if g == 0:
                yield ("wait", bars["q_empty"], (w & 1) ^ 1, None)
                slots["q"] = w
                yield ("arrive", bars["q_ready"])
            yield ("wait", bars["q_ready"], w & 1, ("q", None, w))
        first = g                 # consumer g takes the item's tiles g, g + C, ... (the kernel's `n_mine`)
        mine = (n - first + C - 1) // C
        if mine > 0:
            ci = c + first
            yield ("wait", bars["k_ready"][ci % W], (ci // W) & 1, ("k", ci % W, ci))
            slots["k"][ci % W] = "free"
            yield ("arrive", bars["k_empty"][ci % W])
            if C > 1 and mine == 1:
                yield ("arrive", bars["q_empty"])
            for j in range(1, mine):
                ci = c + first + C * j
                prev = ci - C
                yield ("wait", bars["k_ready"][ci % W], (ci // W) & 1, ("k", ci % W, ci))
                yield ("wait", bars["v_ready"][prev % W], (prev // W) & 1, ("v", prev % W, prev))
                slots["k"][ci % W] = "free"
                yield ("arrive", bars["k_empty"][ci % W])
                if C > 1 and j == mine - 1:
                    yield ("arrive", bars["q_empty"])
                slots["v"][prev % W] = "free"
                yield ("arrive", bars["v_empty"][prev % W])
            cl = c + first + C * (mine - 1)
            yield ("wait", bars["v_ready"][cl % W], (cl // W) & 1, ("v", cl % W, cl))
            slots["v"][cl % W] = "free"
            yield ("arrive", bars["v_empty"][cl % W])
        elif C > 1:
            yield ("arrive", bars["q_empty"])
        c += n
        if C > 1:
            if g == 1:
                yield ("wait", bars["merge_free"], (w & 1) ^ 1, None)
                yield ("arrive", bars["merge_ready"])
            else:
                yield ("wait", bars["merge_ready"], w & 1, None)
                yield ("arrive", bars["merge_free"])


def run(R, W, C, tiles, rng):
    """True if every partition finishes; False on a deadlock or on a wait that passes with the wrong tile."""
    bars = dict(raw_ready=[Barrier(1) for _ in range(R)], raw_empty=[Barrier(1) for _ in range(R)],
                k_ready=[Barrier(1) for _ in range(W)], k_empty=[Barrier(1) for _ in range(W)],
                v_ready=[Barrier(1) for _ in range(W)], v_empty=[Barrier(1) for _ in range(W)],
                q_ready=Barrier(1), q_empty=Barrier(C), merge_ready=Barrier(1), merge_free=Barrier(1))
    slots = dict(raw=[None] * R, k=[None] * W, v=[None] * W, q=None)
    parts = [producer(bars, slots, tiles, R), widener(bars, slots, tiles, R, W)]
    parts += [consumer(bars, slots, tiles, W, C, g) for g in range(C)]
    pending = [next(p, None) for p in parts]
    while any(op is not None for op in pending):
        ready = []
        for k, op in enumerate(pending):
            if op is None:
                continue
            if op[0] == "arrive" or op[1].passes(op[2]):
                ready.append(k)
        if not ready:
            return False
        k = rng.choice(ready)
        op = pending[k]
        if op[0] == "arrive":
            op[1].arrive()
        elif op[3] is not None:   # the slot must hold the tile this wait is for
            kind, s, want = op[3]
            held = slots["q"] if kind == "q" else slots[kind][s]
            if held != want:
                return False
        pending[k] = next(parts[k], None)
    return True


def main():
    rng = random.Random(0)
    for C in (1, 2):
        for W in (1, 2, 3):
            for R in (1, 2, 3, 4):
                failed = 0
                for trial in range(300):
                    tiles = [rng.choice([0, 1, 1, 2, 3, 4, 5]) for _ in range(rng.randint(1, 6))]
                    failed += not run(R, W, C, tiles, rng)
                expect = C == 2 and W == 1
                print(f"consumers {C} w_stages {W} raw_stages {R}: {failed} of 300 deadlocked or passed a wait "
                      f"with the wrong tile ({'expected' if expect else 'none expected'})")
                assert (failed > 0) == expect


if __name__ == "__main__":
    main()
