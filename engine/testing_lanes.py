"""Test fixture: a tiny random Laneformer lane checkpoint in the published layout (spec §2):
config.json (model_type "laneformer_tp") + model.safetensors with 3-D lane weights [L, out, in].

Weights are drawn at roughly unit-gain scale (std 1/sqrt(fan_in)) and norm gains around 1 so that
delayed and dense semantics give clearly different logits in tests.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch

from .lanes.config import LaneConfig
from .lanes.loader import expected_shapes


def tiny_lane_config(lanes: int = 2, **overrides) -> dict[str, Any]:
    """config.json dict of a tiny lane model; any key can be overridden (None deletes it)."""
    d: dict[str, Any] = {
        "architectures": ["LaneformerTPForCausalLM"],
        "model_type": "laneformer_tp",
        "vocab_size": 96,
        "hidden_size": 64,
        "num_hidden_layers": 4,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "intermediate_size": 128,
        "max_position_embeddings": 512,
        "rope_theta": 10000.0,
        "norm_eps": 1e-5,
        "eos_token_id": 2,
        "bos_token_id": 1,
        "tie_word_embeddings": False,
        "num_lanes": lanes,
        "broadcast_delay": 1,
        "use_comm": True,
        "use_early_comm": True,
        "lm_head_type": "replicate",
        "pre_norm_lane_agg": False,
        "replicated_rmsn_scale": True,
        "sliding_window": None,
        "sliding_window_n_layers": 0,
        "torch_dtype": "float32",
    }
    d.update(overrides)
    return {k: v for k, v in d.items() if v is not None}


def random_lane_weights(cfg: LaneConfig, seed: int = 0,
                        dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    out = {}
    for key, shape in expected_shapes(cfg).items():
        if key.endswith(("_norm.weight", "_norm.scale", "model.norm.weight", "model.norm.scale")):
            t = 1.0 + 0.2 * torch.randn(shape, generator=g)
        elif key == "model.tok_embeddings.weight":
            t = torch.randn(shape, generator=g)
        else:
            t = torch.randn(shape, generator=g) / math.sqrt(shape[-1] * (cfg.num_lanes
                                                                         if _is_column(key) else 1))
        out[key] = t.to(dtype).contiguous()
    return out


def _is_column(key: str) -> bool:
    # wo / w2 take 1/L of the dense input per lane: scale as for the full dense fan-in
    return key.endswith(("wo.weight", "w2.weight"))


def tokenizer_files(vocab_size: int = 256) -> tuple[str, dict, dict[str, int]]:
    """(tokenizer.json text, tokenizer_config.json dict, special token ids) of a tiny byte-level BPE tokenizer
    (engine/testing.py's, Llama-style specials) so that Engine.load can serve a lane checkpoint with prompts."""
    from .testing import _tokenizer_json
    tj = _tokenizer_json("llama", vocab_size)
    d = json.loads(tj)
    ids = {t["content"]: t["id"] for t in d["added_tokens"]}
    ids["<n_tok>"] = max(max(d["model"]["vocab"].values()), max(ids.values())) + 1
    tc = {"eos_token": "<|endoftext|>", "bos_token": "<|begin_of_text|>", "add_bos_token": True}
    return tj, tc, ids


def write_lane_checkpoint(dir: str | Path, config: dict[str, Any], weights: dict[str, torch.Tensor],
                          tokenizer: bool = False) -> Path:
    """config.json + model.safetensors (+ tokenizer files when `tokenizer`; config's vocab_size must cover them)."""
    from safetensors.torch import save_file
    path = Path(dir)
    path.mkdir(parents=True, exist_ok=True)
    if tokenizer:
        tj, tc, ids = tokenizer_files()
        if config["vocab_size"] < ids["<n_tok>"]:
            raise ValueError(f"vocab_size {config['vocab_size']} < tokenizer size {ids['<n_tok>']}")
        (path / "tokenizer.json").write_text(tj)
        (path / "tokenizer_config.json").write_text(json.dumps(tc, indent=2))
    (path / "config.json").write_text(json.dumps(config, indent=2))
    save_file({k: v.contiguous() for k, v in weights.items()}, str(path / "model.safetensors"),
              metadata={"format": "pt"})
    return path


def make_tiny_lane_checkpoint(dir: str | Path, lanes: int = 2, seed: int = 0,
                              dtype: torch.dtype = torch.float32, tokenizer: bool = False, **overrides) -> Path:
    """Write config.json + model.safetensors of a tiny random lane model into `dir`; return it.
    `overrides` are config.json keys (e.g. broadcast_delay=2, lm_head_type="vocab_parallel").
    tokenizer: also write a tiny tokenizer (vocab_size, bos / eos ids follow it unless overridden)."""
    if tokenizer:
        _, _, ids = tokenizer_files()
        overrides.setdefault("vocab_size", -(-ids["<n_tok>"] // lanes) * lanes)   # a vocab_parallel head needs L | V
        overrides.setdefault("eos_token_id", ids["<|endoftext|>"])
        overrides.setdefault("bos_token_id", ids["<|begin_of_text|>"])
    d = tiny_lane_config(lanes, **overrides)
    cfg = LaneConfig.from_dict(d)
    weights = random_lane_weights(cfg, seed=seed, dtype=dtype)
    return write_lane_checkpoint(dir, d, weights, tokenizer=tokenizer)
