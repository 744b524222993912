"""Shared fixtures for the Laneformer lane reference tests (CPU, fp32, tiny random checkpoints)."""

import pytest
import torch

from engine.lanes import load_lane_checkpoint
from engine.testing_lanes import make_tiny_lane_checkpoint


@pytest.fixture
def lane_model(tmp_path):
    """Factory: lane_model(lanes=2, seed=0, **config_overrides) -> LaneModel loaded from disk."""
    count = [0]

    def make(lanes=2, seed=0, **overrides):
        count[0] += 1
        d = make_tiny_lane_checkpoint(tmp_path / f"ckpt{count[0]}", lanes=lanes, seed=seed, **overrides)
        return load_lane_checkpoint(d)
    return make


@pytest.fixture
def hf_logits():
    """hf_logits(config_kwargs, state_dict, ids, arch='llama') -> fp32 logits of an HF model."""
    def run(kwargs, sd, ids, arch="llama"):
        from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM
        cfg_cls, model_cls = (LlamaConfig, LlamaForCausalLM) if arch == "llama" else \
            (MistralConfig, MistralForCausalLM)
        model = model_cls(cfg_cls(**kwargs, attn_implementation="eager")).eval()
        res = model.load_state_dict(sd, strict=False)
        assert not res.unexpected_keys, res.unexpected_keys
        # HF may register non-persistent buffers only; every parameter must come from sd
        assert not [k for k in res.missing_keys if "rotary" not in k], res.missing_keys
        with torch.no_grad():
            return model(torch.as_tensor(ids)).logits.float()
    return run


@pytest.fixture
def ids():
    return torch.randint(0, 96, (2, 9), generator=torch.Generator().manual_seed(7))
