"""Tensor-parallel monokernel (exact mode) on KOG_TEST_TP GPUs (default 2), Qwen2.5-Coder-1.5B shape with random
weights (kv head split on 2 GPUs, group split on 4 or 8): teacher-forced logits vs the fp32 reference at every step
(vocabulary-parallel LM head), bit-identical logits on all ranks with the replicated LM head (= bit-identical
residual streams) and equal to the vocabulary-parallel ones, bit-identical reruns, the tp_size 1 path bit-identical
to the single-GPU Monokernel, cancellation, sampling agreement, and a watchdog report when a peer stops. Skips
cleanly without KOG_TEST_TP sm_90 GPUs.

Device run: NCCL_NVLS_ENABLE=0 python3 -m pytest -q -s tests/gpu/test_tp_monokernel.py
(4 ranks: KOG_TEST_TP=4 NCCL_NVLS_ENABLE=0 python3 -m pytest -q -s tests/gpu/test_tp_monokernel.py)"""
from __future__ import annotations

import time

import pytest
import torch
from tp_gpus import DEVS, TP, needs_tp_gpus  # tests/gpu is on sys.path under pytest (rootdir conftest)

pytestmark = needs_tp_gpus

SHAPE = "qwen2.5-coder-1.5b"
PROMPT, STEPS, ML = 64, 128, 1024
D0 = DEVS[0]


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


class Setup:
    def __init__(self, seed=0):
        from engine.config import preset
        from kernels.testing import random_model, upcast
        from kernels.tp_runtime import TPMonokernel
        self.cfg = cfg = preset(SHAPE)
        self.m16 = random_model(cfg, device="cuda:0", max_len=ML, seed=seed)
        self.m32 = upcast(self.m16)
        shape = (1, cfg.n_layers, cfg.n_kv_heads, ML, cfg.head_dim)
        self.k32 = torch.zeros(shape, device=D0)
        self.v32 = torch.zeros(shape, device=D0)
        g = torch.Generator(device="cpu").manual_seed(seed + 1)
        self.ids = torch.randint(0, cfg.vocab_size, (PROMPT + STEPS,), generator=g)
        self.m32.forward(self.k32, self.v32, 0, self.ids[:PROMPT].cuda(), 0)
        # the bf16 cache the kernels start from: prompt positions filled, the rest NaN (a stray read shows up)
        self.k16 = torch.full(shape, float("nan"), device=D0, dtype=torch.bfloat16)
        self.v16 = torch.full(shape, float("nan"), device=D0, dtype=torch.bfloat16)
        self.k16[:, :, :, :PROMPT] = self.k32[:, :, :, :PROMPT].bfloat16()
        self.v16[:, :, :, :PROMPT] = self.v32[:, :, :, :PROMPT].bfloat16()
        t0 = time.perf_counter()
        self.tp = TPMonokernel(self.m16, DEVS, max_len=ML, slots=1)
        assert self.tp.vocab_parallel
        self.tp_rep = TPMonokernel(self.m16, DEVS, max_len=ML, slots=1, vocab_parallel=False)
        print(f"\n{self.tp.plan.describe()}; two TP instances built in {time.perf_counter() - t0:.1f} s")

    def restore(self, tp=None):
        (tp or self.tp).load_cache(self.k16, self.v16)

    def forced(self, n=STEPS):
        return self.ids[PROMPT:PROMPT + n].tolist()

    def run_forced(self, n=STEPS):
        """Vocabulary-parallel head: -> (tokens, logits on rank 0) of a teacher-forced run from the prompt cache."""
        self.restore()
        out = torch.full((n, self.cfg.vocab_size), float("nan"), device=D0)
        f = self.forced(n)
        toks, reason = self.tp.run(0, f[0], PROMPT, n, forced=f, logits_out=out)
        assert reason == "length" and len(toks) == n, (reason, len(toks), self.tp.debug_state())
        return toks, out

    def run_forced_replicated(self, n=STEPS):
        """Replicated head: -> (tokens, [rank r's logits on its GPU for r in range(TP)])."""
        self.restore(self.tp_rep)
        V = self.cfg.vocab_size
        outs = [torch.full((n, V), float("nan"), device=d) for d in DEVS]
        f = self.forced(n)
        toks, reason = self.tp_rep.run(0, f[0], PROMPT, n, forced=f, rank_logits=outs)
        assert reason == "length" and len(toks) == n, (reason, len(toks), self.tp_rep.debug_state())
        return toks, outs


_setup: list[Setup] = []


def setup() -> Setup:
    if not _setup:
        _setup.append(Setup())
    return _setup[0]


@pytest.mark.parametrize("vocab_parallel", [False, True])
def test_small_shape_smoke(vocab_parallel):
    """First and fast: a 4-layer Qwen-like shape (tests/gpu/shapes.py) for 8 teacher-forced steps, so a broken
    exchange shows up in seconds with per-step errors (and, on a hang, the watchdog's per-rank report)."""
    from kernels.testing import random_model, upcast
    from kernels.tp_runtime import TPMonokernel
    from shapes import SHAPES as SMALL   # tests/gpu is on sys.path under pytest (rootdir conftest)
    cfg = SMALL["qwen"]
    P, n, ml = 16, 8, 64
    m16 = random_model(cfg, device="cuda:0", max_len=ml, seed=7)
    m32 = upcast(m16)
    shape = (1, cfg.n_layers, cfg.n_kv_heads, ml, cfg.head_dim)
    k32, v32 = torch.zeros(shape, device=D0), torch.zeros(shape, device=D0)
    ids = torch.randint(0, cfg.vocab_size, (P + n,), generator=torch.Generator().manual_seed(8)).cuda()
    m32.forward(k32, v32, 0, ids[:P], 0)
    k16 = torch.full(shape, float("nan"), device=D0, dtype=torch.bfloat16)
    v16 = torch.full(shape, float("nan"), device=D0, dtype=torch.bfloat16)
    k16[:, :, :, :P], v16[:, :, :, :P] = k32[:, :, :, :P].bfloat16(), v32[:, :, :, :P].bfloat16()
    ref = torch.stack([m32.forward(k32, v32, 0, ids[P + j:P + j + 1], P + j) for j in range(n)])
    tp = TPMonokernel(m16, DEVS, max_len=ml, slots=1, max_steps=64, vocab_parallel=vocab_parallel)
    tp.load_cache(k16, v16)
    out = torch.full((n, cfg.vocab_size), float("nan"), device=D0)
    toks, reason = tp.run(0, int(ids[P]), P, n, forced=ids[P:].tolist(), logits_out=out, timeout_s=30)
    errs = [rel(out[j], ref[j]) for j in range(n)]
    print(f"\nsmall shape tp={TP} ({'vocab-parallel' if vocab_parallel else 'replicated'} head): {reason}, "
          f"per-step rel L2 {['%.1e' % e for e in errs]}; exchange wait {tp.exchange_wait_us()}")
    assert reason == "length" and len(toks) == n
    assert max(errs) <= 1e-2


def test_teacher_forced_logits_match_fp32_reference():
    s = setup()
    ref = torch.stack([s.m32.forward(s.k32, s.v32, 0, s.ids[PROMPT + j:PROMPT + j + 1].cuda(), PROMPT + j)
                       for j in range(STEPS)])
    t0 = time.perf_counter()
    toks, out0 = s.run_forced()
    dt = time.perf_counter() - t0
    errs = [rel(out0[j], ref[j]) for j in range(STEPS)]
    print(f"tp={TP} teacher-forced rel L2 max {max(errs):.2e} mean {sum(errs) / len(errs):.2e} "
          f"({STEPS} steps, {dt * 1e3:.1f} ms incl. launch); exchange wait {s.tp.exchange_wait_us()}")
    print("per-step rel L2: " + " ".join(f"{j}:{e:.1e}" for j, e in enumerate(errs)))
    nan_rows = torch.isnan(out0).any(dim=1).nonzero()[:8, 0].tolist()
    if nan_rows:   # which vocabulary slices (ranks) left NaN: their logits did not arrive
        bad = [r for r, sh in enumerate(s.tp.plan.ranks) if torch.isnan(out0[:, sh.vocab[0]:sh.vocab[1]]).any()]
        print(f"NaN at steps {nan_rows}: vocabulary slices of ranks {bad} (of {TP}) hold NaN")
    assert not nan_rows
    assert max(errs) <= 1e-2, [(j, e) for j, e in enumerate(errs) if e > 1e-2][:5]
    picked = out0.gather(1, torch.tensor(toks, device=D0)[:, None])[:, 0]
    assert torch.equal(picked, out0.max(dim=1).values), "greedy token is not a maximal logit"
    # each rank's KV heads written at the decoded positions, untouched beyond
    end = PROMPT + STEPS
    for r in range(TP):
        k0, k1 = s.tp.plan.ranks[r].kv_heads
        kr, vr = s.tp.k_caches[r].to(D0), s.tp.v_caches[r].to(D0)
        ek = rel(kr[:, :, :, PROMPT:end].float(), s.k32[:, :, k0:k1, PROMPT:end])
        ev = rel(vr[:, :, :, PROMPT:end].float(), s.v32[:, :, k0:k1, PROMPT:end])
        print(f"rank {r} KV heads {k0}-{k1 - 1}: rel L2 K {ek:.2e} V {ev:.2e}")
        assert ek < 1e-2 and ev < 1e-2
        assert torch.isnan(kr[:, :, :, end:].float()).all() and torch.isnan(vr[:, :, :, end:].float()).all()
    # a rerun is bit-identical (a moving result would be a race in the exchange)
    toks2, o0 = s.run_forced()
    assert toks2 == toks and torch.equal(o0, out0)


def test_replicated_head_ranks_bit_identical_and_equal_to_vocab_parallel():
    """With the replicated LM head each rank computes all logits from its own residual stream: equal bits on all
    ranks prove the streams are bit-identical. The vocabulary-parallel head computes each row with the same
    arithmetic from the same residual: its logits must equal these bit for bit."""
    s = setup()
    n = 64
    toks, outs = s.run_forced_replicated(n)
    r0 = outs[0]
    for r in range(1, TP):
        same = [torch.equal(r0[j], outs[r][j].to(D0)) for j in range(n)]
        assert all(same), f"rank {r}'s logits differ from rank 0's from step {same.index(False)} on"
    toks_vp, vp = s.run_forced(n)
    diff = [j for j in range(n) if not torch.equal(vp[j], r0[j])]
    print(f"\nreplicated vs vocabulary-parallel head: {n - len(diff)}/{n} steps bit-identical")
    assert not diff, f"steps {diff[:8]} differ, max |diff| {(vp - r0).abs().max().item():.3e}"
    assert toks == toks_vp


def test_tp_close_to_single_gpu_monokernel_and_tp1_is_bit_identical():
    """tp=KOG_TEST_TP differs from the single-GPU kernel only by summation order; a TPMonokernel on one GPU runs
    the single-GPU code path (tp_size 1): not one bit may differ from Monokernel with the same (one-set) matvec loop
    and schedule (GATEUP + DOWN: the tensor-parallel build has no fused MLP)."""
    from kernels.runtime import Monokernel
    from kernels.tp_runtime import TPMonokernel
    s = setup()
    n = 32
    f = s.forced(n)
    V = s.cfg.vocab_size
    k, v = s.k16.clone(), s.v16.clone()
    mk = Monokernel(s.m16, k, v, max_steps=256, fused_mlp=False)   # the TP build's stages
    single = torch.empty(n, V, device=D0)
    mk.run(0, f[0], PROMPT, n, forced=f, logits_out=single)
    _, out0 = s.run_forced(n)
    errs = [rel(out0[j], single[j]) for j in range(n)]
    print(f"\ntp={TP} vs single-GPU monokernel: rel L2 max {max(errs):.2e}")
    assert max(errs) < 5e-3
    tp1 = TPMonokernel(s.m16, [D0], max_len=ML, slots=1, max_steps=256)
    tp1.load_cache(s.k16, s.v16)
    one = torch.empty(n, V, device=D0)
    tp1.run(0, f[0], PROMPT, n, forced=f, logits_out=one)
    assert torch.equal(one, single), "tp_size 1 changed bits"
    del tp1, mk
    torch.cuda.empty_cache()


def test_cancel_mid_run_and_sampling_agree_on_all_ranks():
    s = setup()
    tp = s.tp
    s.restore()
    tp.launch(0, int(s.ids[PROMPT]), PROMPT, 900)
    t0 = time.monotonic()
    while tp.count() < 20:
        assert time.monotonic() - t0 < 10, f"no tokens streamed: {tp.debug_state()}"
        time.sleep(1e-4)
    tp.cancel()
    tp.wait(timeout_s=10)
    n = tp.count()
    print(f"\ncancel: stopped after {n} of 900 tokens; reasons {[mk.reason() for mk in tp.ranks]}")
    assert all(mk.reason() == "cancelled" for mk in tp.ranks) and 20 <= n < 900
    for r in range(1, TP):
        assert tp.rank_tokens(r) == tp.rank_tokens(0), r
    runs = []
    for seed in (5, 5, 6):
        s.restore()
        runs.append(tp.run(0, int(s.ids[PROMPT]), PROMPT, 32, temperature=0.8, top_p=0.9, seed=seed)[0])
    assert runs[0] == runs[1] and runs[0] != runs[2]


def test_watchdog_reports_a_peer_that_stopped_and_next_launch_recovers():
    """The last rank is told to stop after 8 steps while the others go on: rank 0 starves at step 8 waiting for
    the last rank's partials, its watchdog aborts it (about 1 s) and the report names the stuck counter and its
    value on every rank. The next launch must run normally."""
    s = setup()
    tp = s.tp
    last = TP - 1
    mk_last = tp.ranks[last]
    orig = mk_last.params

    def short(*a, **kw):
        p = orig(*a, **kw)
        p.n_steps = 8
        return p

    s.restore()
    mk_last.params = short
    try:
        with pytest.raises(RuntimeError, match="watchdog") as ei:
            tp.run(0, int(s.ids[PROMPT]), PROMPT, 64, timeout_s=30)
    finally:
        del mk_last.params
    print(f"\nwatchdog report: {ei.value}")
    st = tp.debug_state()
    print(f"debug state: {st}")
    # with more than 2 ranks the others may starve too, at steps of their own: only these two are certain
    assert st[last]["reason"] == "length", st
    assert st[0]["reason"] == "watchdog" and st[0]["wd_step"] == 8, st
    toks, o0 = s.run_forced(16)
    assert len(toks) == 16 and not torch.isnan(o0).any()
