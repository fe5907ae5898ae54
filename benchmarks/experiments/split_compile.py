"""Compile the paged decode form for sm_90 on the CPU, split or not, at a given stage count, and print what
`test_compile_sm90`'s DECODE_SCRIPT reports (shared memory, registers, cp.async count). It runs that script's text
with SPLIT set and the split strides marked 16-divisible, as a real split call's are; PTX and cubin go to /tmp.

    TRITON_INTERPRET=0 PYTHONPATH=src python3 benchmarks/experiments/split_compile.py '[64, 64, 32, false, []]' True 3

The case is DECODE_SCRIPT's: [head dim, page size, packed rows, fp8, two forms]; then SPLIT and num_stages."""
import sys
import textwrap

text = open("tests/test_compile_sm90.py").read()
mark = "DECODE_SCRIPT = textwrap.dedent(" + "'" * 3
start = text.index(mark) + len(mark)
script = textwrap.dedent(text[start:text.index("'" * 3 + ")", start)])
case, split, stages = sys.argv[1:4]
script = script.replace("SPLIT=False", f"SPLIT={split}")
script = script.replace("num_stages=stages)", f"num_stages={int(stages)})")
script = script.replace("stages=stages,", f"stages={int(stages)},")
script = script.replace("n not in DECODE_ODD_ARGS", "(n not in DECODE_ODD_ARGS or n.startswith('stride_o_split')"
                                                    " or n.startswith('stride_l_split'))")
script = script.replace("print(json.dumps(dict(",
                        f"open('/tmp/decode_split{split}_s{stages}.ptx', 'w').write(ptx); "
                        f"open('/tmp/decode_split{split}_s{stages}.cubin', 'wb').write(k.asm['cubin']); "
                        "print(json.dumps(dict(")
sys.argv = [sys.argv[0], case]
exec(compile(script, "DECODE_SCRIPT", "exec"))
