"""bench/experiments/attn-wait-split.py on a hand-made trace dump: one kv head's three splits in one layer."""
import importlib.util
from pathlib import Path

from kernels import isa

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "experiments" / "attn-wait-split.py"
spec = importlib.util.spec_from_file_location("attn_wait_split", SCRIPT)
aws = importlib.util.module_from_spec(spec)
spec.loader.exec_module(aws)

ATTN, QKV = isa.OPS["ATTN"], isa.OPS["QKV"]


def instr(op, layer, a0, a1):
    w = [0] * isa.INSTR_WORDS
    w[0], w[1], w[2], w[3] = op, layer, a0, a1
    return w


def rec(sm, index, op, ready, loop, mv, done):
    return dict(sm=sm, index=index, op=op, layer=0, t_wait=0, t_ready=ready, t_done=done, t_mv=mv, t_q=ready + 100,
                t_loop=loop)


def dump():
    # SMs 0-2: a QKV instruction, then ATTN (layer 0, head 1, splits 0-2); SM 3: an idle split (no loop stamp)
    ins = [instr(QKV, 0, 0, 9), instr(ATTN, 0, 1, 0),
           instr(QKV, 0, 9, 9), instr(ATTN, 0, 1, 1),
           instr(QKV, 0, 18, 9), instr(ATTN, 0, 1, 2),
           instr(ATTN, 0, 1, 3)]
    off = [0, 2, 4, 6, 7]
    recs = [rec(0, 0, QKV, 0, None, 50, 500),
            rec(0, 1, ATTN, 1000, 3000, 4400, 5000),
            rec(1, 1, ATTN, 1200, 3500, 4500, 5200),
            rec(2, 1, ATTN, 1100, 4000, 4600, 5300),   # the appending split (the highest) finishes last
            dict(rec(3, 0, ATTN, 1000, None, None, 1100))]
    return dict(ops=isa.OPS, off=off, ins=ins, recs={"60": recs})


def test_groups_only_the_splits_with_positions_of_one_head():
    groups = aws.head_groups(dump())
    assert len(groups) == 1 and sorted(r["split"] for r in groups[0]) == [0, 1, 2]


def test_wait_parts_medians():
    res = aws.wait_parts(aws.head_groups(dump()))
    assert res["groups"] == 1
    assert res["start_skew"] == 0.2 and res["loop_skew"] == 1.0
    assert res["lag"] == 0.5                     # word 3 - last loop end: 400, 500, 600 ns
    assert res["own_wait"] == 1.0                # 1400, 1000, 600 ns
    assert res["merge"] == 0.7                   # 600, 700, 700 ns
    assert res["last_is_appender"] == 1.0
