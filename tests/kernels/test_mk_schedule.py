"""Static properties of the per-SM instruction lists for real model shapes and tiny ones."""
import pytest

from engine.config import preset
from kernels import isa, schedule
from kernels.testing import tiny_cfg


@pytest.mark.parametrize("name", ["qwen2.5-coder-0.5b", "llama-3.2-1b", "qwen2.5-coder-1.5b"])
def test_real_shapes_on_h200(name):
    dims = schedule.Dims.of(preset(name))
    s = schedule.build(dims, n_sm=132)
    schedule.check(s)
    # every matvec stage keeps all SMs busy with at most one instruction each
    for op in ("QKV", "OPROJ", "GATEUP", "DOWN", "LMHEAD"):
        assert s.counts[op] <= 132, (op, s.counts[op])
        assert s.rows[op] * (2 if op == "GATEUP" else 1) * schedule.items_per_row(
            {"QKV": dims.d, "OPROJ": dims.q_dim, "GATEUP": dims.d, "DOWN": dims.ffn, "LMHEAD": dims.d}[op]
        ) <= isa.SMEM_RED_FLOATS
    assert s.counts["ATTN"] <= 132
    assert s.smem_bytes() <= 227 * 1024
    per_sm = [len(lst) for lst in s.per_sm]
    assert max(per_sm) - min(per_sm) <= dims.n_layers + 2   # balanced to within ~one instruction per stage
    off, ins = s.flat()
    assert off[-1] == len(ins) and ins.shape[1] == isa.INSTR_WORDS


@pytest.mark.parametrize("n_sm", [1, 3, 8, 13])
def test_tiny_any_sm_count(n_sm):
    s = schedule.build(schedule.Dims.of(tiny_cfg()), n_sm=n_sm)
    schedule.check(s)
    assert s.per_sm[0][-1][0] == isa.OPS["SAMPLE"]


def test_check_catches_a_wrong_wait():
    s = schedule.build(schedule.Dims.of(tiny_cfg()), n_sm=4)
    lst = s.per_sm[1]
    i = next(k for k, ins in enumerate(lst) if ins[0] == isa.OPS["OPROJ"])
    bad = list(lst[i])
    bad[5] -= 1   # waits for one combine fewer than exist
    lst[i] = tuple(bad)
    with pytest.raises(AssertionError):
        schedule.check(s)


def test_rejects_unsupported_group():
    with pytest.raises(ValueError):
        schedule.build(schedule.Dims.of(tiny_cfg(n_heads=18, n_kv_heads=1, hidden_size=288)), n_sm=8)
