"""Small Qwen2- and Llama-shaped configs and the model / cache / error helpers the GPU backend tests share."""
import torch

from engine.config import ModelConfig
from engine.kv_cache import KVCache
from engine.model import Model

SHAPES = {
    "qwen": ModelConfig(arch="qwen2", vocab_size=4096, hidden_size=512, n_layers=4, n_heads=8, n_kv_heads=2,
                        intermediate_size=1408, head_dim=64, rope_theta=1e6, tie_word_embeddings=True,
                        qkv_bias=True, name="qwen-small"),
    "llama": ModelConfig(arch="llama", vocab_size=4096, hidden_size=512, n_layers=4, n_heads=8, n_kv_heads=4,
                         intermediate_size=1536, head_dim=64, rms_norm_eps=1e-5, rope_theta=500000.0,
                         rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                       "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
                         tie_word_embeddings=False, name="llama-small"),
}


def paired_models(cfg: ModelConfig, seed: int, max_len: int, norm_jitter: bool = False) -> tuple[Model, Model]:
    """A bf16 model on the GPU and an fp32 one holding exactly the same (upcast) weights. HF init scale (a larger
    std amplifies bf16 rounding); norm_jitter perturbs the norm weights so they are not all ones."""
    dev = torch.device("cuda")
    src = Model(cfg, "cpu", torch.float32, max_len).init_random(seed, std=0.02)
    if norm_jitter:
        for name, t in src.params.items():
            if name.endswith("norm.weight"):
                t.add_(0.05 * torch.randn(t.shape, generator=torch.Generator().manual_seed(seed + 1)))
    fast = Model(cfg, dev, torch.bfloat16, max_len)
    ref = Model(cfg, dev, torch.float32, max_len)
    for name, t in src.params.items():
        fast.params[name].copy_(t)
        ref.params[name].copy_(fast.params[name].float())
    return fast, ref


def poisoned_cache(cfg: ModelConfig, dtype, max_len: int, slots: int) -> KVCache:
    """A CUDA KV cache full of NaN: any read of an unwritten position shows up in the results."""
    c = KVCache(slots, cfg.n_layers, cfg.n_kv_heads, max_len, cfg.head_dim, dtype=dtype, device="cuda")
    c.k.fill_(float("nan"))
    c.v.fill_(float("nan"))
    return c


def rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()
