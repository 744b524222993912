"""Tensor-parallel monokernel in delayed mode (Laneformer lanes, GPU l runs lane l) on KOG_TEST_TP GPUs (default 2)
with random lane weights: teacher-forced logits vs the fp32 engine/lanes reference (the truth) at every step, tokens
equal on all ranks (the LM head is exchanged), the lanes' residual streams bit-identical exactly where the reference
makes them equal (every layer PRESENT) and different otherwise, bit-identical reruns, and the exchange wait
(kernel-measured, peer waits only). The main test's lanes are Qwen2.5-Coder-1.5B-sized, or Llama-3.2-1B-sized where
the lane count does not divide the 1.5B's 2 KV heads (4 or 8 lanes); the small tests' shape is widened for 8 lanes
(tp_gpus.small_lane_shape). Skips cleanly without KOG_TEST_TP sm_90 GPUs.

Device run: NCCL_NVLS_ENABLE=0 python3 -m pytest -q -s tests/gpu/test_tp_delayed.py
(4 ranks: KOG_TEST_TP=4 NCCL_NVLS_ENABLE=0 python3 -m pytest -q -s tests/gpu/test_tp_delayed.py)"""
from __future__ import annotations

import time

import pytest
import torch
from tp_gpus import DEVS, TP, big_lane_preset, needs_tp_gpus, small_lane_shape  # tests/gpu is on sys.path

pytestmark = needs_tp_gpus

D0 = DEVS[0]


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


class LaneSetup:
    """A random bf16 lane model on cuda:0, its fp32 reference (same values), a reference prefill of P tokens, the
    bf16 kernel cache holding it (other positions NaN) and a delayed-mode TPMonokernel on cuda:0 .. TP-1."""

    def __init__(self, dense_cfg, P: int, n: int, ml: int, seed: int = 0, **lane_kw):
        from engine.lanes import LaneModel
        from kernels.testing import lane_config_like, random_lane_weights_on
        from kernels.tp_local import lane_cache
        from kernels.tp_runtime import TPMonokernel
        self.name = dense_cfg.name
        self.cfg = cfg = lane_config_like(dense_cfg, TP, **lane_kw)
        w16 = random_lane_weights_on(cfg, device="cuda:0", seed=seed)
        self.m16 = LaneModel(cfg, w16)
        self.m32 = LaneModel(cfg, {k: v.float() for k, v in w16.items()})
        g = torch.Generator().manual_seed(seed + 1)
        self.ids = torch.randint(0, cfg.vocab_size, (P + n,), generator=g).tolist()
        self.P, self.n = P, n
        cache = self.m32.new_cache()
        self.m32(self.ids[:P], cache)
        parts = [lane_cache(cache, cfg, r, ml, dtype=torch.bfloat16, device=D0) for r in range(cfg.num_lanes)]
        self.k16 = torch.cat([k for k, _ in parts], dim=2)   # lanes' KV heads, lane-major
        self.v16 = torch.cat([v for _, v in parts], dim=2)
        self.ref = torch.stack([self.m32([t], cache)[0] for t in self.ids[P:P + n]])
        t0 = time.perf_counter()
        self.tp = TPMonokernel(self.m16, DEVS, max_len=ml, slots=1, max_steps=max(n, 16) + 1, mode="delayed")
        print(f"\n{self.tp.lanes.describe()}; built in {time.perf_counter() - t0:.1f} s")

    def run(self):
        """-> (tokens, rank 0's logits [n, V]) of a teacher-forced run from the prefilled cache."""
        self.tp.load_cache(self.k16, self.v16)
        out = torch.full((self.n, self.cfg.vocab_size), float("nan"), device=D0)
        f = self.ids[self.P:]
        toks, reason = self.tp.run(0, f[0], self.P, self.n, forced=f, logits_out=out, timeout_s=60)
        assert reason == "length" and len(toks) == self.n, (reason, len(toks), self.tp.debug_state())
        return toks, out

    def lanes_equal(self) -> bool:
        """The lanes' residual streams after the last step bit-identical (x holds everything up to the last
        attention's update)."""
        xs = [mk.x.cpu() for mk in self.tp.ranks]
        return all(torch.equal(xs[0], x) for x in xs[1:])


SMALL_CASES = {
    "delay1-replicate": dict(),
    "delay2-no-early-comm-vocab-head": dict(broadcast_delay=2, use_early_comm=False, lm_head_type="vocab_parallel"),
    "lane-gains-vocab-head": dict(replicated_rmsn_scale=False, lm_head_type="vocab_parallel"),
    "delay2-not-queued": dict(broadcast_delay=2, early_queue=False),
    "all-present": dict(broadcast_delay=4),
}


@pytest.mark.parametrize("case", list(SMALL_CASES))
def test_small_lane_shape(case):
    """First and fast: a 4-layer shape (tests/gpu/shapes.py 'llama' sizes, widened for 8 lanes) for 8 teacher-forced
    steps per reduce-mode rule, so a broken rule shows up in seconds with per-step errors."""
    s = LaneSetup(small_lane_shape(TP), P=16, n=8, ml=64, seed=3, **SMALL_CASES[case])
    toks, out = s.run()
    errs = [rel(out[j], s.ref[j]) for j in range(s.n)]
    print(f"{case}: per-step rel L2 {['%.1e' % e for e in errs]}; exchange wait {s.tp.exchange_wait_us()}")
    assert not torch.isnan(out).any()
    assert max(errs) <= 1e-2
    # the reference's streams are equal only while every layer is PRESENT
    assert s.lanes_equal() == (case == "all-present")


_big: list[LaneSetup] = []


def big() -> LaneSetup:
    if not _big:
        from engine.config import preset
        name = big_lane_preset(TP, broadcast_delay=2)
        print(f"\n{TP} lanes of {name}")
        _big.append(LaneSetup(preset(name), P=32, n=64, ml=512, seed=0, broadcast_delay=2))
    return _big[0]


def test_big_lanes_teacher_forced_match_fp32_reference():
    s = big()
    t0 = time.perf_counter()
    toks, out = s.run()
    dt = time.perf_counter() - t0
    errs = [rel(out[j], s.ref[j]) for j in range(s.n)]
    print(f"delayed tp={TP} {s.name} lanes: rel L2 max {max(errs):.2e} mean {sum(errs) / len(errs):.2e} "
          f"({s.n} steps, {dt * 1e3:.1f} ms incl. launch); exchange wait {s.tp.exchange_wait_us()}")
    print("per-step rel L2: " + " ".join(f"{j}:{e:.1e}" for j, e in enumerate(errs)))
    assert not torch.isnan(out).any()
    assert max(errs) <= 1e-2, [(j, e) for j, e in enumerate(errs) if e > 1e-2][:5]
    assert not s.lanes_equal(), "delay 2 must give the lanes different residual streams"


def test_big_lanes_rerun_bit_identical():
    s = big()
    t1, o1 = s.run()
    t2, o2 = s.run()
    assert t1 == t2 and torch.equal(o1, o2)
    for r in range(1, TP):
        assert s.tp.rank_tokens(r) == t2, r


def test_greedy_decode_exchange_wait():
    """Free-running greedy decode (16 steps from the prompt): every rank samples the same tokens (TPMonokernel.run
    checks) and the per-token time and peer wait are printed (the wait should be near 0: a peer is rarely
    `delay` layers behind)."""
    s = big()
    s.tp.load_cache(s.k16, s.v16)
    t0 = time.perf_counter()
    toks, reason = s.tp.run(0, s.ids[s.P], s.P, 16)
    assert reason == "length" and len(toks) == 16
    dt = (time.perf_counter() - t0) / 16
    print(f"delayed greedy: {dt * 1e6:.0f} us/token incl. launch (16 steps); exchange wait {s.tp.exchange_wait_us()}")
