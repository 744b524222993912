"""Model's CPU decode path (T == 1, fp32: Model._decode_one) against the general forward, and the [in, out]
CPU weight layout behind both."""
import pytest
import torch

from engine.config import ModelConfig
from engine.kv_cache import KVCache
from engine.model import Model


def _cfg(arch, **kw):
    base = dict(arch=arch, vocab_size=96, hidden_size=48, n_layers=2, n_heads=4, n_kv_heads=2, intermediate_size=80,
                head_dim=12, qkv_bias=arch == "qwen2", tie_word_embeddings=True, rms_norm_eps=1e-6,
                rope_theta=10000.0)
    base.update(kw)
    return ModelConfig(**base)


@pytest.mark.parametrize("cfg", [_cfg("qwen2"), _cfg("llama", n_kv_heads=4),
                                 _cfg("llama", qkv_bias=True, o_bias=True, mlp_bias=True, tie_word_embeddings=False,
                                      n_kv_heads=1)], ids=["qwen2-gqa", "llama-mha", "llama-biases-untied"])
def test_decode_steps_match_full_forward(cfg):
    m = Model(cfg, max_len=32).init_random(seed=1, std=0.2)
    ids = torch.randint(0, cfg.vocab_size, (20,), generator=torch.Generator().manual_seed(0))
    full = KVCache(2, cfg.n_layers, cfg.n_kv_heads, 32, cfg.head_dim)
    step = KVCache(2, cfg.n_layers, cfg.n_kv_heads, 32, cfg.head_dim)
    step.k.fill_(float("nan"))   # an unwritten position read by the decode path would show up as NaN
    step.v.fill_(float("nan"))
    want = m.forward(full.k, full.v, 1, ids, 0, all_logits=True)          # [20, V], the T > 1 path
    m.forward(step.k, step.v, 1, ids[:12], 0)
    for p in range(12, 20):
        got = m.forward(step.k, step.v, 1, ids[p:p + 1], p)                 # [V], the decode path
        assert got.shape == (cfg.vocab_size,) and torch.isfinite(got).all()
        assert torch.allclose(got, want[p], atol=1e-5, rtol=0), p
        assert torch.equal(got.argmax(), want[p].argmax())
    assert m.forward(step.k, step.v, 1, ids[19:20], 19, all_logits=True).shape == (1, cfg.vocab_size)
    assert torch.allclose(step.k[1, :, :, :20], full.k[1, :, :, :20], atol=1e-5, rtol=0)
    assert torch.allclose(step.v[1, :, :, :20], full.v[1, :, :, :20], atol=1e-5, rtol=0)
    assert torch.isnan(step.k[0]).all() and torch.isnan(step.k[1, :, :, 20:]).all()


def test_cpu_weights_are_stored_in_out_but_keep_hf_shapes():
    cfg = _cfg("qwen2")
    m = Model(cfg, max_len=8)
    q = m.params["model.layers.0.self_attn.q_proj.weight"]
    assert q.shape == (cfg.q_dim, cfg.hidden_size)                     # HF [out, in] shape for loading
    assert m.layers[0].wqkv.t().is_contiguous()                        # stored [in, out]: x @ W_t streams rows
    assert m.lm_head.t().is_contiguous() and m.lm_head is m.embed
    q.copy_(torch.arange(q.numel(), dtype=torch.float32).view_as(q))  # loading writes through the view
    assert torch.equal(m.layers[0].wqkv[:cfg.q_dim], q)
