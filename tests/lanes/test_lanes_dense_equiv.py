"""Lane reference vs HF transformers dense models (fp32, 1e-4).

(2) lanes=1 is a plain Llama whatever the reduce modes (√1 = 1, PAST adds nothing for one lane).
(3) lanes=2/4 with every layer PRESENT (use_early_comm, δ >= N) is the dense Llama whose weights
    are the reshaped lane weights: wq.reshape(-1, D), wo.permute(1, 0, 2).reshape(D, -1).
The dense state dicts are built here from the spec, independently of engine.lanes.to_dense_llama,
which is then checked against them.
"""

import pytest
import torch

from engine.lanes import to_dense_llama

TOL = 1e-4


def rope_perm(w, heads, hd):
    """Lane model rotates adjacent pairs (2k, 2k+1); HF Llama rotates (k, k + hd/2): reorder rows."""
    order = list(range(0, hd, 2)) + list(range(1, hd, 2))
    return w.reshape(heads, hd, -1)[:, order].reshape(heads * hd, -1)


def spec_dense_state_dict(cfg, w):
    D, hd = cfg.hidden_size, cfg.head_dim
    sd = {"model.embed_tokens.weight": w["model.tok_embeddings.weight"],
          "model.norm.weight": w["model.norm.weight"]}
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        a, f = p + "attention.", p + "feed_forward."
        sd[p + "self_attn.q_proj.weight"] = rope_perm(w[a + "wq.weight"].reshape(-1, D), cfg.num_heads, hd)
        sd[p + "self_attn.k_proj.weight"] = rope_perm(w[a + "wk.weight"].reshape(-1, D), cfg.num_kv_heads, hd)
        sd[p + "self_attn.v_proj.weight"] = w[a + "wv.weight"].reshape(-1, D)
        sd[p + "self_attn.o_proj.weight"] = w[a + "wo.weight"].permute(1, 0, 2).reshape(D, -1)
        sd[p + "mlp.gate_proj.weight"] = w[f + "w1.weight"].reshape(-1, D)
        sd[p + "mlp.up_proj.weight"] = w[f + "w3.weight"].reshape(-1, D)
        sd[p + "mlp.down_proj.weight"] = w[f + "w2.weight"].permute(1, 0, 2).reshape(D, -1)
        sd[p + "input_layernorm.weight"] = w[p + "attention_norm.weight"]
        sd[p + "post_attention_layernorm.weight"] = w[p + "ffn_norm.weight"]
    sd["lm_head.weight"] = w["lm_head.weight"]
    return sd


def hf_kwargs(cfg, **extra):
    return dict(vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size,
                intermediate_size=cfg.intermediate_size, num_hidden_layers=cfg.num_layers,
                num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_kv_heads,
                head_dim=cfg.head_dim, rms_norm_eps=cfg.norm_eps, rope_theta=cfg.rope_theta,
                max_position_embeddings=cfg.max_position_embeddings, tie_word_embeddings=False, **extra)


@pytest.mark.parametrize("delay,early", [(1, True), (1, False), (2, False), (9, True)])
def test_one_lane_is_plain_llama(lane_model, hf_logits, ids, delay, early):
    m = lane_model(lanes=1, broadcast_delay=delay, use_early_comm=early)
    ref = hf_logits(hf_kwargs(m.cfg), spec_dense_state_dict(m.cfg, m.w), ids)
    got = m(ids)
    assert got.shape == ref.shape == (2, 9, 96)
    torch.testing.assert_close(got, ref, atol=TOL, rtol=TOL)


def test_one_lane_swa_matches_mistral(lane_model, hf_logits, ids):
    """All layers SWA (W=3 < 9 tokens): the window semantics match HF's sliding-window mask."""
    m = lane_model(lanes=1, sliding_window=3, sliding_window_n_layers=4)
    assert m.cfg.swa_layers == (0, 1, 2, 3)
    ref = hf_logits(hf_kwargs(m.cfg, sliding_window=3), spec_dense_state_dict(m.cfg, m.w), ids,
                    arch="mistral")
    torch.testing.assert_close(m(ids), ref, atol=TOL, rtol=TOL)
    no_window = hf_logits(hf_kwargs(m.cfg), spec_dense_state_dict(m.cfg, m.w), ids)
    assert (no_window[:, 3:] - ref[:, 3:]).abs().max() > 1e-2   # the window really mattered


@pytest.mark.parametrize("lanes", [2, 4])
def test_all_present_equals_dense_llama(lane_model, hf_logits, ids, lanes):
    m = lane_model(lanes=lanes, broadcast_delay=4, use_early_comm=True, seed=lanes)
    sd = spec_dense_state_dict(m.cfg, m.w)
    ref = hf_logits(hf_kwargs(m.cfg), sd, ids)
    collect = []
    got = m.forward(ids, collect=collect)
    torch.testing.assert_close(got, ref, atol=TOL, rtol=TOL)
    # while every layer is PRESENT the lane streams stay identical
    for x in collect:
        assert torch.equal(x, x[:, :, :1].expand_as(x))
    # the package's converter builds the same dense model
    kw, sd2 = to_dense_llama(m.cfg, m.w)
    assert sd2.keys() == sd.keys()
    for k in sd:
        assert torch.equal(sd[k], sd2[k]), k
    assert kw == hf_kwargs(m.cfg, attention_bias=False, mlp_bias=False)


@pytest.mark.parametrize("head", ["vocab_parallel", "lane"])
def test_all_present_other_heads_equal_dense(lane_model, hf_logits, ids, head):
    """Identical streams: a vocab_parallel head is the row-stacked dense head, a lane head the sum
    of its L column blocks."""
    m = lane_model(lanes=2, broadcast_delay=4, lm_head_type=head, seed=3)
    kw, sd = to_dense_llama(m.cfg, m.w)
    torch.testing.assert_close(m(ids), hf_logits(kw, sd, ids), atol=TOL, rtol=TOL)


def test_delay_changes_the_model(lane_model, hf_logits, ids):
    """Sanity for the tests above: the same weights with δ=1 are not the dense model."""
    m = lane_model(lanes=2, broadcast_delay=1)
    kw, sd = to_dense_llama(m.cfg, m.w)
    assert (m(ids) - hf_logits(kw, sd, ids)).abs().max() > 0.05
