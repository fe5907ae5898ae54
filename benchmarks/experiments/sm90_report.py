"""What the experiments' sm_90 compiles report, from a `triton.compile` result: its SASS and `cuobjdump -res-usage`
line (the registers and stack a thread), through the cuobjdump that ships with Triton (no GPU needed)."""
import os
import re
import subprocess
import tempfile

import triton


def sass_and_usage(compiled):
    """(SASS text, registers, stack bytes) of a compiled kernel's cubin."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
        usage = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True, check=True).stdout
        sass = subprocess.run([tool, "-sass", f.name], capture_output=True, text=True, check=True).stdout
    return sass, int(re.search(r"REG:([0-9]+)", usage).group(1)), int(re.search(r"STACK:([0-9]+)", usage).group(1))
