"""bench/experiments/attnq-q-stage.py's lead bins on hand-made trace records: each matvec lands in the bin of how
long its weight loads were in flight before it (t_wait -> t_mv), with that bin's median time."""
import importlib.util
import re
from pathlib import Path

from kernels import isa

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "experiments" / "attnq-q-stage.py"
spec = importlib.util.spec_from_file_location("attnq_q_stage", SCRIPT)
aqs = importlib.util.module_from_spec(spec)
spec.loader.exec_module(aqs)

ATTNQ, QKV = isa.OPS["ATTNQ"], isa.OPS["QKV"]


def rec(op, wait, mv, end, sm=0):
    r = dict(sm=sm, index=0, op=op, layer=0, t_wait=wait, t_ready=wait, t_done=end, t_mv=mv, t_q=None, t_loop=None)
    if op == ATTNQ:
        r["t_x6"] = end
    return r


def bins(out: str) -> dict[str, tuple[int, float]]:
    return {m[1]: (int(m[2]), float(m[3])) for m in
            re.finditer(r"lead (\d+-\S+) us:\s+(\d+) records, matvec median\s+([\d.]+)", out)}


def test_matvecs_fall_in_their_lead_bins(capsys):
    recs = {"60": [rec(ATTNQ, 0, 500, 1700),        # lead 0.5 us: matvec 1.2
                   rec(ATTNQ, 0, 800, 1800),        # lead 0.8: 1.0
                   rec(ATTNQ, 0, 2500, 2800),       # lead 2.5: 0.3
                   rec(ATTNQ, 0, 6000, 6250),       # lead 6.0: 0.25
                   rec(QKV, 0, 1500, 2900),         # lead 1.5: 1.4 (to the rows signalled)
                   rec(ATTNQ, 0, 0, None)],         # no matvec stamp: left out
            "100": [rec(ATTNQ, 100, 600, 1800)]}   # lead 0.5: 1.2
    aqs.by_lead(recs, ATTNQ, "t_x6")
    got = bins(capsys.readouterr().out)
    assert got == {"0-1": (3, 1.2), "2-3": (1, 0.3), "5-inf": (1, 0.25)}
    aqs.by_lead(recs, QKV, "t_done")
    assert bins(capsys.readouterr().out) == {"1-2": (1, 1.4)}
