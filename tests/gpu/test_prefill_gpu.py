"""Prefill on CUDA: the bf16 eager forward (flash attention with a lower-right causal bias) and the graph-replayed
padded prefill (PrefillGraphs) against the fp32 reference, chunks over a cached prefix; graph replay against
the same static step run eagerly. Needs only engine/ and torch.

Run on the GPU machine: python3 -m pytest -q tests/gpu/test_prefill_gpu.py
"""
import pytest
import torch

from engine.backends.graph import (MIN_BUCKET, GraphBackend, PrefillGraphs, bucket_for, prefill_bucket,
                                   static_step)
from shapes import SHAPES, paired_models, poisoned_cache, rel_l2  # noqa: E402  (tests/gpu on sys.path)

MAX_LEN = 512
# (start, end) chunks after a cached prefix of 100: one token, short, bucket-exact, crossing the 128 and 256
# windows, a long one, and one whose padded bucket would pass max_len (PrefillGraphs runs it eagerly).
CHUNKS = [(100, 101), (101, 109), (109, 141), (141, 269), (269, 300), (300, 420), (420, 500)]
END = CHUNKS[-1][1]


def _models(cfg, seed):
    return paired_models(cfg, seed, MAX_LEN)


def _cache(cfg, dtype, slots=2):
    return poisoned_cache(cfg, dtype, MAX_LEN, slots)


def _ids(cfg, n, seed):
    return torch.randint(0, cfg.vocab_size, (n,), generator=torch.Generator().manual_seed(seed)).cuda()


def _check_chunks(cfg, ref, rc, prefill, fc, slot=1):
    """Run CHUNKS through `prefill` (the fast path, cache fc) and the fp32 reference (cache rc); compare."""
    ids = _ids(cfg, END, seed=7)
    for a, b in CHUNKS:
        want = ref.forward(rc.k, rc.v, slot, ids[a:b], a)
        got = prefill(slot, ids[a:b], a)
        assert got.dtype == torch.float32 and got.shape == want.shape
        assert torch.isfinite(got).all(), (a, b)
        assert rel_l2(got, want) <= 1e-2, (a, b, rel_l2(got, want))
        assert rel_l2(fc.k[slot, :, :, :b], rc.k[slot, :, :, :b]) <= 1e-2, (a, b)
        assert rel_l2(fc.v[slot, :, :, :b], rc.v[slot, :, :, :b]) <= 1e-2, (a, b)
    return ids


@pytest.mark.parametrize("shape", list(SHAPES))
def test_bf16_eager_prefill_matches_fp32_reference(shape):
    cfg = SHAPES[shape]
    fast, ref = _models(cfg, seed=3)
    fc, rc = _cache(cfg, torch.bfloat16), _cache(cfg, torch.float32)
    ids = _ids(cfg, END, seed=7)
    fast.forward(fc.k, fc.v, 1, ids[:100], 0)
    ref.forward(rc.k, rc.v, 1, ids[:100], 0)
    _check_chunks(cfg, ref, rc, lambda s, x, p: fast.forward(fc.k, fc.v, s, x, p), fc)
    assert torch.isnan(fc.k[0]).all() and torch.isnan(fc.k[1, :, :, END:]).all()


@pytest.mark.parametrize("shape", list(SHAPES))
def test_graph_prefill_matches_fp32_reference(shape):
    cfg = SHAPES[shape]
    fast, ref = _models(cfg, seed=4)
    fc, rc = _cache(cfg, torch.bfloat16), _cache(cfg, torch.float32)
    pg = PrefillGraphs(fast, fc)
    assert pg.use_graphs
    ids = _ids(cfg, END, seed=7)
    fast.forward(fc.k, fc.v, 1, ids[:100], 0)
    ref.forward(rc.k, rc.v, 1, ids[:100], 0)
    _check_chunks(cfg, ref, rc, pg.prefill, fc)
    st = pg.stats()
    assert st["prefill_graph"] == len(CHUNKS) - 1 and st["prefill_eager_near_max_len"] == 1, st
    assert st["prefill_capture_error"] is None
    assert torch.isnan(fc.k[0]).all() and torch.isnan(fc.k[1, :, :, END:]).all()   # never past the padded chunks


@pytest.mark.parametrize("shape", list(SHAPES))
def test_graph_replay_equals_static_step_eager(shape):
    """The replay runs the same kernels as the eager static step on the same inputs: same logits, same KV."""
    cfg = SHAPES[shape]
    fast, _ = _models(cfg, seed=5)
    gc, ec = _cache(cfg, torch.bfloat16), _cache(cfg, torch.bfloat16)
    pg = PrefillGraphs(fast, gc)
    ids = _ids(cfg, 300, seed=9)
    fast.forward(gc.k, gc.v, 0, ids[:150], 0)
    fast.forward(ec.k, ec.v, 0, ids[:150], 0)
    arange = torch.arange(MAX_LEN, device="cuda")
    for a, b in [(150, 151), (151, 190), (190, 300)]:
        got = pg.prefill(0, ids[a:b], a)
        bucket = prefill_bucket(b - a)
        padded = torch.zeros(bucket, dtype=torch.long, device="cuda")
        padded[:b - a] = ids[a:b]
        start = torch.tensor([a], device="cuda")
        last = torch.tensor([b - a - 1], device="cuda")
        want = static_step(fast, ec.k, ec.v, 0, bucket_for(a + bucket - 1, MAX_LEN), padded, start, last, arange)
        assert rel_l2(got, want) <= 1e-3, (a, b, rel_l2(got, want))
        assert rel_l2(gc.k[0, :, :, :b], ec.k[0, :, :, :b]) <= 1e-3
    assert pg.counts["graph"] == 3


def test_graph_backend_captures_prefill_graphs_and_serves_them():
    cfg = SHAPES["qwen"]
    fast, ref = _models(cfg, seed=6)
    fc, rc = _cache(cfg, torch.bfloat16, slots=3), _cache(cfg, torch.float32, slots=3)
    be = GraphBackend(fast, fc)
    be.warmup()
    st = be.stats()
    assert st["prefill_graphs"] == 3 * len(be.prefill_graphs.shapes()) and st["prefill_capture_error"] is None
    ids = _ids(cfg, 300, seed=11)
    be.prefill(2, ids[:100], 0)
    ref.forward(rc.k, rc.v, 2, ids[:100], 0)
    got = be.prefill(2, ids[100:140], 100)
    want = ref.forward(rc.k, rc.v, 2, ids[100:140], 100)
    assert rel_l2(got, want) <= 1e-2
    # Decode continues from the real end: the pad rows' K/V past position 140 are overwritten or masked.
    for p in range(140, 140 + MIN_BUCKET // 4):
        got = be.decode(2, int(ids[p]), p)
        want = ref.forward(rc.k, rc.v, 2, ids[p:p + 1], p)
        assert rel_l2(got, want) <= 2e-2, p
    assert be.stats()["prefill_graph"] >= 2
