"""Tensor-parallel monokernel backend (engine/backends/tp_monokernel.py) on CPU: selection and refusals, the
position-range K/V copies between the engine's cache and the ranks' caches (against kernels/tp_local.shard_cache),
and the engine driving the backend through a CPU stand-in for TPMonokernel that checks, at every launch, that each
rank's cache holds exactly what a single GPU would read. The GPU run is tests/gpu/test_tp_engine_gpu.py."""
from __future__ import annotations

import inspect
import threading
from types import SimpleNamespace

import pytest
import torch

import engine.backends as backends
from engine import Engine
from engine.backends import TPUnavailable
from engine.backends.base import Backend, BackendUnavailable
from engine.backends.monokernel import MonokernelBackend, backend_class
from engine.backends.tp_monokernel import KVMirror, TPMonokernelBackend, kernel_mode_kwargs, rank_devices
from engine.kv_cache import KVCache
from engine.lanes import TPModeError
from engine.model import Model
from engine.testing import FakeTokenStream
from engine.tp import make_plan
from kernels.testing import tiny_cfg
from kernels.tp_local import kernel_plan, shard_cache


# ---- selection ----
def test_monokernel_module_picks_the_tp_class():
    assert backend_class(1, "exact") is MonokernelBackend
    assert backend_class(2, "exact") is TPMonokernelBackend and TPMonokernelBackend.supports_tp
    assert backend_class(1, "delayed") is TPMonokernelBackend     # refuses itself, with the reason
    assert backends._load_class("monokernel", 2, "exact") is TPMonokernelBackend
    assert backends._load_class("monokernel") is MonokernelBackend
    assert TPMonokernelBackend.name == "monokernel"                # what --backend monokernel asks for


def test_tp2_on_cpu_reaches_the_tp_backend_and_is_refused_with_reasons(tiny_qwen, monkeypatch):
    # Pretend the GPU count / device checks pass: the real TP class then says why it cannot run here.
    monkeypatch.setattr(backends, "check_tp", lambda tp, mode, dev: None)
    monkeypatch.setattr(backends, "_precheck", lambda name, model: None)
    with pytest.raises(TPUnavailable, match=r"no backend can run tp=2 tp_mode=exact.*monokernel unsupported: needs "
                                            r"a CUDA device.*graph does not support tp=2"):
        Engine.load(str(tiny_qwen), device="cpu", tp=2)


def test_rank_devices_start_at_the_model_gpu_and_wrap():
    assert rank_devices("cuda:1", 2, 4) == [torch.device("cuda", 1), torch.device("cuda", 2)]
    assert rank_devices("cuda:3", 2, 4) == [torch.device("cuda", 3), torch.device("cuda", 0)]
    with pytest.raises(BackendUnavailable, match="tp=4 needs 4 GPUs; this machine has 2"):
        rank_devices("cuda:0", 4, 2)


class _ExactOnly:
    def __init__(self, model, devices, max_len=4096, slots=1, max_steps=4096, n_sm=None, k_caches=None,
                 v_caches=None, vocab_parallel=True):
        pass


class _WithModes(_ExactOnly):
    def __init__(self, model, devices, max_len=4096, slots=1, max_steps=4096, n_sm=None, k_caches=None,
                 v_caches=None, vocab_parallel=True, mode="exact"):
        pass


def test_kernel_mode_kwargs_exact_delayed_and_mismatches():
    dense = SimpleNamespace()
    lane = SimpleNamespace(checkpoint_kind="lane", lane_config=SimpleNamespace(num_lanes=2))
    assert kernel_mode_kwargs(dense, 2, "exact", _ExactOnly) == {}       # the existing signature, no mode keyword
    with pytest.raises(TPModeError, match="needs a checkpoint trained with delayed tensor parallelism"):
        kernel_mode_kwargs(dense, 2, "delayed", _WithModes)
    with pytest.raises(TPModeError, match="Use tp_mode='delayed'"):
        kernel_mode_kwargs(lane, 2, "exact", _WithModes)
    with pytest.raises(TPModeError, match="trained for 2 lanes; tp=4"):
        kernel_mode_kwargs(lane, 4, "delayed", _WithModes)
    with pytest.raises(BackendUnavailable, match="this build has exact mode only"):
        kernel_mode_kwargs(lane, 2, "delayed", _ExactOnly)
    with pytest.raises(BackendUnavailable, match="tp=1 simulates every lane"):
        kernel_mode_kwargs(lane, 1, "delayed", _WithModes)
    assert kernel_mode_kwargs(lane, 2, "delayed", _WithModes) == {"mode": "delayed"}


def test_lane_model_is_recognised_and_a_kernel_without_modes_is_refused(monkeypatch):
    # (serving a lane model in delayed mode: tests/engine/test_lane_serving.py)
    from engine.lanes import LaneModel
    lane_model = LaneModel.__new__(LaneModel)
    lane_model.cfg = SimpleNamespace(num_lanes=2)
    assert kernel_mode_kwargs(lane_model, 2, "delayed", _WithModes) == {"mode": "delayed"}
    with pytest.raises(TPModeError, match="Use tp_mode='delayed'"):
        kernel_mode_kwargs(lane_model, 2, "exact", _WithModes)
    import kernels.tp_runtime as tpr
    monkeypatch.setattr(tpr, "TPMonokernel", _ExactOnly)
    with pytest.raises(BackendUnavailable, match="exact mode only"):
        TPMonokernelBackend(lane_model, SimpleNamespace(), tp=2, tp_mode="delayed")


def test_real_kernel_signature_is_probed():
    from kernels.tp_runtime import TPMonokernel
    lane = SimpleNamespace(checkpoint_kind="lane", lane_config=SimpleNamespace(num_lanes=2))
    if "mode" in inspect.signature(TPMonokernel).parameters:
        assert kernel_mode_kwargs(lane, 2, "delayed", TPMonokernel) == {"mode": "delayed"}
    else:
        with pytest.raises(BackendUnavailable, match="exact mode only"):
            kernel_mode_kwargs(lane, 2, "delayed", TPMonokernel)


# ---- position-range copies vs shard_cache ----
PLANS = [dict(n_heads=4, n_kv_heads=2, tp=2),      # "kv": one KV head per rank
         dict(n_heads=8, n_kv_heads=2, tp=4),      # "group": each KV head on two ranks
         dict(n_heads=6, n_kv_heads=3, tp=4)]      # "balanced": a group straddles a cut


def _mirror(n_heads, n_kv_heads, tp, S=2, L=2, T=24, hd=4):
    cfg = tiny_cfg(n_heads=n_heads, n_kv_heads=n_kv_heads)
    plan = make_plan(cfg, tp)
    g = torch.Generator().manual_seed(n_heads * 10 + tp)
    k, v = torch.randn(S, L, n_kv_heads, T, hd, generator=g), torch.randn(S, L, n_kv_heads, T, hd, generator=g)
    kr = [torch.full((S, L, s.n_kv, T, hd), float("nan")) for s in plan.ranks]
    vr = [torch.full((S, L, s.n_kv, T, hd), float("nan")) for s in plan.ranks]
    slots = KVCache(S, L, n_kv_heads, T, hd).slots
    return plan, k, v, kr, vr, KVMirror([s.kv_heads for s in plan.ranks], k, v, kr, vr, slots), slots


@pytest.mark.parametrize("p", PLANS, ids=lambda p: f"{p['n_heads']}q{p['n_kv_heads']}kv-tp{p['tp']}")
def test_sync_copies_exactly_the_rank_shards_of_new_positions(p):
    plan, k, v, kr, vr, m, _ = _mirror(**p)
    assert m.sync(1, 10) == 10 and m.sync(1, 10) == 0          # nothing new: nothing copied
    m.invalidate(1, 6)                                          # a prefill rewrote 6.. (and on to 14)
    k[1, :, :, 6:14] += 1.0
    assert m.sync(1, 14) == 8
    for r in range(plan.n_ranks):
        want_k, want_v = shard_cache(k, plan, r), shard_cache(v, plan, r)
        assert torch.equal(kr[r][1, :, :, :14], want_k[1, :, :, :14])
        assert torch.equal(vr[r][1, :, :, :14], want_v[1, :, :, :14])
        assert torch.isnan(kr[r][1, :, :, 14:]).all() and torch.isnan(kr[r][0]).all()   # nothing else touched
    assert m.to_ranks == 18


@pytest.mark.parametrize("p", PLANS, ids=lambda p: f"{p['n_heads']}q{p['n_kv_heads']}kv-tp{p['tp']}")
def test_gather_writes_back_the_decoded_range_from_the_ranks(p):
    plan, k, v, kr, vr, m, _ = _mirror(**p)
    m.sync(0, 5)
    # what the kernels computed at positions 5..8: every holder of a KV head writes the same values
    new_k, new_v = torch.randn_like(k), torch.randn_like(v)
    for r in range(plan.n_ranks):
        kr[r][0, :, :, 5:9] = shard_cache(new_k, plan, r)[0, :, :, 5:9]
        vr[r][0, :, :, 5:9] = shard_cache(new_v, plan, r)[0, :, :, 5:9]
    before_k = k.clone()
    m.gather(0, 5, 9)
    assert torch.equal(k[0, :, :, 5:9], new_k[0, :, :, 5:9]) and torch.equal(v[0, :, :, 5:9], new_v[0, :, :, 5:9])
    assert torch.equal(k[0, :, :, :5], before_k[0, :, :, :5]) and torch.equal(k[0, :, :, 9:], before_k[0, :, :, 9:])
    assert torch.equal(k[1], before_k[1])
    assert m.valid[0] == 9 and m.sync(0, 9) == 0               # the ranks already hold what they wrote


def test_primary_holder_per_kv_head():
    plan, *_, m, _ = _mirror(n_heads=8, n_kv_heads=2, tp=4)
    assert [s.kv_heads for s in plan.ranks] == [(0, 1), (0, 1), (1, 2), (1, 2)]
    assert m.primary == [(0, 1), (1, 1), (1, 2), (2, 2)]


def test_a_slot_rebuilt_by_the_prefix_cache_is_copied_again():
    plan, k, v, kr, vr, m, slots = _mirror(n_heads=4, n_kv_heads=2, tp=2, S=2)
    slots[1].ids.extend(range(10))
    m.sync(1, 10)
    slots[1].ids = [7] * 4          # KVCache.acquire copying another slot's prefix gives the slot a new list
    k[1, :, :, :4] = 5.0
    assert m.sync(1, 4) == 4
    assert torch.equal(kr[0][1, :, :, :4], shard_cache(k, plan, 0)[1, :, :, :4])
    m.reset()
    assert m.sync(1, 4) == 4


# ---- the backend driven by the engine, with a CPU stand-in for TPMonokernel ----
def kv_value(token: int, pos: int, head: int, hd: int) -> torch.Tensor:
    return torch.full((hd,), token * 0.5 + pos * 0.01 + head * 100.0)


def next_token(token: int, V: int) -> int:
    return (token * 7 + 3) % V


class FakeTPKernel(FakeTokenStream):
    """TPMonokernel's host interface on CPU. A launch first checks that every rank's cache equals the engine's
    full cache (its heads) on [0, pos): what the real kernels would read. It then 'runs' every step at once,
    writing each fed token's K/V into the ranks' caches (and, like a real kernel, one position past what the host
    will see when cancelled), and streams the tokens one count() call at a time."""

    def __init__(self, model, cache, tp=2, max_steps=64, fail_wait=False):
        self.plan = kernel_plan(model.cfg, tp)
        self.full = cache
        self.devices = [torch.device("cpu")] * tp
        self.vocab_parallel, self.n_sm, self.max_steps = True, 1, max_steps
        self.ranks = [SimpleNamespace(sched=SimpleNamespace(per_sm=[[0, 1]]))]
        hd, V = model.cfg.head_dim, model.cfg.vocab_size
        self.hd, self.V = hd, V
        shp = lambda s: (cache.n_slots, model.cfg.n_layers, s.n_kv, cache.max_len, hd)   # noqa: E731
        self.k_caches = [torch.full(shp(s), float("nan")) for s in self.plan.ranks]
        self.v_caches = [torch.full(shp(s), float("nan")) for s in self.plan.ranks]
        self.reads_ok: list[bool] = []
        self.fail_wait = fail_wait
        self.n_steps = 0

    def describe(self) -> str:   # as TPMonokernel.describe (exact mode: the shard plan)
        return self.plan.describe()

    def launch(self, slot, token, pos0, n_steps, temperature=0.0, top_p=1.0, seed=None, stop_ids=(), forced=None,
               logits_out=None):
        ok = True
        for r, s in enumerate(self.plan.ranks):
            k0, k1 = s.kv_heads
            ok &= torch.equal(self.k_caches[r][slot, :, :, :pos0], self.full.k[slot, :, k0:k1, :pos0])
            ok &= torch.equal(self.v_caches[r][slot, :, :, :pos0], self.full.v[slot, :, k0:k1, :pos0])
        self.reads_ok.append(bool(ok))
        self.tokens, self.n_steps, self.shown, self.cancelled = [], n_steps, 0, False
        for i in range(n_steps):
            p = pos0 + i
            for r, s in enumerate(self.plan.ranks):
                for j, h in enumerate(range(*s.kv_heads)):
                    self.k_caches[r][slot, :, j, p] = kv_value(token, p, h, self.hd)
                    self.v_caches[r][slot, :, j, p] = -kv_value(token, p, h, self.hd)
            token = next_token(token, self.V)
            self.tokens.append(token)
            if logits_out is not None:
                logits_out[i].zero_()
                logits_out[i, token] = 1.0
            if token in stop_ids:
                break

    def wait(self, timeout_s=None):
        if self.fail_wait:
            raise RuntimeError("tp monokernel watchdog fired (test)")

    def exchange_wait_us(self):
        return {"mean_us": 2.0, "max_us": 3.0, "per_rank_mean_us": [2.0, 2.0]}


@pytest.fixture
def tp_engine():
    cfg = tiny_cfg()
    model = Model(cfg, device="cpu", dtype=torch.float32, max_len=96).init_random(seed=4)
    e = Engine(model, None, kv_slots=2, backend="reference")
    b = TPMonokernelBackend.__new__(TPMonokernelBackend)
    Backend.__init__(b, model, e.cache, 2, "exact")
    fake = FakeTPKernel(model, e.cache)
    b._attach(fake)
    e.backend, e.tp = b, 2
    return e, b, fake


def _expect_kv(e, fake, slot, pos, fed):
    for i, t in enumerate(fed):
        for h in range(e.config.n_kv_heads):
            assert torch.equal(e.cache.k[slot, :, h, pos + i], kv_value(t, pos + i, h, fake.hd).expand(
                e.config.n_layers, -1)), (i, h)


def test_engine_decodes_through_the_ranks_and_copies_back(tp_engine):
    e, b, fake = tp_engine
    V = e.config.vocab_size
    prompt = list(range(3, 23))
    r1 = e.complete(prompt, max_new_tokens=9, stop_ids=frozenset())
    toks = r1.token_ids
    assert len(toks) == 9 and all(toks[i + 1] == next_token(toks[i], V) for i in range(8))
    slot = next(i for i, s in enumerate(e.cache.slots) if s.ids[:20] == prompt)
    _expect_kv(e, fake, slot, len(prompt), toks[:8])           # the fed tokens' K/V are in the engine's cache
    assert fake.reads_ok == [True]
    st = e.stats()["backend_stats"]
    assert st["tp"] == 2 and st["tp_mode"] == "exact" and st["exchange_wait_us"] == 2.0
    assert st["kv_to_ranks_positions"] == 20 and st["kv_from_ranks_positions"] == 8
    # no short prefill chunk runs as kernel steps here, and the stats say why (KERNEL_PREFILL_OFF)
    assert st["kernel_prefill_max"] == 0 and st["kernel_prefill"].startswith("off (tensor-parallel"), st
    # The launch clock (monokernel.py _LaunchClock): host launch cost, launch -> first token, token gaps, finish.
    clock = {k: st[k] for k in ("launch_host_us", "first_token_us", "token_interval_us", "finish_us")}
    assert all(v >= 0 for v in clock.values()) and b._clock_sums["token_interval_us"][1] == 7, clock

    # A request extending the first (prefix reuse after a TP decode): only the new positions go to the ranks.
    p2 = prompt + toks + [5, 6]
    r2 = e.complete(p2, max_new_tokens=4, stop_ids=frozenset())
    assert r2.reused_tokens == 28 and fake.reads_ok == [True, True]
    assert e.stats()["backend_stats"]["kv_to_ranks_positions"] == 20 + 3
    _expect_kv(e, fake, slot, len(p2), r2.token_ids[:3])


def test_prefix_cache_slot_copy_and_cancel(tp_engine):
    e, b, fake = tp_engine
    x = list(range(3, 43))
    e.complete(list(range(100, 130)), max_new_tokens=5, stop_ids=frozenset())  # slot B, valid on the ranks
    e.complete(x, max_new_tokens=5, stop_ids=frozenset())                      # slot A
    b_slot = next(i for i, s in enumerate(e.cache.slots) if s.ids[:1] == [100])
    y = x[:10] + [150, 151, 152]            # shares 10 tokens with A: acquire copies them into B (the LRU slot)
    e.complete(y, max_new_tokens=5, stop_ids=frozenset())
    assert e.cache.slots[b_slot].ids[:13] == y                  # the copy path ran
    assert all(fake.reads_ok) and len(fake.reads_ok) == 3

    cancel = threading.Event()
    n = 0
    for ev in e.generate(list(range(60, 80)), max_new_tokens=30, stop_ids=frozenset(), cancel=cancel):
        n += 1
        if n == 4:
            cancel.set()
    assert e.last_result.finish_reason == "cancelled" and b.stats["cancelled"] == 1
    slot = next(i for i, s in enumerate(e.cache.slots) if s.ids[:20] == list(range(60, 80)))
    fed = e.cache.slots[slot].ids[20:]
    _expect_kv(e, fake, slot, 20, fed)
    assert b.mirror.valid[slot] == 20 + fake.count()            # not the position the kernel wrote past the end
    r = e.complete(list(range(60, 80)) + fed + [9], max_new_tokens=3, stop_ids=frozenset())
    assert all(fake.reads_ok) and len(r.token_ids) == 3


def test_single_decode_and_a_failed_launch(tp_engine):
    e, b, fake = tp_engine
    prompt = list(range(3, 13))
    e.complete(prompt, max_new_tokens=1, stop_ids=frozenset())     # prefill only
    slot = next(i for i, s in enumerate(e.cache.slots) if s.ids == prompt)
    logits = b.decode(slot, 7, 10)                                  # the healing path's single step
    assert int(logits.argmax()) == next_token(7, e.config.vocab_size) and fake.reads_ok == [True]
    _expect_kv(e, fake, slot, 10, [7])
    e.cache.record(slot, [7])
    fake.fail_wait = True
    with pytest.raises(RuntimeError, match="watchdog"):
        list(b.decode_loop(slot, 8, 11, 5, e_sampling(), frozenset(), None))
    assert len(e.cache.slots[slot].ids) == 11 and b.mirror.valid[slot] == 11   # nothing past the failed launch


def e_sampling():
    from engine.sampling import SamplingParams
    return SamplingParams()


def test_status_text_shows_tp():
    from kog_lsp.runtime import tp_text
    assert tp_text({"tp": 1, "tp_mode": "exact"}) == "" and tp_text(None) == ""
    assert tp_text({"tp": 2, "tp_mode": "exact", "backend_stats": {"exchange_wait_us": None}}) == " tp=2 exact"
    assert tp_text({"tp": 2, "tp_mode": "exact", "backend_stats": {"exchange_wait_us": 3.25}}) == \
        " tp=2 exact (exchange wait 3.2 us/token)"
