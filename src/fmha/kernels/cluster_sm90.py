"""2-CTA cluster operations for the Gluon kernels that run clusters (`sparse_decode_sm90`; the dense MLA experiment of
branch `exp-dense-pairs` used them too, NOTES.md thirty-fifth session). Gluon 3.6 has none, so they are inline PTX,
which addresses shared memory as `global_smem` (Triton's base symbol) plus an allocation's offset; the host reads the
offsets from a first compile and passes them in as constexprs (`sm90.launch_pairs`).

The protocol both kernels use for a ring slot that both CTAs' loaders write into (each its half of the rows, into
its own and the other CTA's slot): before writing, a loader waits until its own consumers are done with the slot
and then reports that to the other CTA (`cluster_free`, a remote arrive with the default `.release.cta` semantics,
as CUTLASS's cluster pipelines do: `.release.cluster` cost the sparse decode 6.5%, NOTES.md thirty-second session),
and waits for the other CTA's report."""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier

THREADS = gl.constexpr(gl.BlockedLayout([1], [32], [4], [0]))       # one element per thread of a warpgroup
_CLUSTER_SYNC = gl.constexpr(
    "{ fence.mbarrier_init.release.cluster;\n"
    "barrier.cluster.arrive.release.aligned;\n"
    "barrier.cluster.wait.acquire.aligned;\n"
    "mov.u32 $0, $1; }")
_PEER_ARRIVE = gl.constexpr(        # if $1: arrive on the barrier at shared offset $2 of CTA $3
    "{ .reg .pred p; .reg .b32 a;\n"
    "setp.ne.u32 p, $1, 0;\n"
    "mov.u32 a, global_smem;\n"
    "add.u32 a, a, $2;\n"
    "mapa.shared::cluster.u32 a, a, $3;\n"
    "@p mbarrier.arrive.shared::cluster.b64 _, [a];\n"
    "mov.u32 $0, 0; }")


@gluon.jit
def cluster_sync():
    """Every thread of both CTAs: barrier inits made visible to the cluster, then a cluster-wide barrier (at the
    start, before either CTA can touch the other's memory; at the end, before either may exit)."""
    tid = gl.arange(0, 128, layout=THREADS)
    gl.inline_asm_elementwise(_CLUSTER_SYNC, "=r,r", [tid], gl.int32, False, 1)


@gluon.jit
def cluster_free(at, peer_free, i, rank, relay, phase):
    """A loader's wait for its own consumers to free a slot is behind it: report it to the other CTA on its barrier i
    of `peer_free` (an allocation of barriers at shared offset `at`; relay: the slot held a tile, so the other loader
    waits for this), then wait until the other CTA's consumers are done with the slot too. (The loader waits on
    peer_free itself, not by inline PTX: a buffer no partition uses is dead to Triton's allocator, which then lends
    its bytes to others.)"""
    tid = gl.arange(0, 128, layout=THREADS)
    zero = tid * 0
    gl.inline_asm_elementwise(_PEER_ARRIVE, "=r,r,r,r", [((tid == 0) & relay).to(gl.int32), at + i * 8 + zero,
                                                         1 - rank + zero], gl.int32, False, 1)
    mbarrier.wait(peer_free.index(i), phase)
