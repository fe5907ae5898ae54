"""Compile the paged decode form for sm_90 on the CPU, split or not, at a given stage count, and print what
`test_compile_sm90`'s DECODE_SCRIPT reports (shared memory, registers, cp.async count). It runs that script's text
with SPLIT set and the split strides marked 16-divisible, as a real split call's are; PTX and cubin go to /tmp.

    TRITON_INTERPRET=0 PYTHONPATH=src python3 benchmarks/experiments/split_compile.py '[64, 64, 32, false, []]' True 3
        [TILES=64,64,2 MASK_RIGHT=True REVERSE_M=True ...]

The case is DECODE_SCRIPT's: [head dim, page size, packed rows, fp8, two forms]; then SPLIT and num_stages, and
any of the script's other constexprs as NAME=VALUE (its value as Python). TILES=M,N,W compiles BLOCK_M x BLOCK_N
tiles of W warps in place of the tables' pick for the case (a tile not in any table yet); MAXNREG=R caps the
registers (Triton's maxnreg option)."""
import sys
import textwrap


def decode_script():
    """DECODE_SCRIPT's text, read from tests/test_compile_sm90.py (run from the repository root)."""
    text = open("tests/test_compile_sm90.py").read()
    mark = "DECODE_SCRIPT = textwrap.dedent(" + "'" * 3
    start = text.index(mark) + len(mark)
    return textwrap.dedent(text[start:text.index("'" * 3 + ")", start)])


def main():
    script = decode_script()
    case, split, stages, *sets = sys.argv[1:]
    tiles = [x.split("=", 1)[1] for x in sets if x.startswith("TILES=")]
    maxnreg = [x.split("=", 1)[1] for x in sets if x.startswith("MAXNREG=")]
    sets = [x for x in sets if not x.startswith(("TILES=", "MAXNREG="))]
    if tiles:
        pick = "bm, bn, warps, stages = _tile_config(d, d, False, rows=rows, paged=True, kv_fp8=bool(fp8))"
        assert pick in script, "DECODE_SCRIPT's tile pick moved"
        script = script.replace(pick, f"bm, bn, warps, stages = {tiles[0]}, {int(stages)}")
    script = script.replace("SPLIT=False", f"SPLIT={split}")
    if sets:                      # set after the script's own constants (`consts` is made before `ptrs`)
        script = script.replace("ptrs = dict(Q=", f"consts.update({', '.join(sets)})\nptrs = dict(Q=", 1)
    tag = ("".join(f"_{x}" for x in sets) + "".join(f"_t{t.replace(',', '_')}" for t in tiles)
           + "".join(f"_r{r}" for r in maxnreg))
    if maxnreg:
        script = script.replace("options=dict(num_warps=warps,",
                                f"options=dict(maxnreg={int(maxnreg[0])}, num_warps=warps,")
    script = script.replace("num_stages=stages)", f"num_stages={int(stages)})")
    script = script.replace("stages=stages,", f"stages={int(stages)},")
    script = script.replace("n not in DECODE_ODD_ARGS", "(n not in DECODE_ODD_ARGS or n.startswith('stride_o_split')"
                                                        " or n.startswith('stride_l_split'))")
    script = script.replace("print(json.dumps(dict(",
                            f"open('/tmp/decode_split{split}_s{stages}{tag}.ptx', 'w').write(ptx); "
                            f"open('/tmp/decode_split{split}_s{stages}{tag}.cubin', 'wb').write(k.asm['cubin']); "
                            "print(json.dumps(dict(")
    sys.argv = [sys.argv[0], case]
    exec(compile(script, "DECODE_SCRIPT", "exec"), {"__name__": "__main__"})


if __name__ == "__main__":
    main()
