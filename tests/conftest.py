"""Pick the device: a CUDA GPU when there is one, else the Triton interpreter on the CPU.

The interpreter must be switched on before Triton (and so fmha) is imported, hence here, at collection.
Tests marked `gpu` run only with a GPU (real sizes, bf16 + fp16); tests marked `cpu` only without one
(interpreter, fp16 — bf16 arithmetic is wrong in the interpreter — small shapes).
"""
import os

import pytest
import torch

ON_GPU = torch.cuda.is_available()
if not ON_GPU:
    os.environ["TRITON_INTERPRET"] = "1"


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config):
    """Without a GPU, spread the tests over the machine's cores (up to 8) with pytest-xdist, a test extra, when it is
    installed and `-n` / `--dist` / `--pdb` / `--trace` were not given (`-n 0` runs one process): the interpreter runs a
    test on one core. Each compile test file's cases go to one worker (`--dist loadgroup`; its `xdist_group`), so that
    they share the compile processes (`test_compile_sm90.compiled`)."""
    if ON_GPU or hasattr(config, "workerinput") or not config.pluginmanager.hasplugin("xdist"):
        return
    cores = min(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1, 8)
    debugging = config.getoption("usepdb", False) or config.getoption("trace", False)
    if config.option.numprocesses is None and config.option.dist == "no" and cores > 1 and not debugging:
        config.option.numprocesses, config.option.dist = cores, "loadgroup"


def pytest_addoption(parser):
    parser.addoption("--shard", default=None, metavar="I/N",
                     help="run only every N-th collected test, starting at the I-th (0-based), so N processes "
                          "can share one machine's cores for the kernel compiles")


def _shard(config, items):
    spec = config.getoption("--shard")
    if spec is None:
        return
    i, n = (int(x) for x in spec.split("/"))
    if not 0 <= i < n:
        raise pytest.UsageError(f"--shard {spec}: need 0 <= I < N")
    keep = [item for j, item in enumerate(items) if j % n == i]
    config.hook.pytest_deselected(items=[item for j, item in enumerate(items) if j % n != i])
    items[:] = keep


@pytest.hookimpl(trylast=True)  # after `-m` / `-k` have deselected, so the shards are even
def pytest_collection_modifyitems(config, items):
    _shard(config, items)
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    skip_cpu = pytest.mark.skip(reason="interpreter-only case; the gpu-marked twin runs on this machine")
    for item in items:
        if "gpu" in item.keywords and not ON_GPU:
            item.add_marker(skip_gpu)
        if "cpu" in item.keywords and ON_GPU:
            item.add_marker(skip_cpu)


@pytest.fixture(autouse=True)
def fresh_launch_plans():
    """The Gluon prefill, the portable kernel, MLA decode and the combine keep a launch plan (a route) per call key
    (`forward_sm90._PLANS`, `forward._PLANS`, `mla_decode._ROUTES`, `combine._PLANS`), made from their tables and the
    SM count, which tests patch: each test starts with none, so a test's patches reach its calls."""
    import sys
    for name, plans in (("fmha.kernels.forward_sm90", "_PLANS"), ("fmha.kernels.forward", "_PLANS"),
                        ("fmha.kernels.mla_decode", "_ROUTES"), ("fmha.kernels.combine", "_PLANS")):
        module = sys.modules.get(name)
        if module is not None:
            getattr(module, plans).clear()
