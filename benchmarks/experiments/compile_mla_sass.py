"""Compile the Gluon MLA kernel, or a copy of its module, for sm_90 on a machine with no GPU and count what the SASS
holds: spill stores and loads (STL / LDL), instructions, and the bytes ptxas reports spilled. This is the check to
make before a kernel A/B (`mla_ab.sh`) is given device time.

    PYTHONPATH=src python3 benchmarks/experiments/compile_mla_sass.py CASE [--module PATH] [--cubin OUT]

CASE is the CPU compile test's case, as JSON: [causal, sinks, dtype, sparse, RoPE part, FP8 layout (0 / 1 V3.2 /
2 model1), second source, loading warpgroup]. The sparse prefill is '[false, false, "bf16", 1, true, 0, false, false]'.
--module PATH compiles a copy of `kernels/mla_decode_sm90.py` (an A/B's patched copy) in place of the package's.
--cubin OUT keeps the cubin, and its SASS as OUT.sass. The signature comes from `tests/test_compile_sm90.py`'s
GLUON_MLA_SCRIPT, so that this compile and the test's stay one recipe.
"""
import argparse
import json
import os
import re
import subprocess
import sys

import triton

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests"))
from test_compile_sm90 import GLUON_MLA_SCRIPT, SERIALIZED  # noqa: E402

IMPORT = "from fmha.kernels import mla_decode_sm90 as M"
COPY = "from fmha.bench import load_module_copy\nM = load_module_copy(os.environ['FMHA_MLA_MODULE'])"
# Appended to the test's script, whose compiled kernel is `k`: the cubin kept, its metadata printed last.
CUBIN = """
open(os.environ["FMHA_MLA_CUBIN"], "wb").write(k.asm["cubin"])
print(json.dumps(dict(shared=k.metadata.shared, warps=k.metadata.num_warps, spill_bytes=spills(ptx))))
"""


def sass_counts(cubin):
    """Instructions, STL and LDL in the cubin's SASS (cuobjdump, the one Triton ships); the SASS kept as CUBIN.sass."""
    tools = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    sass = subprocess.run([os.path.join(tools, "cuobjdump"), "-sass", cubin], capture_output=True, text=True,
                          check=True).stdout
    with open(cubin + ".sass", "w") as f:
        f.write(sass)
    ops = [line.split("*/", 1)[1].split() for line in sass.splitlines() if re.match(r"\s+/\*[0-9a-f]{4,}\*/", line)]
    ops = [o[1] if o[0].startswith("@") else o[0] for o in ops if o]
    return dict(instructions=len(ops), STL=sum(o.startswith("STL") for o in ops),
                LDL=sum(o.startswith("LDL") for o in ops))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("case", help="the compile test's case, as JSON")
    p.add_argument("--module", help="a copy of kernels/mla_decode_sm90.py to compile instead of the package's")
    p.add_argument("--cubin", default="/tmp/mla_sm90.cubin", help="where the cubin (and OUT.sass) go")
    a = p.parse_args(argv)
    assert GLUON_MLA_SCRIPT.count(IMPORT) == 1, "the compile test's script no longer imports the module this way"
    script = "import os\n" + SERIALIZED + GLUON_MLA_SCRIPT.replace(IMPORT, COPY if a.module else IMPORT) + CUBIN
    env = dict(os.environ, TRITON_INTERPRET="0", FMHA_MLA_CUBIN=a.cubin,
               FMHA_MLA_MODULE=os.path.abspath(a.module) if a.module else "")
    done = subprocess.run([sys.executable, "-c", script, json.dumps(json.loads(a.case))], env=env,
                          capture_output=True, text=True)
    if done.returncode:
        sys.exit(done.stderr[-3000:])
    info = json.loads(done.stdout.strip().splitlines()[-1])
    info.update(sass_counts(a.cubin))
    print(json.dumps(info))


if __name__ == "__main__":
    main()
