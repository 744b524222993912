"""The monokernel backend on a machine without a Hopper GPU: it says why it cannot run, and the engine falls
back; the supported() checks reject shapes the kernel does not implement."""
import torch

from engine.backends import select_backend
from engine.backends.base import BackendUnavailable
from engine.backends.monokernel import MonokernelBackend
from engine.config import preset
from engine.kv_cache import KVCache
from kernels.testing import tiny_cfg, tiny_model


def test_cpu_is_not_supported_and_selector_falls_back():
    ok, why = MonokernelBackend.supported(preset("qwen2.5-coder-1.5b"), "cpu")
    assert not ok and "CUDA" in why
    cfg = tiny_cfg()
    model = tiny_model(cfg)
    cache = KVCache(1, cfg.n_layers, cfg.n_kv_heads, 32, cfg.head_dim)
    try:
        MonokernelBackend(model, cache)
        raise AssertionError("constructed on CPU")
    except BackendUnavailable as e:
        assert "CUDA" in str(e)
    backend, reason = select_backend("monokernel", model, cache)
    assert backend.name != "monokernel" and "monokernel" in reason


def test_shape_checks(monkeypatch):
    # pretend to be on an H200 so only the shape checks decide
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda dev=None: (9, 0))
    import kernels.build as kb
    monkeypatch.setattr(kb, "find_nvcc", lambda: "/usr/bin/true")
    for name in ("qwen2.5-coder-0.5b", "llama-3.2-1b", "qwen2.5-coder-1.5b", "dense-2b"):   # head_dim 64, 128, 96
        assert MonokernelBackend.supported(preset(name), "cuda") == (True, "ok")
    bad = {"head_dim": dict(head_dim=80), "group": dict(n_heads=36, n_kv_heads=2),
           "bias": dict(o_bias=True), "arch": dict(arch="mistral")}
    for what, kw in bad.items():
        ok, why = MonokernelBackend.supported(preset("llama-3.2-1b").replace(**kw), "cuda")
        assert not ok, what
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda dev=None: (8, 0))
    assert not MonokernelBackend.supported(preset("llama-3.2-1b"), "cuda")[0]
