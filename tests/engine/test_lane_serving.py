"""Serving a Laneformer lane checkpoint (tp_mode='delayed') on CPU: the engine's lane prefill (engine/lanes/serving.py)
equals LaneModel's forward and fills the lane-major KV cache exactly as kernels/tp_local.lane_cache lays out each
rank's part; the engine at tp=1 (reference backend, every lane simulated) gives LaneModel's greedy tokens and
scores; the tensor-parallel backend in delayed mode, driven by the engine through a CPU stand-in for
TPMonokernel(mode="delayed") that decodes with the lane reference from the ranks' own caches and checks at every
launch that each rank holds what the reference would read; refusals. The GPU run is
tests/gpu/test_tp_lanes_engine.py."""
from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest
import torch

import engine.backends as backends
from engine import Engine
from engine.backends import TPUnavailable
from engine.backends.base import Backend, BackendUnavailable
from engine.backends.tp_monokernel import TPMonokernelBackend, lane_rank_config
from engine.kv_cache import KVCache
from engine.lanes import TPModeError, load_lane_checkpoint
from engine.lanes.serving import LaneServingModel, is_lane_model, load_lane_serving
from engine.testing import FakeTokenStream
from engine.testing_lanes import make_tiny_lane_checkpoint
from kernels.tp_local import lane_cache, lane_keys_from_kernel, lane_keys_to_kernel, lane_kv_bounds, lane_plan

NONE = frozenset()


@pytest.fixture(scope="module")
def lane_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("lanes")
    return {
        "delay1": make_tiny_lane_checkpoint(root / "d1", seed=1, tokenizer=True),
        "delay2-vocab-head": make_tiny_lane_checkpoint(root / "d2", seed=2, tokenizer=True, broadcast_delay=2,
                                                       use_early_comm=False, lm_head_type="vocab_parallel"),
        "swa": make_tiny_lane_checkpoint(root / "swa", seed=3, tokenizer=True, sliding_window=8,
                                         sliding_window_n_layers=2),
    }


def greedy(m, ids, n):
    """LaneModel's own greedy continuation (one forward over the prompt, then one token at a time)."""
    c = m.new_cache()
    t = int(m(ids, c)[-1].argmax())
    out = [t]
    for _ in range(n - 1):
        t = int(m([t], c)[-1].argmax())
        out.append(t)
    return out


def full_cache_of(m, ids, max_len):
    """The engine-layout cache [1, layers, all KV heads, max_len, hd] of a reference run over `ids`, built from
    tp_local.lane_cache's per-rank parts (the layout TPMonokernel(mode='delayed').load_cache reads)."""
    c = m.new_cache()
    m(ids, c)
    parts = [lane_cache(c, m.cfg, r, max_len) for r in range(m.cfg.num_lanes)]
    return torch.cat([k for k, _ in parts], 2), torch.cat([v for _, v in parts], 2)


# ---- the lane prefill ----
@pytest.mark.parametrize("case", ["delay1", "delay2-vocab-head", "swa"])
def test_chunked_prefill_equals_lane_forward_and_fills_the_kernel_layout(lane_dirs, case):
    ref = load_lane_checkpoint(lane_dirs[case])
    sm = load_lane_serving(lane_dirs[case], max_len=40)
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(0, ref.cfg.vocab_size, (30,), generator=g)
    want = ref(ids.tolist())                                         # [30, V], one uncached forward
    k = torch.full((2, ref.cfg.num_layers, ref.cfg.num_kv_heads, 40, ref.cfg.head_dim), float("nan"))
    v = k.clone()
    got = [sm.forward(k, v, 1, ids[a:b], a, all_logits=True) for a, b in ((0, 11), (11, 12), (12, 30))]
    torch.testing.assert_close(torch.cat(got), want, rtol=1e-5, atol=1e-5)
    if case == "swa":
        # the reference keeps only the window's keys in its SWA layers: compare the positions it holds
        c = ref.new_cache()
        ref(ids.tolist(), c)
        for i in range(ref.cfg.num_layers):
            t0 = c.start(i)
            assert (t0 > 0) == ref.cfg.is_swa(i)
            torch.testing.assert_close(k[1, i, :, t0:30], lane_keys_to_kernel(c.k[i]).flatten(0, 1),
                                       rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(v[1, i, :, t0:30], c.v[i].flatten(0, 1), rtol=1e-5, atol=1e-5)
    else:
        kw, vw = full_cache_of(ref, ids.tolist(), 40)
        torch.testing.assert_close(k[1, :, :, :30], kw[0, :, :, :30], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(v[1, :, :, :30], vw[0, :, :, :30], rtol=1e-5, atol=1e-5)
    assert torch.isnan(k[0]).all() and torch.isnan(k[1, :, :, 30:]).all()     # nothing else written
    # the rebuilt reference cache reads the adjacent-pair keys back exactly
    c = sm.lane_cache_of(k, v, 1, 30)
    assert torch.equal(c.k[0], lane_keys_from_kernel(k[1, 0, :, :30].reshape(c.k[0].shape)))


def test_last_row_prefill_and_limits(lane_dirs):
    sm = load_lane_serving(lane_dirs["delay1"], max_len=16)
    ref = load_lane_checkpoint(lane_dirs["delay1"])
    k = torch.zeros(1, sm.cfg.n_layers, sm.cfg.n_kv_heads, 16, sm.cfg.head_dim)
    v = k.clone()
    ids = torch.tensor([3, 9, 27, 4])
    torch.testing.assert_close(sm.forward(k, v, 0, ids, 0), ref(ids.tolist())[-1], rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="exceeds max_seq_len 16"):
        sm.forward(k, v, 0, ids, 14)
    assert is_lane_model(sm) and sm.cfg.lanes is sm.lane_config and sm.cfg.n_kv_heads == sm.lane_config.num_kv_heads
    assert sm.n_params() == sum(t.numel() for t in ref.w.values())


# ---- the engine at tp=1 (reference backend) ----
@pytest.mark.parametrize("case", ["delay1", "delay2-vocab-head"])
def test_engine_tp1_delayed_greedy_and_scores_equal_lane_model(lane_dirs, case):
    ref = load_lane_checkpoint(lane_dirs[case])
    e = Engine.load(str(lane_dirs[case]), device="cpu", tp=1, tp_mode="delayed", kv_slots=2, max_seq_len=96)
    assert e.stats()["backend"] == "reference" and e.stats()["tp_mode"] == "delayed"
    assert "graph runs ordinary checkpoints only" in e.backend_reason
    prompt = e.tokenizer.encode("def fibonacci(n):\n    return")
    r = e.complete(prompt, max_new_tokens=12, stop_ids=NONE)
    assert r.token_ids == greedy(ref, prompt, 12)
    p2 = prompt + r.token_ids + [7, 8]
    r2 = e.complete(p2, max_new_tokens=6, stop_ids=NONE)
    assert r2.reused_tokens == len(prompt) + 11 and r2.token_ids == greedy(ref, p2, 6)
    sc = e.score(p2)
    lp = torch.log_softmax(ref(p2), -1)
    want = [float(lp[i, p2[i + 1]]) for i in range(len(p2) - 1)]
    assert sc.token_logprobs == pytest.approx(want, abs=1e-4)


# ---- the tensor-parallel backend in delayed mode, with a CPU stand-in for the kernel ----
class FakeLaneKernel(FakeTokenStream):
    """TPMonokernel(mode='delayed')'s host interface on CPU. A launch first checks that each rank's cache holds, on
    [0, pos), what the lane reference computes for the slot's tokens (lane_cache of its LaneKVCache, rank r's
    part): what the real kernels would read. It then decodes greedily with the lane reference itself, reading the
    ranks' caches (all lanes together) and writing each step's K/V into them, one position further than the host
    is shown when cancelled, like a real kernel."""

    def __init__(self, lane_model, engine_cache, tp=2, max_steps=64):
        cfg = lane_model.cfg
        self.m, self.full, self.cfg = lane_model, engine_cache, cfg
        self.lanes = lane_plan(cfg, tp, max_len=engine_cache.max_len)
        self.kv_bounds = lane_kv_bounds(cfg, tp)
        self.devices = [torch.device("cpu")] * tp
        self.vocab_parallel, self.n_sm, self.max_steps, self.n_steps = True, 1, max_steps, 0
        self.ranks = [SimpleNamespace(sched=SimpleNamespace(per_sm=[[0, 1]]))]
        shape = (engine_cache.n_slots, cfg.num_layers, cfg.kv_heads_per_lane, engine_cache.max_len, cfg.head_dim)
        self.k_caches = [torch.full(shape, float("nan")) for _ in range(tp)]
        self.v_caches = [torch.full(shape, float("nan")) for _ in range(tp)]
        self.reads_ok: list[bool] = []

    def describe(self):
        return self.lanes.describe()

    def _check_reads(self, slot, pos):
        ids = self.full.slots[slot].ids[:pos]
        c = self.m.new_cache()
        self.m(ids, c)
        ok = len(ids) == pos
        for r in range(len(self.k_caches)):
            k, v = lane_cache(c, self.cfg, r, self.full.max_len)
            ok = ok and torch.allclose(self.k_caches[r][slot, :, :, :pos], k[0, :, :, :pos], atol=1e-5, rtol=1e-5)
            ok = ok and torch.allclose(self.v_caches[r][slot, :, :, :pos], v[0, :, :, :pos], atol=1e-5, rtol=1e-5)
        self.reads_ok.append(bool(ok))

    def launch(self, slot, token, pos0, n_steps, temperature=0.0, top_p=1.0, seed=None, stop_ids=(), forced=None,
               logits_out=None):
        self._check_reads(slot, pos0)
        sm = LaneServingModel(self.m, max_len=self.full.max_len)
        k = torch.cat([kc for kc in self.k_caches], 2)   # the ranks' heads, lane-major (lane_kv_bounds)
        v = torch.cat([vc for vc in self.v_caches], 2)
        self.tokens, self.n_steps, self.shown, self.cancelled = [], n_steps, 0, False
        for i in range(n_steps):
            logits = sm.forward(k, v, slot, torch.tensor([token]), pos0 + i)
            for r, (a, b) in enumerate(self.kv_bounds):
                self.k_caches[r][slot, :, :, pos0 + i] = k[slot, :, a:b, pos0 + i]
                self.v_caches[r][slot, :, :, pos0 + i] = v[slot, :, a:b, pos0 + i]
            token = int(logits.argmax())
            self.tokens.append(token)
            if logits_out is not None:
                logits_out[i].copy_(logits)
            if token in stop_ids:
                break

    def exchange_wait_us(self):
        return {"mean_us": 0.5, "max_us": 1.5, "per_rank_mean_us": [0.5, 0.5]}


@pytest.fixture
def lane_tp_engine(lane_dirs):
    d = lane_dirs["delay2-vocab-head"]
    e = Engine.load(str(d), device="cpu", tp=1, tp_mode="delayed", kv_slots=2, max_seq_len=96)
    b = TPMonokernelBackend.__new__(TPMonokernelBackend)
    Backend.__init__(b, e.model, e.cache, 2, "delayed")
    fake = FakeLaneKernel(e.model.lane, e.cache)
    b._attach(fake)
    e.backend, e.tp = b, 2
    return e, b, fake, load_lane_checkpoint(d)


def test_engine_tp2_delayed_decodes_through_the_ranks_and_copies_back(lane_tp_engine):
    e, b, fake, ref = lane_tp_engine
    prompt = e.tokenizer.encode("while True:\n    x = read()")
    r1 = e.complete(prompt, max_new_tokens=10, stop_ids=NONE)
    assert r1.token_ids == greedy(ref, prompt, 10) and fake.reads_ok == [True]
    slot = next(i for i, s in enumerate(e.cache.slots) if s.ids[:len(prompt)] == prompt)
    # the decoded positions came back into the engine's cache: equal to a reference run over the fed tokens
    fed = prompt + r1.token_ids[:9]
    kw, vw = full_cache_of(ref, fed, e.cache.max_len)
    torch.testing.assert_close(e.cache.k[slot, :, :, :len(fed)], kw[0, :, :, :len(fed)], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(e.cache.v[slot, :, :, :len(fed)], vw[0, :, :, :len(fed)], rtol=1e-5, atol=1e-5)
    st = e.stats()
    bs = st["backend_stats"]
    assert st["tp"] == 2 and st["tp_mode"] == "delayed" and bs["tp"] == 2 and bs["tp_mode"] == "delayed"
    assert bs["exchange_wait_us"] == 0.5 and bs["lanes"].startswith("delayed mode: 2 lanes, delay 2")
    assert bs["kv_to_ranks_positions"] == len(prompt) and bs["kv_from_ranks_positions"] == 9
    assert bs["prefill_lane_eager"] == 1 and bs["prefill_lane_tokens"] == len(prompt)
    assert "delayed mode" in st["backend_detail"]

    # extending it: the prefix (decoded on the ranks) is reused, only the new positions go to the ranks
    p2 = fed + [r1.token_ids[-1], 11, 12]
    r2 = e.complete(p2, max_new_tokens=5, stop_ids=NONE)
    assert r2.reused_tokens == len(fed) and r2.token_ids == greedy(ref, p2, 5)
    assert fake.reads_ok == [True, True]
    assert e.stats()["backend_stats"]["kv_to_ranks_positions"] == len(prompt) + 3


def test_delayed_prefix_copy_cancel_and_healing_step(lane_tp_engine):
    e, b, fake, ref = lane_tp_engine
    a = list(range(10, 40))
    e.complete(list(range(100, 125)), max_new_tokens=4, stop_ids=NONE)
    e.complete(a, max_new_tokens=4, stop_ids=NONE)
    y = a[:8] + [150, 151]              # acquire copies 8 positions of a's slot into the other one
    r = e.complete(y, max_new_tokens=4, stop_ids=NONE)
    assert r.token_ids == greedy(ref, y, 4) and all(fake.reads_ok) and len(fake.reads_ok) == 3

    cancel = threading.Event()
    n = 0
    for _ in e.generate(list(range(60, 80)), max_new_tokens=30, stop_ids=NONE, cancel=cancel):
        n += 1
        if n == 3:
            cancel.set()
    assert e.last_result.finish_reason == "cancelled" and b.stats["cancelled"] == 1
    slot = next(i for i, s in enumerate(e.cache.slots) if s.ids[:20] == list(range(60, 80)))
    assert b.mirror.valid[slot] == 20 + fake.count()
    fed = e.cache.slots[slot].ids
    p = fed + [9]
    r = e.complete(p, max_new_tokens=3, stop_ids=NONE)
    assert r.token_ids == greedy(ref, p, 3) and all(fake.reads_ok)

    # the healing path's single decode() step: logits equal the reference's next-token logits
    s2 = next(i for i, s in enumerate(e.cache.slots) if s.ids[:len(p)] == p)
    pos = len(e.cache.slots[s2].ids)
    logits = b.decode(s2, 5, pos)
    want = ref(e.cache.slots[s2].ids + [5])[-1]
    torch.testing.assert_close(logits, want, rtol=1e-4, atol=1e-4)


# ---- refusals ----
def test_mode_and_checkpoint_mismatches_are_refused(lane_dirs, tiny_qwen):
    d = str(lane_dirs["delay1"])
    with pytest.raises(TPModeError, match="Use tp_mode='delayed'"):
        Engine.load(d, device="cpu")
    with pytest.raises(TPModeError, match="trained for 2 lanes; tp=4"):
        Engine.load(d, device="cpu", tp=4, tp_mode="delayed")
    with pytest.raises(TPModeError, match="Use tp_mode='exact'"):
        Engine.load(str(tiny_qwen), device="cpu", tp_mode="delayed")
    with pytest.raises(TPUnavailable, match="tp=2 needs 2 CUDA GPUs"):
        Engine.load(d, device="cpu", tp=2, tp_mode="delayed")
    sm = load_lane_serving(lane_dirs["delay1"], max_len=32)
    with pytest.raises(TPModeError, match="Use tp_mode='delayed'"):
        Engine(sm, None, tp=1, tp_mode="exact")


def test_tp2_delayed_on_cpu_reaches_the_tp_backend_and_is_refused_with_reasons(lane_dirs, monkeypatch):
    monkeypatch.setattr(backends, "check_tp", lambda tp, mode, dev: None)
    monkeypatch.setattr(backends, "_precheck", lambda name, model: None)
    with pytest.raises(TPUnavailable, match=r"no backend can run tp=2 tp_mode=delayed.*monokernel unsupported: needs "
                                            r"a CUDA device.*graph does not support tp=2"):
        Engine.load(str(lane_dirs["delay1"]), device="cpu", tp=2, tp_mode="delayed")


def test_backend_refuses_lane_shapes_the_kernel_cannot_run(tmp_path, monkeypatch):
    import kernels.tp_runtime as tpr
    monkeypatch.setattr(TPMonokernelBackend, "supported", staticmethod(lambda cfg, dev: (True, "ok")))
    d = make_tiny_lane_checkpoint(tmp_path / "lanehead", lm_head_type="lane")
    sm = load_lane_serving(d, max_len=32)
    cache = KVCache(1, sm.cfg.n_layers, sm.cfg.n_kv_heads, 32, sm.cfg.head_dim, dtype=torch.bfloat16)
    with pytest.raises(BackendUnavailable, match="tp=2: lm_head_type 'lane'"):
        TPMonokernelBackend(sm, cache, tp=2, tp_mode="delayed")

    class ExactOnly:
        def __init__(self, model, devices, max_len=4096, slots=1, max_steps=4096, vocab_parallel=True):
            pass
    monkeypatch.setattr(tpr, "TPMonokernel", ExactOnly)
    with pytest.raises(BackendUnavailable, match="exact mode only"):
        TPMonokernelBackend(sm, cache, tp=2, tp_mode="delayed")


def test_lane_rank_config_is_one_lane_llama_shape(lane_dirs):
    sm = load_lane_serving(lane_dirs["delay1"], max_len=32)
    c = lane_rank_config(sm.cfg)
    lc = sm.lane_config
    assert (c.arch, c.n_heads, c.n_kv_heads, c.intermediate_size, c.head_dim) == \
        ("llama", lc.heads_per_lane, lc.kv_heads_per_lane, lc.ffn_per_lane, lc.head_dim)
    assert lane_rank_config(SimpleNamespace(arch="llama")) is None


def test_bf16_weights_compute_in_fp32(lane_dirs):
    """What a GPU engine loads: bf16 weights and KV cache (the kernel's), fp32 lane activations."""
    from engine.lanes import LaneModel
    sm = load_lane_serving(lane_dirs["delay2-vocab-head"], dtype=torch.bfloat16, max_len=32)
    assert sm.dtype == torch.bfloat16 and sm.lane.dtype == torch.float32
    assert all(t.dtype == torch.bfloat16 for t in sm.lane.w.values())
    m32 = LaneModel(sm.lane_config, {k: t.float() for k, t in sm.lane.w.items()})    # the same values in fp32
    ids = [5, 60, 7, 200, 31, 9]
    assert torch.equal(sm.lane(ids), m32(ids))
    k = torch.zeros(1, sm.cfg.n_layers, sm.cfg.n_kv_heads, 32, sm.cfg.head_dim, dtype=torch.bfloat16)
    v = k.clone()
    sm.forward(k, v, 0, torch.tensor(ids[:4]), 0)
    last = sm.forward(k, v, 0, torch.tensor(ids[4:]), 4, all_logits=True)    # reads the bf16-stored prefix
    want = m32(ids)[4:]
    assert ((last - want).norm() / want.norm()).item() < 1e-2
