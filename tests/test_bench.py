"""`fmha bench`'s row measurement (`bench._measure`): every implementation checked against ours before it is timed,
timed in interleaved rounds, and the median of its rounds kept, so that one stalled timing cannot set a row."""
import sys
import types

import pytest
import torch

from fmha import bench


def _scripted(monkeypatch, seconds):
    """bench_gpu returns the next of `seconds` each call, after running the call once; the calls' order is kept."""
    order = []
    it = iter(seconds)

    def fake(fn):
        order.append(fn.__name__)
        fn()
        return next(it)
    monkeypatch.setattr(bench, "bench_gpu", fake)
    monkeypatch.setattr(bench, "_heat", lambda fns: None)
    return order


def _impl(name, value):
    def fn():
        return value
    fn.__name__ = name
    return fn


def test_measure_takes_the_median_of_interleaved_rounds(monkeypatch):
    x = torch.arange(6.0).reshape(1, 2, 3)
    # Round by round: ours, peer. Ours stalls in round 2 (5 ms against 1 ms); the peer takes 2 ms throughout.
    order = _scripted(monkeypatch, [1e-3, 2e-3, 5e-3, 2e-3, 1e-3, 2e-3])
    row = {}
    bench._measure(row, {"ours": _impl("ours", x), "peer": _impl("peer", x.clone())}, x, 1e9, 1e6,
                   ratio_of="tflops", graph=False, to_nhd=lambda o: o)
    assert order == ["ours", "peer"] * 3
    assert row["ours_tflops"] == pytest.approx(1e9 / 1e-3 / 1e12)
    assert row["ours_gbps"] == pytest.approx(1e6 / 1e-3 / 1e9)
    assert row["ours_vs_peer"] == pytest.approx(2.0)
    assert row["ours_rounds"] == "1.0/0.2/1.0" and row["peer_rounds"] == "0.5/0.5/0.5"


def test_measure_reports_wrong_and_failing_peers(monkeypatch):
    x = torch.arange(6.0).reshape(1, 2, 3)
    _scripted(monkeypatch, [1e-3] * 6)
    row = {}

    calls = []

    def flaky():
        calls.append(1)
        if len(calls) > 2:        # the check's call and the first timing pass; the second timing fails
            raise RuntimeError("launch failed")
        return x
    bench._measure(row, {"ours": _impl("ours", x), "wrong": _impl("wrong", x + 1), "flaky": flaky}, x, 1e9, 1e6,
                   ratio_of="gbps", graph=False, to_nhd=lambda o: o)
    assert "disagrees" in row["wrong_error"] and "wrong_gbps" not in row
    assert "launch failed" in row["flaky_error"] and "flaky_gbps" not in row and "ours_vs_flaky" not in row
    assert row["ours_rounds"] == "1.0/1.0/1.0"


def test_measure_checks_the_first_tensor_of_a_tuple_or_list(monkeypatch):
    """Kernels return (out, lse, ...) as a tuple, a torch op (FlashMLA's sparse prefill) as a list: each is checked
    on its first tensor, and a wrong first tensor in a list is caught like any other."""
    x = torch.arange(6.0).reshape(1, 2, 3)
    lse = torch.zeros(2)
    _scripted(monkeypatch, [1e-3] * 9)
    row = {}
    bench._measure(row, {"ours": _impl("ours", (x, lse)), "op": _impl("op", [x.clone(), lse]),
                         "wrong": _impl("wrong", [x + 1, lse])}, x, 1e9, 1e6, ratio_of="tflops", graph=False,
                   to_nhd=lambda o: o)
    assert "op_error" not in row and row["ours_vs_op"] == pytest.approx(1.0)
    assert "disagrees" in row["wrong_error"] and "wrong_tflops" not in row


def test_measure_falls_back_to_eager_for_the_whole_row(monkeypatch):
    """A call that cannot be captured is timed eagerly in every round, and the row says so."""
    x = torch.arange(6.0).reshape(1, 2, 3)
    _scripted(monkeypatch, [1e-3] * 3)
    captures = []

    def no_graph(fn):
        captures.append(fn.__name__)
        raise RuntimeError("operation not permitted when stream is capturing")
    monkeypatch.setattr(bench, "bench_gpu_graph", no_graph)
    monkeypatch.setattr(bench.torch.cuda, "synchronize", lambda: None)
    row = {}
    bench._measure(row, {"ours": _impl("ours", x)}, x, 1e9, 1e6, ratio_of="gbps", graph=True, to_nhd=lambda o: o)
    assert captures == ["ours"] and row["ours_timing"] == "eager" and row["ours_rounds"] == "1.0/1.0/1.0"


def test_measure_checks_ours_against_another_reference(monkeypatch):
    """FP8 prefill rows take their reference from our bf16 path: ours is checked against it like every peer, and
    a wrong result is reported, not timed; the reference's own output is not put through `to_nhd`."""
    x = torch.arange(6.0).reshape(1, 2, 3)
    _scripted(monkeypatch, [1e-3] * 3)
    row = {}
    bench._measure(row, {"ours": _impl("ours", x + 1), "ours-bf16": _impl("ours-bf16", x)}, x, 1e9, 1e6,
                   ratio_of="tflops", graph=False, to_nhd=lambda o: o, ref_name="ours-bf16")
    assert "disagrees" in row["ours_error"] and "ours_tflops" not in row and "ours_vs_ours-bf16" not in row
    assert row["ours-bf16_rounds"] == "1.0/1.0/1.0"


def test_measure_tolerance_per_implementation(monkeypatch):
    """FP8 rows loosen the check for our FP8 kernels only: a bf16 peer off by as much as ours may be is still
    reported, not timed."""
    x = torch.arange(6.0).reshape(1, 2, 3)
    _scripted(monkeypatch, [1e-3] * 6)
    row = {}
    bench._measure(row, {"ours": _impl("ours", x + 0.3), "ours-bf16": _impl("ours-bf16", x),
                         "peer": _impl("peer", x + 0.3)}, x, 1e9, 1e6, ratio_of="tflops", graph=False,
                   to_nhd=lambda o: o, ref_name="ours-bf16", tol={"ours": 0.5})
    assert "ours_error" not in row and row["ours_vs_ours-bf16"] == pytest.approx(1.0)
    assert "disagrees" in row["peer_error"] and "peer_tflops" not in row


def test_measure_does_not_check_the_reference_against_itself(monkeypatch):
    """Decode rows put the peers' (b, h, s, d) outputs through `to_nhd` (a transpose); ours, whose output is the
    reference, must not be (its (b, 1, h, d) transposed would broadcast against itself and read as wrong)."""
    ours = torch.arange(24.0).reshape(2, 1, 4, 3)
    _scripted(monkeypatch, [1e-3] * 6)
    row = {}
    bench._measure(row, {"ours": _impl("ours", ours), "peer": _impl("peer", ours.transpose(1, 2))}, ours, 1e9, 1e6,
                   ratio_of="gbps", graph=False, to_nhd=lambda o: o.transpose(1, 2))
    assert "ours_error" not in row and "peer_error" not in row and row["ours_vs_peer"] == pytest.approx(1.0)


def test_measure_reports_host_time_of_eager_timings(monkeypatch):
    """Eager rows carry each implementation's host time a call (calls issued back to back), which says when a
    timing measured the host; CUDA-graph rows do not (a replay has no host work a call)."""
    import time
    x = torch.arange(6.0).reshape(1, 2, 3)

    def slow():
        time.sleep(2e-3)
        return x
    for graph in (False, True):
        _scripted(monkeypatch, [1e-3] * 6)
        monkeypatch.setattr(bench, "bench_gpu_graph", lambda fn: 1e-3)
        row = {}
        bench._measure(row, {"ours": slow, "peer": _impl("peer", x)}, x, 1e9, 1e6, ratio_of="gbps", graph=graph,
                       to_nhd=lambda o: o)
        if graph:
            assert "ours_host_us" not in row and "peer_host_us" not in row
        else:
            assert row["ours_host_us"] >= 2000 and 0 < row["peer_host_us"] < 1000, row


@pytest.mark.parametrize("dims", [["20"], ["64", "300"]])
def test_bench_rejects_a_head_dim_before_measuring(dims, capsys):
    """`fmha bench --head-dim` with a head dim no kernel takes is a usage error (code 2, naming it), raised before
    the GPU's ceilings are measured, not a traceback at that head dim's first row."""
    with pytest.raises(SystemExit) as stop:
        bench.main(["prefill", "--head-dim", *dims])
    assert stop.value.code == 2
    assert f"--head-dim: head_dim must be a multiple of 8 up to 256, or one of (512, 576); got {dims[-1]}" in (
        capsys.readouterr().err)


def test_peer_versions_names_only_the_peers_this_run_imported(monkeypatch):
    """A record says which peer builds ran (FlashMLA / FA3 on the device are vLLM's): the version where a package
    has one, else the file it loaded from; a peer not imported is left out, and nothing is imported to find out."""
    for name in bench.PEER_MODULES:
        monkeypatch.delitem(sys.modules, name, raising=False)
    monkeypatch.setitem(sys.modules, "flash_mla", types.SimpleNamespace(__version__="vllm-0.26.0"))
    monkeypatch.setitem(sys.modules, "flash_attn_interface",
                        types.SimpleNamespace(__file__="/peers/flash_attn_interface.py"))
    assert bench.peer_versions() == {"flash_mla": "vllm-0.26.0",
                                     "flash_attn_interface": "/peers/flash_attn_interface.py"}


def test_use_mla_kernels_gives_each_module_its_own_kept_plans(monkeypatch):
    """The tuning scripts' A/B of kernel copies (`probe_mla.py --versions`, `probe_timeline.py`): a call key's kept
    launch plan is made by one module and runs only with it, so a copy routed in must not see the package's kept
    plans, and swapping back must give the package its own again."""
    import fmha.kernels
    from fmha.kernels import launch, mla_decode, mla_decode_sm90
    package = (mla_decode_sm90, launch.Plans())      # the package's routes for this test: the real ones untouched
    monkeypatch.setattr(fmha.kernels, "mla_decode_sm90", package[0])      # restored whatever the test does
    monkeypatch.setattr(mla_decode, "_ROUTES", package[1])
    package[1].keep("key", "the package's plan")
    copy = types.SimpleNamespace(name="a copy of the kernel module")
    assert bench.use_mla_kernels(copy) == package
    assert fmha.kernels.mla_decode_sm90 is copy
    assert isinstance(mla_decode._ROUTES, launch.Plans) and "key" not in mla_decode._ROUTES
    mla_decode._ROUTES.keep("key", "the copy's plan")
    kept = mla_decode._ROUTES
    assert bench.use_mla_kernels(*package) == (copy, kept)
    assert fmha.kernels.mla_decode_sm90 is package[0] and mla_decode._ROUTES["key"] == "the package's plan"
    bench.use_mla_kernels(copy, kept)                                       # a copy's own plans, given back
    assert mla_decode._ROUTES["key"] == "the copy's plan"


def test_outputs_diff_checks_every_output():
    """The kernel A/Bs' check (`probe_mla.py`): a version whose out matches but whose LSE or max_logits does not
    must fail it, as must one with an infinity (a row with no key) in another place."""
    out = torch.randn(4, 8)
    lse = torch.tensor([0.5, float("inf"), -1.0, 2.0])
    ref = (out, lse, torch.tensor([1.0, float("-inf"), 0.0, 3.0]))
    assert bench.outputs_diff(tuple(t.clone() for t in ref), ref) == 0.0
    assert bench.outputs_diff(out + 1e-3, out) == pytest.approx(1e-3, rel=1e-3)
    stale = (out.clone(), lse.clone(), ref[2] - 4.0)          # out right, max_logits off
    assert bench.outputs_diff(stale, ref) == pytest.approx(4.0)
    moved = (out.clone(), torch.tensor([0.5, 1.0, float("inf"), 2.0]), ref[2].clone())
    assert bench.outputs_diff(moved, ref) == float("inf")
    assert bench.outputs_diff(ref[:2], ref) == float("inf")
