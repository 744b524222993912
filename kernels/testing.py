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


def twin_schedule_error(model: Model, sched, ids_seed: int, order_seed: int, attn_min_pos: int = 2) -> float:
    """Largest relative L2 error of the CPU twin running `sched` on `model` (a tiny_model), against the reference
    model, over 5 teacher-forced steps after a 9-token prompt drawn with ids_seed (the schedule experiments of
    bench/experiments check their re-placed schedules with it)."""
    from engine.model import rope_inv_freq
    from .twin import Twin
    cfg = model.cfg
    ids = torch.randint(0, cfg.vocab_size, (14,), generator=torch.Generator().manual_seed(ids_seed)).tolist()
    prompt, forced = ids[:9], ids[9:]
    k_ref, v_ref = fresh_cache(cfg, slots=2)
    model.forward(k_ref, v_ref, 1, torch.tensor(prompt), 0)
    k_tw, v_tw = k_ref.clone(), v_ref.clone()
    ref = torch.stack([model.forward(k_ref, v_ref, 1, torch.tensor([t]), len(prompt) + j)
                       for j, t in enumerate(forced)])
    res = Twin(model, sched, rope_inv_freq(cfg)).run(k_tw, v_tw, 1, forced[0], len(prompt), len(forced),
                                                      forced=forced, order_seed=order_seed, attn_min_pos=attn_min_pos)
    return max(((res.logits[s] - ref[s]).norm() / ref[s].norm()).item() for s in range(len(forced)))


# ---- delayed mode: random Laneformer lane models of a dense shape (tests/gpu/test_tp_delayed.py, bench/tp.py) ----
def lane_config_like(cfg, lanes: int, **kw):
    """engine.lanes LaneConfig with the dense ModelConfig `cfg`'s sizes (per-lane weights are 1/lanes of the dense
    ones: the same bytes streamed in all). kw: config.json keys (broadcast_delay, use_early_comm, lm_head_type ...)
    and early_queue."""
    from engine.lanes import LaneConfig
    d = {"model_type": "laneformer_tp", "vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden_size,
         "num_hidden_layers": cfg.n_layers, "num_attention_heads": cfg.n_heads,
         "num_key_value_heads": cfg.n_kv_heads, "head_dim": cfg.head_dim,
         "intermediate_size": cfg.intermediate_size, "num_lanes": lanes, "rope_theta": cfg.rope_theta,
         "norm_eps": cfg.rms_norm_eps, "max_position_embeddings": cfg.max_position_embeddings,
         "tie_word_embeddings": False, "broadcast_delay": 1, "lm_head_type": "replicate"}
    overrides = {"early_queue": kw.pop("early_queue")} if "early_queue" in kw else {}   # A1: a LaneConfig switch
    if cfg.rope_scaling:   # llama3-style keys, as engine/lanes/config.py reads them
        d["rope_scaling"] = dict(cfg.rope_scaling)
    d.update(kw)
    return LaneConfig.from_dict(d, **overrides)


def random_lane_weights_on(cfg, device="cuda", dtype=torch.bfloat16, seed: int = 0, std: float = 0.02) -> dict:
    """Lane weights (published layout) drawn on the device: matrices N(0, std), norm gains U(0.8, 1.2)."""
    from engine.lanes import expected_shapes
    g = torch.Generator(device=device).manual_seed(seed)
    out = {}
    for key, shape in expected_shapes(cfg).items():
        t = torch.empty(shape, device=device, dtype=dtype)
        if key.endswith((".weight", ".scale")) and "norm" in key:
            t.uniform_(0.8, 1.2, generator=g)
        else:
            t.normal_(0.0, std, generator=g)
        out[key] = t
    return out
