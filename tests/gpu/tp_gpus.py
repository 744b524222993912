"""The tensor-parallel size the tests/gpu/test_tp_*.py tests run at: KOG_TEST_TP GPUs (default 2), cuda:0 .. TP-1,
all sm_90, else the tests skip. Also the lane shapes whose heads / FFN width / vocabulary TP lanes divide.

Device run at 4 ranks: KOG_TEST_TP=4 NCCL_NVLS_ENABLE=0 python3 -m pytest -q -s tests/gpu/test_tp_*.py"""
from __future__ import annotations

import os

import pytest
import torch
from shapes import SHAPES  # tests/gpu is on sys.path under pytest

ENV = "KOG_TEST_TP"
BIG_LANE_PRESETS = ("qwen2.5-coder-1.5b", "llama-3.2-1b")   # engine.config presets, first that TP lanes divide


def tp_from_env(env=os.environ) -> int:
    raw = env.get(ENV, "").strip() or "2"
    try:
        tp = int(raw)
    except ValueError:
        tp = 0
    if tp < 2:
        raise ValueError(f"{ENV}={raw!r}: the tensor-parallel test size must be an integer >= 2")
    return tp


def skip_reason(tp: int) -> str | None:
    """Why the TP tests cannot run here, or None when cuda:0 .. tp-1 exist and are all sm_90."""
    need = f"needs {tp} sm_90 (Hopper) CUDA GPUs ({ENV}={tp})"
    if not torch.cuda.is_available():
        return f"{need}: torch has no CUDA"
    n = torch.cuda.device_count()
    if n < tp:
        return f"{need}: {n} visible"
    caps = [torch.cuda.get_device_capability(i) for i in range(tp)]
    if any(c != (9, 0) for c in caps):
        return f"{need}: compute capabilities {caps}"
    return None


TP = tp_from_env()
DEVS = [torch.device(f"cuda:{i}") for i in range(TP)]
SKIP_REASON = skip_reason(TP)
needs_tp_gpus = pytest.mark.skipif(SKIP_REASON is not None, reason=SKIP_REASON or "")


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def small_lane_shape(tp: int):
    """SHAPES['llama'] (8 q heads over 4 KV heads, head_dim 64) widened until `tp` lanes divide its KV heads, its FFN
    width in 8-channel cuts (kernels/tp_local.py FFN_ALIGN) and its vocabulary (a vocab_parallel head). The same
    config for 2 and 4 lanes; for 8, 16 q heads over 8 KV heads and hidden 1024 (the GQA group and head_dim stay:
    the kernel has head_dim 64 and 128 only)."""
    cfg = SHAPES["llama"]
    kv = _round_up(cfg.n_kv_heads, tp)
    ffn = _round_up(cfg.intermediate_size, 8 * tp)
    vocab = _round_up(cfg.vocab_size, tp)
    if (kv, ffn, vocab) == (cfg.n_kv_heads, cfg.intermediate_size, cfg.vocab_size):
        return cfg
    heads = kv * (cfg.n_heads // cfg.n_kv_heads)
    return cfg.replace(n_kv_heads=kv, n_heads=heads, hidden_size=heads * cfg.head_dim, intermediate_size=ffn,
                       vocab_size=vocab, name=f"{cfg.name}-{tp}-lanes")


def big_lane_preset(tp: int, names=BIG_LANE_PRESETS, **lane_kw) -> str:
    """The first preset whose lane config (kernels.testing.lane_config_like) `tp` lanes divide and the delayed-mode
    kernel accepts (kernels.tp_local.lane_plan)."""
    from engine.config import preset
    from kernels.testing import lane_config_like
    from kernels.tp_local import lane_plan
    why = []
    for name in names:
        try:
            lane_plan(lane_config_like(preset(name), tp, **lane_kw), tp)
            return name
        except ValueError as e:   # LaneConfigError, ShardError
            why.append(f"{name}: {e}")
    raise ValueError(f"no lane preset for {tp} lanes: " + "; ".join(why))
