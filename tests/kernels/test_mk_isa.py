"""The instruction format is single-sourced: the checked-in header is what kernels/isa.py renders."""
import ctypes
from pathlib import Path

from kernels import isa
from kernels.runtime import MkLayer, MkParams

CSRC = Path(__file__).resolve().parents[2] / "kernels" / "csrc"


def test_header_is_current():
    assert (CSRC / "mk_isa.h").read_text() == isa.render_header(), \
        "kernels/csrc/mk_isa.h is stale: regenerate with python -c 'from kernels import isa; print(isa.render_header())'"


def test_header_mentions_every_op_and_field():
    text = isa.render_header()
    for name, code in isa.OPS.items():
        assert f"#define MK_OP_{name} {code}" in text
    for i, f in enumerate(isa.FIELDS):
        assert f"#define MK_F_{f.upper()} {i}" in text
    for name, kind in isa.PARAM_FIELDS:
        assert (f" {name}[{isa.MAX_TP}];" if kind.startswith("a8:") else f" {name};") in text


def test_ctypes_mirror_matches_field_list():
    assert [f[0] for f in MkParams._fields_] == [n for n, _ in isa.PARAM_FIELDS]
    assert [f[0] for f in MkLayer._fields_] == [n for n, _ in isa.LAYER_FIELDS]
    assert ctypes.sizeof(MkLayer) == 8 * len(isa.LAYER_FIELDS)
    # pointers and the u64 come first, so the 4-byte tail packs without holes
    n8 = sum(isa.MAX_TP if k.startswith("a8:") else 1 for _, k in isa.PARAM_FIELDS
             if k.startswith(("p:", "a8:")) or k == "u64")
    n4 = sum(1 for _, k in isa.PARAM_FIELDS if k in ("i32", "f32"))
    assert ctypes.sizeof(MkParams) == 8 * n8 + 4 * n4 + (4 * n4) % 8


def test_counter_indices_are_distinct():
    L, kvh = 3, 2
    idx = [isa.counter_index(layer, w) for layer in range(L) for w in range(isa.CTR_PER_LAYER)]
    idx += [isa.lm_counter(L), isa.token_counter(L)]
    idx += [isa.attn_ticket(L, kvh, layer, h) for layer in range(L) for h in range(kvh)]
    assert len(set(idx)) == len(idx) == isa.n_counters(L, kvh)
    assert max(idx) == isa.n_counters(L, kvh) - 1
