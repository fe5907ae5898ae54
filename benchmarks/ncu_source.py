"""Summarise the per-instruction page of an ncu report (`ncu -i R --page source --csv --print-source sass`):
the stall-sample columns summed over the kernel, and the instructions with the most samples, each with its SASS
and the CUDA/Python line ncu attributes it to. Usage: python3 benchmarks/ncu_source.py page.csv [top]"""
import csv
import sys
from collections import Counter


def num(x):
    try:
        return float(x.replace(",", ""))
    except ValueError:
        return None


def read_page(path):
    """(header, rows) of an ncu source page CSV: the row naming the "Source" column, then every row as long."""
    rows = list(csv.reader(open(path, newline="")))
    head_i = next(i for i, r in enumerate(rows) if any("Source" == c.strip() for c in r))
    head = rows[head_i]
    return head, [r for r in rows[head_i + 1:] if len(r) == len(head)]


def main():
    head, body = read_page(sys.argv[1])
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 60
    print("columns:", head)
    src = head.index("Source")
    stall_cols = [i for i, c in enumerate(head) if "Sampl" in c or c.startswith("stall") or "Stall" in c]
    totals = Counter()
    for r in body:
        for i in stall_cols:
            v = num(r[i])
            if v:
                totals[head[i]] += v
    print("\nsums over the kernel:")
    for k, v in totals.most_common():
        print(f"  {v:12.0f}  {k}")
    key = next((i for i in stall_cols if "All Samples" in head[i]), stall_cols[0] if stall_cols else None)
    if key is None:
        return
    # Per opcode (first word of the SASS, predicate dropped).
    by_op = Counter()
    for r in body:
        words = r[src].split()
        words = words[1:] if words and words[0].startswith("@") else words
        by_op[words[0].split(".")[0] if words else "?"] += num(r[key]) or 0
    print("\nsamples by opcode:")
    for k, v in by_op.most_common(25):
        print(f"  {v:10.0f}  {k}")
    print(f"\ntop {top} instructions by '{head[key]}':")
    nz = [i for i in stall_cols if any(num(r[i]) for r in body)]
    for idx, r in sorted(enumerate(body), key=lambda t: -(num(t[1][key]) or 0))[:top]:
        reasons = ", ".join(f"{head[i]}={r[i]}" for i in nz if i != key and num(r[i]))
        print(f"  #{idx:5d} {r[key]:>8}  {r[src][:70]:70s}  {reasons}")


if __name__ == "__main__":
    main()
