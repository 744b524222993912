import json

import pytest

from engine.config import PRESETS, ModelConfig, preset


def _llama(**kw):
    d = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 100, "hidden_size": 64,
         "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128,
         "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "tie_word_embeddings": True, "bos_token_id": 1,
         "eos_token_id": [2, 3]}
    d.update(kw)
    return d


def test_llama_fields():
    c = ModelConfig.from_hf_dict(_llama())
    assert (c.arch, c.n_heads, c.n_kv_heads, c.head_dim) == ("llama", 4, 2, 16)
    assert c.rope_theta == 500000.0 and c.rope_scaling is None
    assert c.tie_word_embeddings and not c.qkv_bias and not c.o_bias
    assert c.bos_token_id == 1 and c.eos_token_ids == (2, 3)


def test_llama_attention_bias_and_head_dim_override():
    c = ModelConfig.from_hf_dict(_llama(attention_bias=True, head_dim=32))
    assert c.qkv_bias and c.o_bias and c.head_dim == 32 and c.q_dim == 128


def test_qwen_has_qkv_bias_and_rope_parameters_key():
    hf = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "vocab_size": 100, "hidden_size": 64,
          "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 1, "intermediate_size": 96,
          "rope_parameters": {"rope_theta": 1e6, "rope_type": "default"}, "eos_token_id": 7}
    c = ModelConfig.from_hf_dict(hf)
    assert c.arch == "qwen2" and c.qkv_bias and not c.o_bias and c.rope_theta == 1e6 and c.eos_token_ids == (7,)


@pytest.mark.parametrize("where", ["rope_scaling", "rope_parameters"])
def test_llama3_rope_scaling(where):
    sc = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 8192}
    if where == "rope_parameters":
        sc = dict(sc, rope_theta=500000.0)
    c = ModelConfig.from_hf_dict(_llama(**{where: sc}))
    assert c.rope_scaling["factor"] == 32.0 and c.rope_scaling["original_max_position_embeddings"] == 8192


def test_errors_name_the_problem(tmp_path):
    with pytest.raises(ValueError, match="GPT2LMHeadModel"):
        ModelConfig.from_hf_dict(_llama(architectures=["GPT2LMHeadModel"], model_type="gpt2"))
    bad = _llama()
    del bad["intermediate_size"]
    with pytest.raises(ValueError, match="intermediate_size"):
        ModelConfig.from_hf_dict(bad)
    with pytest.raises(ValueError, match="rope_type"):
        ModelConfig.from_hf_dict(_llama(rope_scaling={"rope_type": "yarn", "factor": 4.0}))
    with pytest.raises(ValueError, match="high_freq_factor"):
        ModelConfig.from_hf_dict(_llama(rope_scaling={"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0,
                                                      "original_max_position_embeddings": 64}))
    with pytest.raises(ValueError, match="config.json"):
        ModelConfig.from_json(tmp_path)


def test_roundtrip_json(tmp_path):
    c = preset("llama-3.2-1b")
    (tmp_path / "config.json").write_text(json.dumps(c.to_hf_dict()))
    c2 = ModelConfig.from_json(tmp_path)
    assert c2.rope_scaling == c.rope_scaling and c2.head_dim == 64 and c2.eos_token_ids == c.eos_token_ids


def test_presets():
    q = preset("qwen2.5-coder-0.5b")
    assert (q.n_layers, q.hidden_size, q.n_heads, q.n_kv_heads, q.head_dim, q.intermediate_size) == (24, 896, 14, 2,
                                                                                                      64, 4864)
    assert 0.49e9 < q.n_params() < 0.50e9   # Qwen2.5-0.5B has 494M parameters
    ll = preset("llama-3.2-1b")
    assert 1.23e9 < ll.n_params() < 1.24e9  # Llama-3.2-1B: 1.236B
    assert PRESETS["qwen2.5-coder-1.5b"].head_dim == 128
    assert 3.08e9 < preset("qwen2.5-coder-3b").n_params() < 3.10e9   # Qwen2.5-3B: 3.09B
    assert 7.6e9 < preset("qwen2.5-coder-7b").n_params() < 7.62e9    # Qwen2.5-7B: 7.61B (untied LM head)
    with pytest.raises(ValueError, match="unknown preset"):
        preset("nope")
