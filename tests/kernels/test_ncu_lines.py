"""bench/ncu_lines.py reads Nsight Compute's source CSV (CUDA lines, each followed by its SASS rows)."""
from bench.ncu_lines import compare, division_sites, parse, summary

METRICS = ["Warp Stall Sampling (All Samples)", "# Samples", "Instructions Executed", "stall_barrier",
           "stall_long_sb", "stall_wait", "stall_barrier (Not Issued)"]
HEADER = ["Line No", "Source", "Address", "Source"] + METRICS


def cuda(line, src, samples, executed, barrier=0, long_sb=0, wait=0):
    return [str(line), src, "-", "-", str(samples), str(samples), str(executed), str(barrier), str(long_sb),
            str(wait), "0"]


def sass(addr, text, samples, executed, barrier=0, long_sb=0, wait=0):
    return ["", "", hex(addr), "  " + text, str(samples), str(samples), str(executed), str(barrier), str(long_sb),
            str(wait), "0"]


ROWS = [
    ["File Path", "/src/kernels/csrc/mk_block.cuh"], ["Function Name", "mk_decode(MkParams)"], HEADER,
    cuda(112, "const bool ok = sflag[2] != 0;", 60, 1000, barrier=60),
    sass(0x100, "BAR.SYNC.DEFER_BLOCKING 0x0", 0, 500),
    sass(0x110, "UMOV UR44, 0x400", 60, 500, barrier=60),
    ["File Path", "/src/kernels/csrc/mk_attention.cuh"], ["Function Name", "mk_decode(MkParams)"], HEADER,
    cuda(11, "int s = min(p.n_splits, (n + p.attn_min_pos - 1) / p.attn_min_pos);", 30, 2000, wait=30),
    sass(0x200, "I2F.RP R49, R48", 10, 100, wait=10),
    sass(0x210, "MUFU.RCP R49, R49", 20, 100, wait=20),
    cuda(12, "if (p.attn_min_splits > 0) ...", 10, 300, long_sb=10),
    sass(0x220, "@!P0  I2F.U32.RP R52, R48", 10, 100, long_sb=10),
    ["File Path", "/src/kernels/csrc/mk_block.cuh"], ["Function Name", "mk_decode(MkParams)"], HEADER,
    cuda(112, "const bool ok = sflag[2] != 0;", 5, 1000, barrier=5),   # another inlined copy of line 112
    sass(0x110, "UMOV UR44, 0x400", 5, 500, barrier=5),                 # an address already seen: kept once
]


def test_parse_adds_up_inlined_copies_and_keeps_each_address_once():
    lines, instrs = parse(ROWS)
    ln = lines[("mk_block.cuh", 112)]
    assert ln.samples == 65 and ln.stalls["barrier"] == 65 and ln.executed == 1000
    assert [i.address for i in instrs] == [0x100, 0x110, 0x200, 0x210, 0x220]
    assert instrs[1].samples == 60 and instrs[3].where == "mk_attention.cuh:11"


def test_summary_ranks_lines_and_files_and_finds_the_divisions():
    lines, instrs = parse(ROWS)
    s = summary(lines, instrs, top=10)
    assert s["total_samples"] == 105
    assert [d["where"] for d in s["lines"]] == ["mk_block.cuh:112", "mk_attention.cuh:11", "mk_attention.cuh:12"]
    assert s["lines"][0]["pct"] == round(100 * 65 / 105, 2) and s["lines"][0]["stalls"] == {"barrier": 65}
    assert s["files"] == {"mk_block.cuh": round(100 * 65 / 105, 2), "mk_attention.cuh": round(100 * 40 / 105, 2)}
    sites = division_sites(instrs, before=0, after=2)
    # the unpredicated and the predicated I2F...RP both count; each with its own and the next instruction's samples
    assert [(d["where"], d["samples"]) for d in sites] == [("mk_attention.cuh:11", 30), ("mk_attention.cuh:12", 10)]


def test_compare_matches_lines_by_source_text_across_moved_line_numbers():
    """Two builds of one launch: a patch moved line 112 to 130 and added a line; compare pairs lines by file and
    text, so the moved line's change is its samples' difference, and the new line counts from zero."""
    base, _ = parse(ROWS)
    moved = [list(r) for r in ROWS]
    for r in moved:
        if r[0] == "112":
            r[0] = "130"
    moved[3] = cuda(130, "const bool ok = sflag[2] != 0;", 90, 1200, barrier=90)   # the first copy: 60 -> 90
    moved.insert(6, sass(0x118, "NOP", 0, 10))
    moved.append(cuda(140, "new line", 7, 70, wait=7))
    other, _ = parse(moved)
    c = compare(base, other, top=10)
    rows = {(r["file"], r["source"]): r for r in c["lines"]}
    ok = rows[("mk_block.cuh", "const bool ok = sflag[2] != 0;")]
    assert ok["samples"] == [65, 95] and ok["executed"] == [1000, 1200]
    assert rows[("mk_block.cuh", "new line")]["samples"] == [0, 7]
    assert c["lines"][0]["source"] == "const bool ok = sflag[2] != 0;"   # the largest difference first
    assert c["total_samples"] == [105, 142]
