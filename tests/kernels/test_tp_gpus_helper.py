"""tests/gpu/tp_gpus.py on the CPU: KOG_TEST_TP parsing, the skip reasons, and the shapes the tests/gpu/test_tp_*.py
tests run at 2, 4 and 8 ranks (tests/gpu itself is skipped without CUDA, so its helper is checked here)."""
import importlib
import sys
from pathlib import Path

import pytest
import torch

from engine.config import preset
from kernels.testing import lane_config_like
from kernels.tp_local import kernel_plan, lane_plan

GPU_TESTS = str(Path(__file__).resolve().parents[1] / "gpu")
if GPU_TESTS not in sys.path:   # as pytest puts it there for tests/gpu (tp_gpus imports shapes from it)
    sys.path.insert(0, GPU_TESTS)
tp_gpus = importlib.import_module("tp_gpus")
SHAPES = importlib.import_module("shapes").SHAPES


@pytest.mark.parametrize("raw, tp", [(None, 2), ("", 2), ("2", 2), ("4", 4), (" 8 ", 8)])
def test_tp_from_env(raw, tp):
    assert tp_gpus.tp_from_env({} if raw is None else {"KOG_TEST_TP": raw}) == tp


@pytest.mark.parametrize("raw", ["x", "1", "0", "-2", "2.5"])
def test_tp_from_env_rejects_bad_values(raw):
    with pytest.raises(ValueError, match=f"KOG_TEST_TP='{raw}'.*integer >= 2"):
        tp_gpus.tp_from_env({"KOG_TEST_TP": raw})


def test_devices_follow_tp():
    assert tp_gpus.DEVS == [torch.device(f"cuda:{i}") for i in range(tp_gpus.TP)]


def test_skip_reasons(monkeypatch):
    cuda = tp_gpus.torch.cuda
    monkeypatch.setattr(cuda, "is_available", lambda: False)
    assert tp_gpus.skip_reason(4) == "needs 4 sm_90 (Hopper) CUDA GPUs (KOG_TEST_TP=4): torch has no CUDA"
    monkeypatch.setattr(cuda, "is_available", lambda: True)
    monkeypatch.setattr(cuda, "device_count", lambda: 2)
    assert tp_gpus.skip_reason(4) == "needs 4 sm_90 (Hopper) CUDA GPUs (KOG_TEST_TP=4): 2 visible"
    monkeypatch.setattr(cuda, "device_count", lambda: 8)
    monkeypatch.setattr(cuda, "get_device_capability", lambda i: (8, 0) if i == 3 else (9, 0))
    assert "compute capabilities" in tp_gpus.skip_reason(4) and "(8, 0)" in tp_gpus.skip_reason(4)
    assert tp_gpus.skip_reason(3) is None     # only cuda:0 .. tp-1 count


@pytest.mark.parametrize("tp", [2, 4, 8])
def test_small_lane_shape_builds_lane_configs_the_kernel_runs(tp):
    cfg = tp_gpus.small_lane_shape(tp)
    assert cfg.hidden_size == cfg.n_heads * cfg.head_dim and cfg.head_dim in (64, 128)
    for head in ("replicate", "vocab_parallel"):
        lc = lane_config_like(cfg, tp, broadcast_delay=2, lm_head_type=head)
        assert lc.num_lanes == tp and lc.kv_heads_per_lane * tp == cfg.n_kv_heads
        lane_plan(lc, tp)
    if tp in (2, 4):   # the shape the tests always had
        assert cfg == SHAPES["llama"]
    else:
        assert (cfg.n_heads, cfg.n_kv_heads, cfg.hidden_size) == (16, 8, 1024)
    with pytest.raises(ValueError, match="does not divide"):   # why the widening is needed at 8
        lane_config_like(SHAPES["llama"], 8)


@pytest.mark.parametrize("tp, name", [(2, "qwen2.5-coder-1.5b"), (4, "llama-3.2-1b"), (8, "llama-3.2-1b")])
def test_big_lane_preset(tp, name):
    assert tp_gpus.big_lane_preset(tp, broadcast_delay=2) == name


def test_big_lane_preset_says_why_none_fits():
    with pytest.raises(ValueError, match="no lane preset for 4 lanes: qwen2.5-coder-1.5b: num_lanes 4"):
        tp_gpus.big_lane_preset(4, names=("qwen2.5-coder-1.5b",))


@pytest.mark.parametrize("tp", [2, 4, 8])
def test_exact_mode_shapes_split_over_tp_ranks(tp):
    """The exact-mode tests keep their shapes at any of these sizes (group head split beyond the KV head count)."""
    for cfg in (SHAPES["qwen"], preset("qwen2.5-coder-1.5b")):
        plan = kernel_plan(cfg, tp)
        assert plan.n_ranks == tp and plan.head_split == ("kv" if tp <= cfg.n_kv_heads else "group")
