"""bench/mk_trace.py: stage breakdown of a traced monokernel step, on synthetic timestamps."""
import importlib.util
from pathlib import Path

import pytest

from kernels import isa

_spec = importlib.util.spec_from_file_location("mk_trace", Path(__file__).parents[2] / "bench" / "mk_trace.py")
mk_trace = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(mk_trace)
NAMES = {v: k for k, v in isa.OPS.items()}


SPLIT_MLP = ("QKV", "ATTN", "OPROJ", "GATEUP", "DOWN")


def _records(hop_ns=300, work_ns=2000, layers=3, sms=4, stages=SPLIT_MLP):
    recs, t = [], 0
    for layer in range(layers):
        for op in stages:
            ready = t + hop_ns
            for sm in range(sms):   # the SM-th instruction finishes sm * 100 ns after the first
                recs.append(dict(sm=sm, index=0, op=isa.OPS[op], layer=layer, t_wait=t, t_ready=ready,
                                 t_done=ready + work_ns + sm * 100))
            t = ready + work_ns + (sms - 1) * 100
    recs.append(dict(sm=0, index=1, op=isa.OPS["LMHEAD"], layer=0, t_wait=t, t_ready=t + hop_ns, t_done=t + 9000))
    return recs


def test_hop_span_and_spread_per_stage():
    tab = mk_trace.stage_table(_records(), NAMES)
    for op in SPLIT_MLP:
        assert tab[op]["span_us"] == pytest.approx(2.3)
        assert tab[op]["spread_us"] == pytest.approx(0.3 - 0.15)   # last 300 ns, median of 0..300 is 150
    # the very first stage has no producer before it; every other stage waited 300 ns for its inputs
    assert tab["QKV"]["hop_us"] == pytest.approx(0.3)
    assert tab["GATEUP"]["hop_us"] == pytest.approx(0.3)
    assert tab["layer_us"] == pytest.approx(5 * (0.3 + 2.3))
    assert tab["LMHEAD"]["span_us"] == pytest.approx(8.7)


def test_stage_order_is_the_kernel_order_not_alphabetical():
    recs = _records(hop_ns=1000, work_ns=500, layers=1, sms=1)
    tab = mk_trace.stage_table(recs, NAMES)
    assert all(tab[op]["hop_us"] >= 0 for op in SPLIT_MLP)
    assert "DOWN" in mk_trace.format_table("x", tab)


def test_fused_mlp_stage_and_its_parts():
    recs = _records(layers=2, stages=("QKV", "ATTN", "OPROJ", "MLP"))
    for r in recs:   # MLP: norm done 200 ns after ready, GATEUP rows 1000 ns, DOWN share 500 ns, then the adds
        if NAMES[r["op"]] == "MLP":
            r.update(t_mv=r["t_ready"] + 200, t_q=r["t_ready"] + 1200, t_loop=r["t_ready"] + 1700)
    tab = mk_trace.stage_table(recs, NAMES)
    assert "GATEUP" not in tab and "DOWN" not in tab
    assert tab["layer_us"] == pytest.approx(4 * (0.3 + 2.3))
    assert tab["MLP"]["gu_us"] == pytest.approx(1.0) and tab["MLP"]["down_us"] == pytest.approx(0.5)
    assert tab["MLP"]["red_us"] == pytest.approx(0.3 + 0.15)   # to t_done: work 2000 + sm * 100, median sm 1.5
    assert "q_us" not in tab["MLP"]
    assert "gateup 1.00 down 0.50" in mk_trace.format_table("x", tab)


def test_prep_and_matvec_split_from_the_matvec_stamp():
    recs = []
    for sm in range(3):   # ready at 1000, matvec starts 400 ns later, signalled 2000 ns after that (+sm * 100)
        recs.append(dict(sm=sm, index=0, op=isa.OPS["QKV"], layer=0, t_wait=0, t_ready=1000, t_mv=1400,
                         t_done=3400 + sm * 100))
    recs.append(dict(sm=0, index=1, op=isa.OPS["SAMPLE"], layer=0, t_wait=3600, t_ready=3700, t_mv=None,
                     t_done=4000))
    tab = mk_trace.stage_table(recs, NAMES)
    assert tab["QKV"]["prep_us"] == pytest.approx(0.4) and tab["QKV"]["prep_max_us"] == pytest.approx(0.4)
    assert tab["QKV"]["mv_us"] == pytest.approx(2.1) and tab["QKV"]["mv_max_us"] == pytest.approx(2.2)
    assert tab["SAMPLE"]["prep_us"] == 0.0   # no matvec stamp: not counted
    assert "prep" in mk_trace.format_table("x", tab)


def test_attention_phases_of_the_slowest_split():
    """ATTN splits with positions stamp q ready and loop done; idle splits (no positions) do not and are ignored."""
    recs = [dict(sm=0, index=0, op=isa.OPS["QKV"], layer=0, t_wait=0, t_ready=0, t_mv=100, t_done=1000)]
    for sm, (q, loop) in enumerate([(1500, 4000), (1600, 6000)]):
        recs.append(dict(sm=sm, index=1, op=isa.OPS["ATTN"], layer=0, t_wait=1000, t_ready=1300, t_q=q,
                         t_loop=loop, t_mv=loop + 500, t_done=loop + 600))
    recs.append(dict(sm=2, index=1, op=isa.OPS["ATTN"], layer=0, t_wait=1000, t_ready=1300, t_q=None, t_loop=None,
                     t_mv=1400, t_done=1450))
    tab = mk_trace.stage_table(recs, NAMES)
    assert tab["ATTN"]["q_us"] == pytest.approx(0.3)      # slowest: 1600 - 1300
    assert tab["ATTN"]["loop_us"] == pytest.approx(4.4)   # 6000 - 1600
    assert tab["ATTN"]["merge_us"] == pytest.approx(0.5)
    assert "slowest split" in mk_trace.format_table("x", tab)
    # spread over the splits with positions (done at 4600 and 6600: median 5600); the idle split's early signal
    # (1450) is not in it, and the span still ends with the last split
    assert tab["ATTN"]["spread_us"] == pytest.approx(1.0)
    assert tab["ATTN"]["prep_us"] == pytest.approx(4.2)   # partial published: 3.2 and 5.2 us after ready
    assert tab["ATTN"]["span_us"] == pytest.approx((6600 - 1300) / 1e3)
