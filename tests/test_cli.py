"""`fmha run` (the README's main command) checks against the oracle and reports SUCCESS."""
import subprocess
import sys

import pytest


@pytest.mark.parametrize("flags", [[], ["--paged", "16", "-s", "64", "-s-q", "3", "--causal", "-h", "4", "-h-kv", "2"],
                                   ["-s", "80", "--window", "8,0", "--sinks", "--alibi", "--softcap", "30"],
                                   ["--dtype", "fp8", "-s", "64", "--causal", "-h", "4", "-h-kv", "2"],
                                   ["--dtype", "fp8", "--paged", "16", "-s", "48", "-s-q", "5", "--causal"],
                                   ["--paged", "16", "-s", "50", "-s-q", "2", "--causal"], ["-s", "0"],
                                   ["--dtype", "fp8", "--paged", "16", "-s", "0", "-s-q", "3"]],
                         ids=["default", "paged", "options", "fp8", "fp8-paged", "paged-last-page-part-full", "empty",
                              "fp8-paged-no-keys"])
def test_fmha_run(flags):
    proc = subprocess.run([sys.executable, "-m", "fmha.cli", "run", "--runs", "1", "--warmup", "0", *flags],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]
    assert "Checks: SUCCESS" in proc.stdout
    assert "Elapsed:" in proc.stdout


@pytest.mark.parametrize("flags, says", [(["--paged", "-4"], "argument --paged: expected an integer >= 0"),
                                         (["-d", "20"], "fmha run: q: head_dim"),
                                         (["--softcap", "inf"], "fmha run: softcap:"),
                                         (["-h", "4", "-h-kv", "3"], "fmha run: k: heads_k"),
                                         (["-b", "0"], "argument -b: expected an integer >= 1"),
                                         (["-s", "-1"], "argument -s: expected an integer >= 0")],
                         ids=["page", "head-dim", "softcap", "heads-kv", "batch", "seqlen"])
def test_fmha_run_rejects_bad_values(flags, says):
    """A value fmha or the parser rejects ends the run with code 2 (not 1, a FAILED check) and a line naming it,
    without a traceback."""
    proc = subprocess.run([sys.executable, "-m", "fmha.cli", "run", "-s", "64", *flags],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and says in proc.stdout + proc.stderr, proc.stdout + proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and "Checks:" not in proc.stdout


def test_fmha_run_verbose_names_the_kernels():
    """`-v` prints what the call launched: on Hopper a d = 96 call runs the Gluon kernel padded to 128 (its output's
    96 columns stored), elsewhere the portable kernel at its own head dim."""
    import torch
    proc = subprocess.run([sys.executable, "-m", "fmha.cli", "run", "-v", "--runs", "1", "--warmup", "0", "-d", "96",
                           "-s", "64", "--causal"], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]
    launches = [line for line in proc.stdout.splitlines() if line.startswith("launch: ")]
    if torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9:
        assert len(launches) == 1 and "attn_fwd_sm90_kernel" in launches[0], proc.stdout
        assert "HEAD_D=128" in launches[0] and "DV_STORE=96" in launches[0], proc.stdout
    else:
        assert len(launches) == 1 and launches[0].startswith("launch: attn_fwd_kernel "), proc.stdout
        assert "HEAD_DIM_QK=96" in launches[0], proc.stdout
