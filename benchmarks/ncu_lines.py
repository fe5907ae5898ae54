"""An ncu per-instruction page summed by Python source line: which lines of a Triton / Gluon kernel hold the stall
samples and the executed instructions. The page (`ncu -i R --page source --csv --print-source sass`) gives each
SASS instruction's address; the kernel's cubin (Triton's cache, e.g. `experiments/dump_sparse_prefill.sh`) gives
each address's line through `nvdisasm -g` (the one Triton ships). Lines of the kernel file are printed with their
text and top stall reasons. Usage:
    python3 benchmarks/ncu_lines.py PAGE.csv KERNEL.cubin SOURCE.py [top] [--by exec]"""
import collections
import os
import re
import subprocess
import sys

import triton

from ncu_source import num, read_page


def line_of_offsets(cubin):
    """{offset in the function: (file name, line)} from nvdisasm's line comments."""
    nvdisasm = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "nvdisasm")
    text = subprocess.run([nvdisasm, "-g", "-c", cubin], capture_output=True, text=True, check=True).stdout
    lines, cur = {}, None
    for row in text.splitlines():
        m = re.search(r'## File "([^"]+)", line (\d+)', row)
        if m:
            cur = (os.path.basename(m.group(1)), int(m.group(2)))
            continue
        m = re.match(r"\s+/\*([0-9a-f]{4,})\*/", row)
        if m:
            lines[int(m.group(1), 16)] = cur
    return lines


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    page, cubin, source = args[:3]
    top = int(args[3]) if len(args) > 3 else 40
    key = 1 if "--by" in sys.argv and sys.argv[sys.argv.index("--by") + 1] == "exec" else 0
    head, body = read_page(page)
    samples, executed = head.index("Warp Stall Sampling (All Samples)"), head.index("Instructions Executed")
    reasons = [i for i, c in enumerate(head) if c.startswith("stall_") and "Not Issued" not in c]
    where = line_of_offsets(cubin)
    base = int(body[0][0], 16)            # the page starts at the function's first instruction
    per_line = collections.defaultdict(lambda: [0.0, 0.0, collections.Counter()])
    for r in body:
        acc = per_line[where.get(int(r[0], 16) - base)]
        acc[0] += num(r[samples]) or 0.0
        acc[1] += num(r[executed]) or 0.0
        for i in reasons:
            acc[2][head[i][6:]] += num(r[i]) or 0.0
    text = open(source).read().splitlines()
    name = os.path.basename(source)
    total = [sum(a[k] for a in per_line.values()) or 1.0 for k in (0, 1)]
    print(f"{total[0]:.0f} samples, {total[1]:.0f} warp instructions executed; lines by "
          f"{'executed instructions' if key else 'samples'}:")
    for line, (smp, ex, why) in sorted(per_line.items(), key=lambda t: -t[1][key])[:top]:
        src = text[line[1] - 1].strip()[:64] if line and line[0] == name else ""
        label = f"{line[0]}:{line[1]}" if line else "?"
        stalls = ", ".join(f"{k} {v:.0f}" for k, v in why.most_common(3))
        print(f"{label:28s} {smp / total[0] * 100:5.1f}% smp {ex / total[1] * 100:5.1f}% exec  {src:64s}  {stalls}")


if __name__ == "__main__":
    main()
