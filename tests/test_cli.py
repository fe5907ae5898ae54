"""`fmha run` (the README's main command) checks against the oracle and reports SUCCESS."""
import subprocess
import sys

import pytest


@pytest.mark.parametrize("flags", [[], ["--paged", "16", "-s", "64", "-s-q", "3", "--causal", "-h", "4", "-h-kv", "2"],
                                   ["-s", "80", "--window", "8,0", "--sinks", "--alibi", "--softcap", "30"],
                                   ["--dtype", "fp8", "-s", "64", "--causal", "-h", "4", "-h-kv", "2"],
                                   ["--dtype", "fp8", "--paged", "16", "-s", "48", "-s-q", "5", "--causal"],
                                   ["--paged", "16", "-s", "50", "-s-q", "2", "--causal"]],
                         ids=["default", "paged", "options", "fp8", "fp8-paged", "paged-last-page-part-full"])
def test_fmha_run(flags):
    proc = subprocess.run([sys.executable, "-m", "fmha.cli", "run", "--runs", "1", "--warmup", "0", *flags],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]
    assert "Checks: SUCCESS" in proc.stdout
    assert "Elapsed:" in proc.stdout


def test_fmha_run_rejects_bad_page():
    proc = subprocess.run([sys.executable, "-m", "fmha.cli", "run", "--paged", "-4", "-s", "64"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "--paged -4" in proc.stdout
