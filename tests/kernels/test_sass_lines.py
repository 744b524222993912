"""bench/sass_lines.py: static SASS instructions per source line from nvdisasm's line info, matched by source text."""
from collections import Counter

from bench.sass_lines import by_text, compare, count_lines

DISASM = """
//--------------------- .text._Z9mk_decode8MkParams --------------------------
	//## File "/build/a/kernels/csrc/mk_matvec.cuh", line 3
        /*0000*/                   LDC R1, c[0x0][0x28] ;
        /*0010*/                   S2UR UR55, SR_CTAID.X ;
	//## File "/build/a/kernels/csrc/monokernel.cu", line 2
        /*0020*/                   VIADD R1, R1, 0xffffffd0 ;
	//## File "/build/a/kernels/csrc/mk_matvec.cuh", line 3
        /*0030*/                   LDG.E.NA.128.CONSTANT R12, desc[UR22][R16.64] ;
.L_x_12:
	//## File "/usr/local/cuda/include/sm_32_intrinsics.hpp", line 180
        /*0040*/                   LDG.E.STRONG.GPU R3, desc[UR4][R2.64] ;
"""


def test_count_lines_adds_up_every_copy_of_a_line():
    c = count_lines(DISASM)
    assert c[("/build/a/kernels/csrc/mk_matvec.cuh", 3)] == 3
    assert c[("/build/a/kernels/csrc/monokernel.cu", 2)] == 1
    assert sum(c.values()) == 5   # labels and headers are not instructions


def test_lines_match_by_text_across_trees_and_moved_lines(tmp_path):
    """Build a's line 3 is build b's line 5 (a patch added two lines above it): compare pairs them by text."""
    for tree, lines in (("a", ["x", "y", "w = load(row);"]), ("b", ["x", "y", "new();", "more();", "w = load(row);"])):
        d = tmp_path / tree / "kernels" / "csrc"
        d.mkdir(parents=True)
        (d / "mk_matvec.cuh").write_text("\n".join(lines) + "\n")
        (d / "monokernel.cu").write_text("a\nloop();\n")
    a = by_text(count_lines(DISASM), str(tmp_path / "a"))
    moved = DISASM.replace("mk_matvec.cuh\", line 3", "mk_matvec.cuh\", line 5")
    b = by_text(count_lines(moved + '\t//## File "/build/b/kernels/csrc/mk_matvec.cuh", line 3\n'
                                    "        /*0050*/                   NOP ;\n"), str(tmp_path / "b"))
    assert a[("mk_matvec.cuh", "w = load(row);")] == 3 == b[("mk_matvec.cuh", "w = load(row);")]
    assert a[("sm_32_intrinsics.hpp", "line 180")] == 1   # outside the trees: the line number stands in
    c = compare(a, b, top=5)
    assert c["total"] == [5, 6]
    assert c["lines"][0] == dict(file="mk_matvec.cuh", source="new();", instructions=[0, 1])
    assert isinstance(a, Counter)
