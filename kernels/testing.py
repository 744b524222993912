"""Random-weight models on the GPU for kernel tests and benchmarks (speed does not depend on the values)."""
from __future__ import annotations

import torch

from engine.config import ModelConfig
from engine.model import Model


def random_model(cfg, device="cuda", dtype=torch.bfloat16, max_len: int = 1024, seed: int = 0,
                 std: float = 0.02) -> Model:
    """Weights drawn on the device (seconds, not minutes, for 1.5B parameters); norms near 1, never zeros."""
    m = Model(cfg, device=device, dtype=dtype, max_len=max_len)
    g = torch.Generator(device=device).manual_seed(seed)
    for name, t in m.params.items():
        if name.endswith("norm.weight"):
            t.uniform_(0.8, 1.2, generator=g)
        else:  # matrices and biases alike
            t.normal_(0.0, std, generator=g)
    return m


def upcast(model: Model, dtype=torch.float32) -> Model:
    """The same weights in `dtype` (the fp32 reference of a bf16 model)."""
    ref = Model(model.cfg, device=model.device, dtype=dtype, max_len=model.max_len)
    for name, t in ref.params.items():
        t.copy_(model.params[name].to(dtype))
    return ref


# ---- tiny CPU models for the twin tests (any head_dim; the CUDA kernel itself needs 64 or 128) ----
def tiny_cfg(arch="qwen2", **kw) -> ModelConfig:
    base = dict(arch=arch, vocab_size=200, hidden_size=64, n_layers=2, n_heads=4, n_kv_heads=2,
                intermediate_size=96, head_dim=16, qkv_bias=(arch == "qwen2"), tie_word_embeddings=True,
                rms_norm_eps=1e-6, rope_theta=10000.0)
    base.update(kw)
    return ModelConfig(**base)


def tiny_model(cfg: ModelConfig, seed=0, max_len=64) -> Model:
    # std 0.2: large enough that attention is not uniform and logits differ clearly between tokens.
    return Model(cfg, max_len=max_len).init_random(seed=seed, std=0.2)


def fresh_cache(cfg, max_len=64, slots=2):
    """fp32 KV [slots, L, kvh, max_len, hd] poisoned with NaN: a read of an unwritten position shows up."""
    shape = (slots, cfg.n_layers, cfg.n_kv_heads, max_len, cfg.head_dim)
    return torch.full(shape, float("nan")), torch.full(shape, float("nan"))
