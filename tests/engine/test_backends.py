import logging
import sys
import types

import pytest
import torch

import engine.backends as backends
from engine import Engine
from engine.backends.base import Backend, BackendUnavailable


def test_cpu_auto_picks_reference_with_reason(tiny_qwen, caplog):
    with caplog.at_level(logging.INFO, logger="engine"):
        e = Engine.load(str(tiny_qwen), device="cpu")
    s = e.stats()
    assert s["backend"] == "reference"
    assert "monokernel needs CUDA" in s["backend_reason"] and "graph needs CUDA" in s["backend_reason"]
    assert any("backend: reference" in r.getMessage() for r in caplog.records)


def test_explicit_graph_on_cpu_falls_back(tiny_qwen):
    e = Engine.load(str(tiny_qwen), device="cpu", backend="graph")
    assert e.stats()["backend"] == "reference" and "graph needs CUDA" in e.backend_reason


def test_unknown_backend(tiny_qwen):
    with pytest.raises(ValueError, match="unknown backend"):
        Engine.load(str(tiny_qwen), device="cpu", backend="turbo")


def test_tp_needs_a_tp_backend(tiny_qwen):
    with pytest.raises(RuntimeError, match="tp=2"):
        Engine.load(str(tiny_qwen), device="cpu", tp=2)


class _Probe(Backend):
    name = "monokernel"
    verdict = (True, "ok")
    fail_warmup = False

    @classmethod
    def supported(cls, config, device):
        return cls.verdict

    def warmup(self):
        if self.fail_warmup:
            raise RuntimeError("launch failed: too many resources requested")

    def prefill(self, slot, ids, start_pos, all_logits=False):
        return self.model.forward(self.cache.k, self.cache.v, slot, ids, start_pos, all_logits)

    def decode(self, slot, token, pos):
        return self.model.forward(self.cache.k, self.cache.v, slot, torch.tensor([token]), pos)


@pytest.fixture
def fake_monokernel(monkeypatch):
    """A stand-in monokernel module, with the device checks relaxed so the selection logic runs on CPU."""
    mod = types.ModuleType("engine.backends.monokernel")

    class Mono(_Probe):
        pass
    mod.MonokernelBackend = Mono
    monkeypatch.setitem(sys.modules, "engine.backends.monokernel", mod)
    monkeypatch.setattr(backends, "_precheck", lambda name, model: "graph needs CUDA (test)" if name == "graph"
                        else None)
    return Mono


def test_auto_picks_supported_monokernel(tiny_qwen, fake_monokernel):
    e = Engine.load(str(tiny_qwen), device="cpu")
    assert e.stats()["backend"] == "monokernel" and "monokernel selected" in e.backend_reason
    ids = e.tokenizer.encode("def f():")
    assert len(e.complete(ids, max_new_tokens=3, stop_ids=()).token_ids) == 3


def test_unsupported_or_failing_monokernel_falls_back(tiny_qwen, fake_monokernel):
    fake_monokernel.verdict = (False, "head_dim 24 not supported")
    e = Engine.load(str(tiny_qwen), device="cpu")
    assert e.stats()["backend"] == "reference" and "head_dim 24 not supported" in e.backend_reason
    fake_monokernel.verdict = (True, "ok")
    fake_monokernel.fail_warmup = True
    e = Engine.load(str(tiny_qwen), device="cpu")
    assert e.stats()["backend"] == "reference" and "too many resources" in e.backend_reason


def test_backend_unavailable_is_a_reason(tiny_qwen, fake_monokernel):
    def boom(self, *a, **k):
        raise BackendUnavailable("no peer access between GPUs")
    fake_monokernel.__init__ = boom
    e = Engine.load(str(tiny_qwen), device="cpu")
    assert "no peer access" in e.backend_reason


def test_backend_stats_method_or_dict(tiny_qwen, fake_monokernel):
    orig = fake_monokernel.__init__

    def init(self, *a, **k):
        orig(self, *a, **k)
        self.stats = {"launches": 3}       # a plain dict attribute, as a backend may keep
    fake_monokernel.__init__ = init
    e = Engine.load(str(tiny_qwen), device="cpu")
    s = e.stats()
    assert s["backend_stats"] == {"launches": 3} and s["backend_detail"] == "monokernel"
    e2 = Engine.load(str(tiny_qwen), device="cpu", backend="reference")
    assert e2.stats()["backend_stats"] == {}


class _FakeKernel:
    """Stands in for kernels.runtime.Monokernel: records its arguments; a cluster (plain) launch fails when told to."""
    fail_clusters = False
    fail_plain = False
    made: list = []

    def __init__(self, model, k, v, max_steps=4096, attn_cluster=0, long_lib=None):
        if attn_cluster and self.fail_clusters:
            raise RuntimeError("cluster occupancy: only 7 clusters resident")
        if not attn_cluster and self.fail_plain:
            raise RuntimeError("out of memory")
        self.attn_cluster, self.long_lib = attn_cluster, long_lib
        _FakeKernel.made.append(attn_cluster)


@pytest.mark.parametrize("name,cluster", [("qwen2.5-coder-0.5b", 16), ("llama-3.2-1b", 0)])
@pytest.mark.parametrize("fail", [False, True])
def test_monokernel_cluster_launch_choice_and_fallback(monkeypatch, caplog, name, cluster, fail):
    """The backend launches in clusters where schedule.attn_cluster_model picks them; a cluster launch that cannot
    start falls back to the plain one and says why (log line + stats), never silently."""
    import kernels.runtime
    from engine.backends.monokernel import MonokernelBackend
    from engine.config import preset
    monkeypatch.setattr(kernels.runtime, "Monokernel", _FakeKernel)
    monkeypatch.setattr(_FakeKernel, "fail_clusters", fail)
    monkeypatch.setattr(_FakeKernel, "made", [])
    be = object.__new__(MonokernelBackend)
    be.stats = {}
    model = types.SimpleNamespace(cfg=preset(name))
    cache = types.SimpleNamespace(k=None, v=None)
    with caplog.at_level(logging.WARNING, logger="engine"):
        mk = be._kernel(model, cache, 64)
    if cluster and fail:
        assert mk.attn_cluster == 0 and _FakeKernel.made == [0]
        assert "only 7 clusters resident" in be.stats["attn_cluster_fallback"]
        assert any(f"clusters of {cluster} not used" in r.getMessage() for r in caplog.records)
    else:
        assert mk.attn_cluster == cluster and _FakeKernel.made == [cluster]
        assert "attn_cluster_fallback" not in be.stats and not caplog.records
    # the cluster launch is made without its long-context library (_long_kernel asks for it only where needed)
    assert mk.long_lib is (False if mk.attn_cluster else None)


def test_monokernel_side_launch_fallbacks_reach_the_stats():
    """The side launch next to the clusters (kernels/runtime.py) may run alone or stop being started; the backend's
    stats say so after every launch (the kernel object logs each one)."""
    from engine.backends.monokernel import MonokernelBackend
    be = object.__new__(MonokernelBackend)
    be.stats = {}
    be.mk = types.SimpleNamespace(n_side=20, side_alone=0, side_error=None)
    be._side_stats(be.mk)
    assert be.stats == {"side_alone": 0}
    be.mk.side_alone, be.mk.side_error = 2, "CUDA error 1 (invalid argument)"
    be._side_stats(be.mk)
    assert be.stats == {"side_alone": 2, "side_error": "CUDA error 1 (invalid argument)"}
    be.stats, be.mk = {}, types.SimpleNamespace(n_side=0, side_alone=0, side_error=None)
    be._side_stats(be.mk)
    assert be.stats == {}


@pytest.mark.parametrize("cluster,fail,max_len", [(16, False, 4096), (16, True, 4096), (0, False, 4096),
                                                  (16, False, 2200)])
def test_long_contexts_run_the_plain_launch_next_to_the_clusters(monkeypatch, caplog, cluster, fail, max_len):
    """Next to a cluster launch the backend holds the plain launch and runs it for the launches where the clusters
    would restage K / V (Monokernel.restages), counting them; where the plain launch cannot be made the clusters run
    every launch and the log and stats say why; a plain launch alone holds nothing more, and neither does a cluster
    launch that never restages within the cache."""
    import kernels.runtime
    from engine.backends.monokernel import MonokernelBackend
    monkeypatch.setattr(kernels.runtime, "Monokernel", _FakeKernel)
    monkeypatch.setattr(_FakeKernel, "fail_plain", fail)
    monkeypatch.setattr(_FakeKernel, "made", [])
    be = object.__new__(MonokernelBackend)
    be.stats = {}
    asked = []   # set_long_lib calls: the cluster launch's long-context library, asked for only without a plain launch

    def set_long_lib(want):
        asked.append(want)
        be.mk.lib_long, be.mk.long_lib_off = "long-context library", None

    be.mk = types.SimpleNamespace(attn_cluster=cluster, restages=lambda pos, n: pos + n > 2200, lib_long=None,
                                  long_lib_off="long_lib=False" if cluster else "no cluster launch",
                                  set_long_lib=set_long_lib)
    cache = types.SimpleNamespace(k=torch.empty(1, 1, 1, max_len, 0), v=None)
    with caplog.at_level(logging.WARNING, logger="engine"):
        be.mk_long = be._long_kernel(types.SimpleNamespace(), cache, 64)
    assert be._pick(0, 64) is be.mk and be._pick(2100, 100) is be.mk
    if cluster and max_len <= 2200:
        assert be.mk_long is None and _FakeKernel.made == [] and not caplog.records
        assert be.stats == {"long_launch": "not needed (the clusters stage all 2200 cache positions without restaging)",
                            "long_lib": "off (no launch restages within the cache)"}
        assert asked == []
    elif cluster and not fail:
        assert be.mk_long.attn_cluster == 0 and _FakeKernel.made == [0]
        assert be.stats["long_launch"] == "plain where the clusters restage" and not caplog.records
        assert be.stats["long_lib"] == "off (the plain launch takes the launches that restage)" and asked == []
        assert be._pick(2100, 101) is be.mk_long and be._pick(5000, 1) is be.mk_long
        assert be.stats["plain_long_launches"] == 2
    elif cluster:
        assert be.mk_long is None and be.stats["long_launch"] == "off (RuntimeError: out of memory)"
        # without a plain launch the clusters take the long launches with their long-context library
        assert asked == [None] and be.stats["long_lib"] == "on"
        assert any("no plain launch for long contexts" in r.getMessage() and "library on" in r.getMessage()
                   for r in caplog.records)
        assert be._pick(5000, 1) is be.mk
    else:
        assert be.mk_long is None and _FakeKernel.made == [] and be.stats == {"long_lib": "off (no cluster launch)"}
        assert asked == [] and be._pick(5000, 1) is be.mk
