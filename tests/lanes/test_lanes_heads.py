"""(6) Head types replicate / lane / vocab_parallel and pre_norm_lane_agg: shapes and semantics
of the final aggregation (spec §5), checked on hand-made per-lane residuals."""

import pytest
import torch

V, D = 96, 64


def rms(x, g, eps=1e-5):
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * g


def lane_states(lanes, seed=0):
    return torch.randn(2, 3, lanes, D, generator=torch.Generator().manual_seed(seed))   # [B, S, L, D]


@pytest.mark.parametrize("lanes", [2, 4])
def test_replicate_head_averages_normed_lanes(lane_model, lanes):
    m = lane_model(lanes=lanes)
    x = lane_states(lanes)
    g, W = m.w["model.norm.weight"], m.w["lm_head.weight"]
    out = m.head(x)
    assert out.shape == (2, 3, V)
    torch.testing.assert_close(out, rms(x, g).mean(2) @ W.T)


def test_replicate_per_lane_gain(lane_model):
    m = lane_model(lanes=2, replicated_rmsn_scale=False)
    g = m.w["model.norm.scale"]
    assert g.shape == (2, D)
    x = lane_states(2, seed=1)
    torch.testing.assert_close(m.head(x), ((rms(x[:, :, 0], g[0]) + rms(x[:, :, 1], g[1])) / 2)
                               @ m.w["lm_head.weight"].T)


@pytest.mark.parametrize("replicated", [True, False])
def test_pre_norm_lane_agg_sums_before_shared_norm(lane_model, replicated):
    m = lane_model(lanes=4, pre_norm_lane_agg=True, replicated_rmsn_scale=replicated)
    assert "model.norm.weight" in m.w and m.w["model.norm.weight"].shape == (D,)   # final gain shared
    x = lane_states(4, seed=2)
    torch.testing.assert_close(m.head(x), rms(x.sum(2), m.w["model.norm.weight"]) @ m.w["lm_head.weight"].T)


def test_lane_head_concatenates_lane_major(lane_model):
    m = lane_model(lanes=2, lm_head_type="lane")
    W = m.w["lm_head.linear.weight"]
    assert W.shape == (V, 2 * D)
    x = lane_states(2, seed=3)
    n = rms(x, m.w["model.norm.weight"])
    out = m.head(x)
    assert out.shape == (2, 3, V)
    torch.testing.assert_close(out, n[:, :, 0] @ W[:, :D].T + n[:, :, 1] @ W[:, D:].T)


def test_vocab_parallel_slices_come_from_own_lane(lane_model):
    lanes = 4
    m = lane_model(lanes=lanes, lm_head_type="vocab_parallel")
    W = m.w["lm_head.weight"]
    assert W.shape == (lanes, V // lanes, D)
    x = lane_states(lanes, seed=4)
    out = m.head(x)
    assert out.shape == (2, 3, V)
    n = rms(x, m.w["model.norm.weight"])
    for lane in range(lanes):
        sl = slice(lane * V // lanes, (lane + 1) * V // lanes)
        torch.testing.assert_close(out[..., sl], n[:, :, lane] @ W[lane].T)
    # perturbing lane 1's stream moves only vocab slice 1
    x2 = x.clone()
    x2[:, :, 1] += 1.0
    diff = (m.head(x2) - out).abs().amax(dim=(0, 1))
    own = slice(V // lanes, 2 * V // lanes)
    assert diff[own].max() > 1e-3
    assert diff[:own.start].max() == 0 and diff[own.stop:].max() == 0


def test_tied_replicate_head_uses_embeddings(lane_model):
    m = lane_model(lanes=2, tie_word_embeddings=True)
    assert "lm_head.weight" not in m.w
    x = lane_states(2, seed=5)
    torch.testing.assert_close(m.head(x), rms(x, m.w["model.norm.weight"]).mean(2)
                               @ m.w["model.tok_embeddings.weight"].T)


def test_forward_shapes_per_head(lane_model):
    for head in ("replicate", "lane", "vocab_parallel"):
        m = lane_model(lanes=2, lm_head_type=head)
        logits, hidden = m.forward(torch.tensor([[1, 2, 3, 4]]), return_hidden=True)
        assert logits.shape == (1, 4, V) and logits.dtype == torch.float32
        assert hidden.shape == (1, 4, 2, D)
