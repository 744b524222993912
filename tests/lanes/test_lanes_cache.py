"""(5) Incremental decode with the lane KV cache equals the full-sequence forward at every step,
including SWA layers whose window the sequence crosses, chunked prefill, and delayed modes."""

import pytest
import torch

TOL = 1e-4
SEQ = [4, 90, 13, 57, 2, 33, 71, 8, 19, 64, 45, 6, 80, 27]


@pytest.mark.parametrize("lanes,overrides", [
    (2, dict(broadcast_delay=2, use_early_comm=True, sliding_window=3, sliding_window_n_layers=2)),
    (4, dict(broadcast_delay=1, use_early_comm=False, sliding_window=4, swa_layers=[0, 2, 3],
             unclamped_layers=[3], lm_head_type="vocab_parallel")),
    (2, dict(broadcast_delay=1, lm_head_type="lane", replicated_rmsn_scale=False)),
])
def test_decode_matches_full_forward(lane_model, lanes, overrides):
    m = lane_model(lanes=lanes, seed=21, **overrides)
    cfg = m.cfg
    full = m(torch.tensor(SEQ))                                     # [S, V]
    cache = m.new_cache()
    # chunks: prefill 3, then single tokens, a 4-token chunk crossing the window, singles again
    chunks = [SEQ[:3]] + [[t] for t in SEQ[3:7]] + [SEQ[7:11]] + [[t] for t in SEQ[11:]]
    pos = 0
    for chunk in chunks:
        got = m(torch.tensor(chunk), cache)
        torch.testing.assert_close(got, full[pos:pos + len(chunk)], atol=TOL, rtol=TOL)
        pos += len(chunk)
        assert cache.length == pos
        for i in range(cfg.num_layers):
            T = min(pos, cfg.sliding_window) if cfg.is_swa(i) else pos
            assert cache.k[i].shape == (lanes, cfg.num_kv_heads // lanes, T, cfg.head_dim)
            assert cache.v[i].shape == cache.k[i].shape
    assert pos == len(SEQ)


def test_window_matters_and_unclamped_is_full(lane_model):
    """Guard for the test above: the window changes logits past W, and unclamped layers are full."""
    m = lane_model(lanes=2, seed=3, sliding_window=3, swa_layers=[0, 1, 2], unclamped_layers=[1])
    assert m.cfg.swa_layers == (0, 2)
    windowed = m(torch.tensor(SEQ))
    m.cfg = m.cfg.with_overrides(sliding_window=None)
    unwindowed = m(torch.tensor(SEQ))
    torch.testing.assert_close(windowed[:3], unwindowed[:3], atol=TOL, rtol=TOL)
    assert (windowed[3:] - unwindowed[3:]).abs().max() > 1e-2


def test_cache_layout_is_lane_heads(lane_model):
    """Cache of lane l holds the rotated keys of global KV heads l·Hkv/L ... (l+1)·Hkv/L − 1 only:
    with a lane's wk zeroed its keys are zero and no other lane's slice changes."""
    m = lane_model(lanes=2, seed=4)
    c1 = m.new_cache()
    m(torch.tensor(SEQ[:5]), c1)
    m.w["model.layers.0.attention.wk.weight"][1].zero_()
    c2 = m.new_cache()
    m(torch.tensor(SEQ[:5]), c2)
    assert torch.equal(c1.k[0][0], c2.k[0][0])
    assert torch.count_nonzero(c2.k[0][1]) == 0 and torch.count_nonzero(c1.k[0][1]) > 0


def test_cache_rejects_batches(lane_model):
    m = lane_model(lanes=2)
    with pytest.raises(ValueError, match="one sequence"):
        m(torch.tensor([SEQ[:3], SEQ[3:6]]), m.new_cache())
