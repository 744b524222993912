"""Small Qwen2- and Llama-shaped configs the GPU backend tests share."""
from engine.config import ModelConfig

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
