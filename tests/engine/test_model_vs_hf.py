"""The reference model against HF transformers on small random checkpoints (fp32, max abs diff <= 1e-4)."""
import pytest
import torch

from engine.config import ModelConfig
from engine.kv_cache import KVCache
from engine.loader import load_model
from engine.testing import make_tiny_checkpoint

transformers = pytest.importorskip("transformers")

LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 16, "rope_theta": 500000.0}

CASES = {
    "qwen2": dict(cls="Qwen2", kw=dict(tie_word_embeddings=True)),
    "qwen2-untied-sharded": dict(cls="Qwen2", kw=dict(tie_word_embeddings=False), shard="20KB"),
    "llama": dict(cls="Llama", kw=dict(tie_word_embeddings=False)),
    "llama-tied-llama3-rope": dict(cls="Llama", kw=dict(tie_word_embeddings=True, rope_parameters=LLAMA3_ROPE)),
    "llama-head-dim-bias": dict(cls="Llama", kw=dict(head_dim=24, attention_bias=True, tie_word_embeddings=False)),
}


def _hf_checkpoint(tmp_path, case, seed=0):
    spec = CASES[case]
    cfg_cls = getattr(transformers, spec["cls"] + "Config")
    model_cls = getattr(transformers, spec["cls"] + "ForCausalLM")
    kw = dict(vocab_size=97, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              intermediate_size=96, max_position_embeddings=256, rms_norm_eps=1e-6)
    kw.update(spec["kw"])
    torch.manual_seed(seed)
    hf = model_cls(cfg_cls(**kw)).eval()
    with torch.no_grad():
        # Larger than HF's 0.02 init so logits are far from uniform and a wrong op shows.
        for name, p in hf.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.1 * torch.randn_like(p))
            else:
                p.normal_(0, 0.1)
    d = tmp_path / case
    hf.save_pretrained(d, safe_serialization=True, **({"max_shard_size": spec["shard"]} if "shard" in spec else {}))
    return hf, d


@pytest.mark.parametrize("case", list(CASES))
def test_prefill_and_decode_match_hf(tmp_path, case):
    hf, d = _hf_checkpoint(tmp_path, case)
    if case.endswith("sharded"):
        assert (d / "model.safetensors.index.json").exists()
    model = load_model(d, max_len=64)
    cfg = model.cfg
    cache = KVCache(2, cfg.n_layers, cfg.n_kv_heads, 64, cfg.head_dim)
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, cfg.vocab_size, (40,), generator=g)
    with torch.no_grad():
        ref = hf(ids[None]).logits[0].float()               # [40, V]
    # Prefill 30 tokens (all logits), then decode 10 single tokens, teacher-forced.
    out = model.forward(cache.k, cache.v, 1, ids[:30], 0, all_logits=True)
    assert (out - ref[:30]).abs().max().item() <= 1e-4
    for t in range(30, 40):
        step = model.forward(cache.k, cache.v, 1, ids[t:t + 1], t)
        assert (step - ref[t]).abs().max().item() <= 1e-4, t
    # Prefill in two uneven chunks (the prefix-reuse path) gives the same logits.
    model.forward(cache.k, cache.v, 0, ids[:17], 0)
    tail = model.forward(cache.k, cache.v, 0, ids[17:40], 17, all_logits=True)
    assert (tail - ref[17:40]).abs().max().item() <= 1e-4


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_tiny_checkpoint_loads_in_hf(tmp_path, arch):
    d = make_tiny_checkpoint(tmp_path / arch, arch=arch, seed=5,
                             rope_scaling=None if arch == "qwen2" else
                             {k: v for k, v in LLAMA3_ROPE.items() if k != "rope_theta"})
    hf = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
    model = load_model(d, max_len=32)
    cfg = model.cfg
    cache = KVCache(1, cfg.n_layers, cfg.n_kv_heads, 32, cfg.head_dim)
    ids = torch.randint(0, cfg.vocab_size, (24,), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = hf(ids[None]).logits[0]
    out = model.forward(cache.k, cache.v, 0, ids, 0, all_logits=True)
    assert ref.std() > 0.1   # random weights large enough that the comparison means something
    assert (out - ref).abs().max().item() <= 1e-4


def test_config_from_hf_save(tmp_path):
    hf, d = _hf_checkpoint(tmp_path, "llama-tied-llama3-rope")
    c = ModelConfig.from_json(d)
    assert c.rope_scaling["factor"] == 8.0 and c.tie_word_embeddings and c.arch == "llama"
