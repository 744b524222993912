"""(1) Lane checkpoint loader and config: every key present with the shape config.json implies,
divisibility checks, clear errors for missing / mis-shaped tensors, A2/A5 key handling, and the
tp_mode / checkpoint-kind guard."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine.lanes import (LaneCheckpointError, LaneConfig, LaneConfigError, TPModeError, check_tp_mode,
                          checkpoint_kind, expected_shapes, load_lane_checkpoint, read_tensors,
                          rope_frequencies)
from engine.testing_lanes import make_tiny_lane_checkpoint, tiny_lane_config


@pytest.mark.parametrize("lanes,head,replicated", [
    (2, "replicate", True), (4, "vocab_parallel", True), (2, "lane", False), (1, "replicate", False)])
def test_every_key_present_with_config_shapes(tmp_path, lanes, head, replicated):
    d = make_tiny_lane_checkpoint(tmp_path, lanes=lanes, lm_head_type=head,
                                  replicated_rmsn_scale=replicated)
    stored = load_file(str(d / "model.safetensors"))
    cfg = LaneConfig.from_json(d)
    exp = expected_shapes(cfg)
    assert set(stored) == set(exp)
    L, D, V = lanes, 64, 96
    assert len(exp) == 1 + 4 * 9 + 1 + 1
    assert exp["model.layers.3.attention.wq.weight"] == (L, 64 // L, D)          # Hq=8, hd=8
    assert exp["model.layers.3.attention.wk.weight"] == (L, 32 // L, D)          # Hkv=4
    assert exp["model.layers.0.attention.wo.weight"] == (L, D, 64 // L)
    assert exp["model.layers.0.feed_forward.w2.weight"] == (L, D, 128 // L)
    assert exp["model.layers.0.feed_forward.w1.weight"] == (L, 128 // L, D)
    gain = "model.layers.1.ffn_norm." + ("weight" if replicated else "scale")
    assert exp[gain] == ((D,) if replicated else (L, D))
    head_shape = {"replicate": (V, D), "lane": (V, L * D), "vocab_parallel": (L, V // L, D)}[head]
    head_key = "lm_head.linear.weight" if head == "lane" else "lm_head.weight"
    assert exp[head_key] == head_shape
    for k, t in stored.items():
        assert tuple(t.shape) == exp[k], k
    m = load_lane_checkpoint(d)
    assert m(torch.tensor([1, 2, 3])).shape == (3, V)


def test_missing_tensor_is_named(tmp_path):
    d = make_tiny_lane_checkpoint(tmp_path)
    w = load_file(str(d / "model.safetensors"))
    del w["model.layers.2.feed_forward.w3.weight"], w["lm_head.weight"]
    save_file(w, str(d / "model.safetensors"))
    with pytest.raises(LaneCheckpointError, match=r"2 missing tensor\(s\).*model\.layers\.2\."
                                                  r"feed_forward\.w3\.weight.*lm_head\.weight"):
        load_lane_checkpoint(d)


def test_misshaped_tensor_is_named_with_shapes(tmp_path):
    d = make_tiny_lane_checkpoint(tmp_path, lanes=2)
    w = load_file(str(d / "model.safetensors"))
    # a dense (2-D) wo instead of the lane layout, and a transposed lane wq
    w["model.layers.0.attention.wo.weight"] = torch.zeros(64, 64)
    w["model.layers.1.attention.wq.weight"] = w["model.layers.1.attention.wq.weight"].transpose(1, 2).contiguous()
    save_file(w, str(d / "model.safetensors"))
    with pytest.raises(LaneCheckpointError) as e:
        load_lane_checkpoint(d)
    msg = str(e.value)
    assert "model.layers.0.attention.wo.weight: expected [2, 64, 32], got [64, 64]" in msg
    assert "model.layers.1.attention.wq.weight: expected [2, 32, 64], got [2, 64, 32]" in msg
    assert "L=2" in msg


def test_config_with_wrong_lane_count_fails_on_shapes(tmp_path):
    d = make_tiny_lane_checkpoint(tmp_path, lanes=2)
    cfg = json.loads((d / "config.json").read_text())
    cfg["num_lanes"] = 4
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(LaneCheckpointError, match="shape that disagrees with config.json"):
        load_lane_checkpoint(d)


def test_sharded_checkpoint_loads(tmp_path):
    d = make_tiny_lane_checkpoint(tmp_path / "a", lanes=2)
    w = load_file(str(d / "model.safetensors"))
    keys = sorted(w)
    half = len(keys) // 2
    s = tmp_path / "sharded"
    s.mkdir()
    (s / "config.json").write_text((d / "config.json").read_text())
    shards = {"model-00001-of-00002.safetensors": keys[:half], "model-00002-of-00002.safetensors": keys[half:]}
    for name, ks in shards.items():
        save_file({k: w[k] for k in ks}, str(s / name))
    (s / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {k: n for n, ks in shards.items() for k in ks}}))
    got = read_tensors(s)
    assert got.keys() == w.keys() and all(torch.equal(got[k], w[k]) for k in w)
    ids = torch.tensor([5, 6, 7])
    torch.testing.assert_close(load_lane_checkpoint(s)(ids), load_lane_checkpoint(d)(ids))


@pytest.mark.parametrize("overrides,pattern", [
    (dict(num_lanes=3), "num_lanes 3 does not divide num_attention_heads 8"),
    (dict(num_lanes=8), "num_lanes 8 does not divide num_key_value_heads 4"),
    (dict(num_lanes=2, intermediate_size=129), "does not divide intermediate_size 129"),
    (dict(num_lanes=4, vocab_size=90, lm_head_type="vocab_parallel"), r"vocab_size \(vocab_parallel head\) 90"),
    (dict(hidden_size=None), "lacks required key.*hidden_size"),
    (dict(num_lanes=None), "lacks required key.*num_lanes"),
    (dict(model_type="llama"), "not a Laneformer lane checkpoint"),
    (dict(lm_head_type="tied"), "lm_head_type 'tied'"),
    (dict(lm_head_type="lane", pre_norm_lane_agg=True), "pre_norm_lane_agg is only defined"),
    (dict(broadcast_delay=0), "delay must be >= 1"),
    (dict(num_hidden_layers="4"), "must be an integer"),
    (dict(sliding_window=4, swa_layers=[0, 7]), r"swa_layers \[7\] outside"),
    (dict(rope_scaling={"rope_type": "yarn", "factor": 4.0}), "not supported"),
])
def test_config_errors_are_clear(overrides, pattern):
    with pytest.raises(LaneConfigError, match=pattern):
        LaneConfig.from_dict(tiny_lane_config(**overrides))


def test_swa_key_precedence():
    base = dict(sliding_window=16)
    assert LaneConfig.from_dict(tiny_lane_config(**base, sliding_window_n_layers=2)).swa_layers == (0, 1)
    assert LaneConfig.from_dict(tiny_lane_config(**base, sliding_window_n_layers=-1)).swa_layers == (3,)
    assert LaneConfig.from_dict(tiny_lane_config(**base, sliding_window_n_layers=3, swa_layers=[1, 3],
                                                 unclamped_layers=[3])).swa_layers == (1,)
    assert LaneConfig.from_dict(tiny_lane_config(sliding_window_n_layers=2)).swa_layers == ()   # no window


def test_rope_scaling_matches_hf_llama3():
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    scaling = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 256}
    cfg = LaneConfig.from_dict(tiny_lane_config(num_attention_heads=4, num_key_value_heads=4,
                                                rope_scaling={"rope_type": "llama3", **scaling}))
    hf = LlamaConfig(hidden_size=64, num_attention_heads=4, head_dim=16,
                     rope_parameters={"rope_type": "llama3", "rope_theta": 10000.0, **scaling})
    ref, _ = ROPE_INIT_FUNCTIONS["llama3"](hf, None)
    torch.testing.assert_close(rope_frequencies(cfg), ref)
    # TorchTitan-style key name and the off switch (A2)
    titan = LaneConfig.from_dict(tiny_lane_config(num_attention_heads=4, num_key_value_heads=4,
                                                  rope_scaling_args={"scaling_factor": 8.0, **{
                                                      k: v for k, v in scaling.items() if k != "factor"}}))
    torch.testing.assert_close(rope_frequencies(titan), ref)
    off = cfg.with_overrides(rope_scaling=None)
    plain = 1.0 / (10000.0 ** (torch.arange(0, 16, 2).float() / 16))
    torch.testing.assert_close(rope_frequencies(off), plain)


def test_overrides_for_ambiguity_switches(tmp_path):
    d = make_tiny_lane_checkpoint(tmp_path, broadcast_delay=2, use_early_comm=True)
    m = load_lane_checkpoint(d, early_queue=False, use_early_comm=False)
    assert not m.cfg.early_queue and not m.cfg.use_early_comm
    with pytest.raises(LaneConfigError, match="unknown LaneConfig override"):
        load_lane_checkpoint(d, early_queu=False)


def test_check_tp_mode(tmp_path):
    lane_dir = make_tiny_lane_checkpoint(tmp_path / "lane", lanes=2)
    assert checkpoint_kind(lane_dir) == "lane"
    assert checkpoint_kind(lane_dir / "config.json") == "lane"
    assert checkpoint_kind({"model_type": "qwen2"}) == "dense"
    check_tp_mode("lane", "delayed")
    check_tp_mode("lane", "delayed", tp=2, num_lanes=2)
    check_tp_mode("lane", "delayed", tp=1, num_lanes=2)        # all lanes on one device
    check_tp_mode("dense", "exact", tp=2)
    with pytest.raises(TPModeError, match=r"ordinary checkpoint.*Use tp_mode='exact'"):
        check_tp_mode("dense", "delayed")
    with pytest.raises(TPModeError, match=r"lane checkpoint.*Use tp_mode='delayed'"):
        check_tp_mode("lane", "exact")
    with pytest.raises(TPModeError, match="trained for 2 lanes; tp=4"):
        check_tp_mode("lane", "delayed", tp=4, num_lanes=2)
    with pytest.raises(TPModeError, match="unknown tp_mode"):
        check_tp_mode("lane", "fast")
