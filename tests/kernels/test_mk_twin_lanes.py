"""Delayed mode of the tensor-parallel twin (kernels/twin_tp.py with a LanePlan): rank l runs lane l of a tiny
random Laneformer lane model with the exchange of kernels/csrc/mk_exchange.cuh (delayed mode), in random
(rank, SM) order; its logits must equal the engine/lanes reference (the truth) for every reduce-mode rule
(delay, use_early_comm, use_comm, ambiguity A1, per-lane gains, both LM-head kinds), and its tags must catch a
peer wait that is too weak."""
import pytest
import torch

from engine.lanes import LaneConfig, LaneModel
from engine.model import rope_inv_freq
from engine.testing_lanes import random_lane_weights, tiny_lane_config
from engine.tp.shard import ShardError
from kernels import isa, schedule
from kernels.tp_local import lane_cache, lane_plan, lane_rank_model
from kernels.twin import ScheduleError
from kernels.twin_tp import TwinTP

PROMPT, STEPS, MAX_LEN = 5, 4, 16


def _setup(n_sm=4, seed=0, lanes=2, **cfg_kw):
    overrides = {k: cfg_kw.pop(k) for k in list(cfg_kw) if k == "early_queue"}
    cfg = LaneConfig.from_dict(tiny_lane_config(lanes, **cfg_kw), **overrides)
    ref = LaneModel(cfg, random_lane_weights(cfg, seed=seed))
    plan = lane_plan(cfg, lanes, max_len=MAX_LEN)
    models = [lane_rank_model(cfg, ref.w, plan, r) for r in range(lanes)]
    scheds = schedule.with_lanes([schedule.build(schedule.Dims.of(m.cfg), n_sm=n_sm) for m in models])
    for s in scheds:
        schedule.check(s)
    twin = TwinTP(models, scheds, rope_inv_freq(models[0].cfg), lanes=plan)
    return cfg, ref, plan, twin


def _run(cfg, ref, twin, seed=0, order_seed=0):
    """Teacher-forced twin logits after a reference prefill of PROMPT tokens, and the reference's logits."""
    ids = torch.randint(0, cfg.vocab_size, (PROMPT + STEPS,), generator=torch.Generator().manual_seed(seed)).tolist()
    cache = ref.new_cache()
    ref(ids[:PROMPT], cache)
    ks, vs = zip(*(lane_cache(cache, cfg, r, MAX_LEN, slots=2, slot=1) for r in range(cfg.num_lanes)))
    want = torch.stack([ref([t], cache)[0] for t in ids[PROMPT:]])
    forced = ids[PROMPT:]
    res = twin.run(list(ks), list(vs), 1, forced[0], PROMPT, STEPS, forced=forced, order_seed=order_seed,
                   attn_min_pos=3)
    return res, want


CASES = {
    "delay1": {},
    "delay2": dict(broadcast_delay=2),
    "delay2-no-early-comm": dict(broadcast_delay=2, use_early_comm=False),
    "delay2-not-queued": dict(broadcast_delay=2, early_queue=False),
    "no-comm": dict(broadcast_delay=1, use_comm=False),
    "lane-gains-vocab-head": dict(replicated_rmsn_scale=False, lm_head_type="vocab_parallel"),
    "vocab-head-delay2": dict(broadcast_delay=2, lm_head_type="vocab_parallel"),
    "all-present": dict(broadcast_delay=4),
    "4-lanes": dict(lanes=4, broadcast_delay=2),
    "rope-scaling": dict(rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                       "high_freq_factor": 4.0, "original_max_position_embeddings": 8}),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("n_sm", [3, 7])
def test_delayed_twin_equals_lane_reference(case, n_sm):
    cfg, ref, plan, twin = _setup(n_sm=n_sm, **CASES[case])
    res, want = _run(cfg, ref, twin, order_seed=n_sm)
    for r, rr in enumerate(res.ranks):
        assert rr.steps_run == STEPS and rr.finish == "length"
        # the LM head is exchanged: every rank holds all logits and samples the same tokens
        assert torch.equal(rr.logits, res.ranks[0].logits) and rr.tokens == res.ranks[0].tokens
    for s in range(STEPS):
        err = ((res.ranks[0].logits[s] - want[s]).norm() / want[s].norm()).item()
        assert err < 1e-4, (case, s, err)


def test_lane_modes_differ_from_exact_sum():
    """The reference's delayed logits are far from the all-PRESENT ones (the twin test is not vacuous)."""
    cfg, ref, _, twin = _setup()
    res, want = _run(cfg, ref, twin)
    ref_p = LaneModel(cfg.with_overrides(broadcast_delay=cfg.num_layers), ref.w)
    ids_same = _run(cfg.with_overrides(broadcast_delay=cfg.num_layers), ref_p,
                    _setup(broadcast_delay=cfg.num_layers)[3])[1]
    assert ((want - ids_same).norm() / want.norm()).item() > 0.05


def test_plan_modes_and_refusals():
    cfg = LaneConfig.from_dict(tiny_lane_config(2, broadcast_delay=2, use_early_comm=False))
    p = lane_plan(cfg, 2, max_len=MAX_LEN)
    assert p.modes[:4] == [isa.LANE_NO_REDUCE] * 4 and p.modes[4:] == [isa.LANE_PAST] * 4 and p.agg == 1
    with pytest.raises(ShardError, match="one lane per GPU"):
        lane_plan(cfg, 4)
    with pytest.raises(ShardError, match="'replicate'"):
        lane_plan(LaneConfig.from_dict(tiny_lane_config(2, lm_head_type="lane")), 2)
    swa = LaneConfig.from_dict(tiny_lane_config(2, sliding_window=8, sliding_window_n_layers=2))
    with pytest.raises(ShardError, match="sliding-window"):
        lane_plan(swa, 2, max_len=64)
    assert lane_plan(swa, 2, max_len=8).n_lanes == 2


def test_too_weak_peer_wait_is_caught():
    """A PAST consumer that does not wait for the peers' partials of layer i - delay reads a stale receive buffer:
    the twin's tags report it."""
    cfg, ref, plan, twin = _setup(n_sm=5)
    twin._lane_wait = lambda op, layer: None
    with pytest.raises(ScheduleError):
        for seed in range(6):
            _run(cfg, ref, twin, order_seed=seed)


def test_tp_monokernel_refuses_mode_and_checkpoint_mismatch():
    """Checked before any GPU is touched: a lane model needs mode='delayed', an ordinary model mode='exact'."""
    from engine.lanes import TPModeError
    from kernels.testing import tiny_cfg, tiny_model
    from kernels.tp_runtime import TPMonokernel
    _, ref, _, _ = _setup()
    with pytest.raises(TPModeError, match="Use tp_mode='delayed'"):
        TPMonokernel(ref, ["cuda:0", "cuda:1"])
    with pytest.raises(TPModeError, match="Use tp_mode='exact'"):
        TPMonokernel(tiny_model(tiny_cfg()), ["cuda:0", "cuda:1"], mode="delayed")
    with pytest.raises(TPModeError, match="unknown tp_mode"):
        TPMonokernel(ref, ["cuda:0", "cuda:1"], mode="lanes")
