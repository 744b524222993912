"""Engine plumbing for tp > 1: refused clearly where it cannot run (no CUDA, too few GPUs, no tensor-parallel
backend) instead of silently running on one device; tp / tp_mode reported in stats()."""
import sys
import types

import pytest
import torch

import engine.backends as backends
from engine import Engine
from engine.backends import TPUnavailable, check_tp
from engine.backends.base import Backend
from engine.testing import make_tiny_checkpoint


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny_checkpoint(tmp_path_factory.mktemp("tiny_tp"), arch="qwen2", seed=3)


def test_tp_on_cpu_is_refused_clearly(tiny):
    with pytest.raises(TPUnavailable, match=r"tp=2 needs 2 CUDA GPUs, but the model device is cpu"):
        Engine.load(str(tiny), device="cpu", tp=2)


def test_tp_needs_enough_gpus(monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(TPUnavailable, match="tp=2 needs 2 CUDA GPUs; this machine has 1"):
        check_tp(2, "exact", "cuda")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    check_tp(2, "exact", "cuda")            # enough GPUs: no objection here
    check_tp(1, "exact", "cpu")


@pytest.mark.parametrize("tp", [0, -1, 1.5, True, "2"])
def test_bad_tp_values(tp):
    with pytest.raises(ValueError, match="tp must be an integer"):
        check_tp(tp, "exact", "cpu")
    with pytest.raises(ValueError, match="tp_mode"):
        check_tp(1, "fast", "cpu")


def test_stats_report_tp(tiny):
    s = Engine.load(str(tiny), device="cpu").stats()
    assert s["tp"] == 1 and s["tp_mode"] == "exact"


class _TPProbe(Backend):
    """Stand-in monokernel: runs the reference math; only the selection plumbing is under test."""
    name = "monokernel"
    supports_tp = False

    def prefill(self, slot, ids, start_pos, all_logits=False):
        return self.model.forward(self.cache.k, self.cache.v, slot, ids, start_pos, all_logits)

    def decode(self, slot, token, pos):
        return self.model.forward(self.cache.k, self.cache.v, slot, torch.tensor([token]), pos)


@pytest.fixture
def enough_gpus(monkeypatch):
    """Pretend the machine passes the GPU checks and a monokernel module exists, so selection runs on CPU."""
    mod = types.ModuleType("engine.backends.monokernel")

    class Mono(_TPProbe):
        pass
    mod.MonokernelBackend = Mono
    monkeypatch.setitem(sys.modules, "engine.backends.monokernel", mod)
    monkeypatch.setattr(backends, "_precheck", lambda name, model: "graph needs CUDA (test)" if name == "graph"
                        else None)
    monkeypatch.setattr(backends, "check_tp", lambda tp, mode, dev: None)
    return Mono


def test_no_tp_backend_is_refused_not_downgraded(tiny, enough_gpus):
    with pytest.raises(TPUnavailable, match=r"no backend can run tp=2 tp_mode=exact .*monokernel does not "
                                            r"support tp=2"):
        Engine.load(str(tiny), device="cpu", tp=2)


def test_tp_backend_gets_tp_and_stats_show_it(tiny, enough_gpus):
    enough_gpus.supports_tp = True
    e = Engine.load(str(tiny), device="cpu", tp=2)
    s = e.stats()
    assert s["backend"] == "monokernel" and e.backend.tp == 2 and e.backend.tp_mode == "exact"
    assert s["tp"] == 2 and s["tp_mode"] == "exact"
