"""The tensor-parallel twin (kernels/twin_tp.py) runs N ranks' instruction lists with the peer exchange of
kernels/csrc/mk_exchange.cuh in random (rank, SM) order: it must equal the reference model, keep every rank's
logits and tokens bit-identical, stop every rank at the same step on cancel, and its tags must catch an
exchange wait that does not count the peers' producers."""
import pytest
import torch

from engine.model import rope_inv_freq
from engine.tp.shard import ShardError
from kernels import isa, schedule
from kernels.testing import fresh_cache, tiny_cfg, tiny_model
from kernels.tp_local import kernel_plan, rank_model, shard_cache
from kernels.twin import ScheduleError, Twin
from kernels.twin_tp import TwinTP

SHAPES = {
    "qwen2-gqa2": dict(arch="qwen2"),                                          # 4 q / 2 kv, ffn 96
    "llama-gqa4": dict(arch="llama", n_heads=8, n_kv_heads=2, head_dim=8, tie_word_embeddings=False),
    "llama-mqa": dict(arch="llama", n_heads=4, n_kv_heads=1),                  # KV head replicated on every rank
    "llama-mha8": dict(arch="llama", n_heads=8, n_kv_heads=8, head_dim=8, intermediate_size=128),   # 8 ranks
}
PROMPT, STEPS = 7, 5


def _setup(shape, n, n_sm, seed=0, vp=False):
    cfg = tiny_cfg(**SHAPES[shape])
    model = tiny_model(cfg, seed=seed)
    plan = kernel_plan(cfg, n)
    ids = torch.randint(0, cfg.vocab_size, (PROMPT + STEPS,), generator=torch.Generator().manual_seed(seed)).tolist()
    k, v = fresh_cache(cfg, slots=2)
    model.forward(k, v, 1, torch.tensor(ids[:PROMPT]), 0)
    models = [rank_model(model, plan, r, vocab_parallel=vp) for r in range(n)]
    scheds = schedule.with_exchange([schedule.build(schedule.Dims.of(m.cfg), n_sm=n_sm) for m in models],
                                    lm_parallel=vp)
    for s in scheds:
        schedule.check(s)
    twin = TwinTP(models, scheds, rope_inv_freq(cfg),
                  vocab_offsets=[s.vocab[0] for s in plan.ranks] if vp else None)
    return cfg, model, plan, ids, k, v, twin


def _rank_caches(plan, k, v):
    return ([shard_cache(k, plan, r) for r in range(plan.n_ranks)],
            [shard_cache(v, plan, r) for r in range(plan.n_ranks)])


@pytest.mark.parametrize("shape,n,vp", [("qwen2-gqa2", 1, False), ("qwen2-gqa2", 2, False), ("qwen2-gqa2", 4, False),
                                        ("llama-gqa4", 2, False), ("llama-mqa", 2, False), ("llama-mqa", 4, False),
                                        ("qwen2-gqa2", 2, True), ("llama-gqa4", 2, True), ("llama-mqa", 4, True),
                                        ("llama-mha8", 8, True)])
@pytest.mark.parametrize("n_sm", [3, 8])
def test_teacher_forced_logits_equal_reference(shape, n, vp, n_sm):
    """vp: vocabulary-parallel LM head (each rank its slice; records and logits exchanged)."""
    cfg, model, plan, ids, k, v, twin = _setup(shape, n, n_sm, vp=vp)
    ks, vs = _rank_caches(plan, k, v)
    forced = ids[PROMPT:]
    ref = torch.stack([model.forward(k, v, 1, torch.tensor([t]), PROMPT + j) for j, t in enumerate(forced)])
    res = twin.run(ks, vs, 1, forced[0], PROMPT, STEPS, forced=forced, order_seed=n_sm + n, attn_min_pos=3)
    for r, rr in enumerate(res.ranks):
        assert rr.steps_run == STEPS and rr.finish == "length"
        assert torch.equal(rr.logits, res.ranks[0].logits), f"rank {r} logits differ from rank 0"
        assert rr.tokens == res.ranks[0].tokens
    for s in range(STEPS):
        err = ((res.ranks[0].logits[s] - ref[s]).norm() / ref[s].norm()).item()
        assert err < 1e-4, (s, err)
    end = PROMPT + STEPS
    for r in range(n):
        k0, k1 = plan.ranks[r].kv_heads
        assert torch.allclose(ks[r][1, :, :, :end], k[1, :, k0:k1, :end], atol=1e-5)
        assert torch.allclose(vs[r][1, :, :, :end], v[1, :, k0:k1, :end], atol=1e-5)
        assert torch.isnan(ks[r][1, :, :, end:]).all(), "a rank wrote KV beyond the last step"


def test_one_rank_is_the_single_gpu_twin_bit_for_bit():
    cfg, model, plan, ids, k, v, twin = _setup("qwen2-gqa2", 1, 5)
    forced = ids[PROMPT:]
    ks, vs = _rank_caches(plan, k, v)
    tp = twin.run(ks, vs, 1, forced[0], PROMPT, STEPS, forced=forced, order_seed=1)
    # the same (contiguous) weight tensors: CPU BLAS rounds a strided view differently
    single = Twin(twin.twins[0].m, schedule.build(schedule.Dims.of(cfg), n_sm=5), rope_inv_freq(cfg))
    one = single.run(k.clone(), v.clone(), 1, forced[0], PROMPT, STEPS, forced=forced, order_seed=2)
    assert torch.equal(tp.ranks[0].logits, one.logits)


@pytest.mark.parametrize("vp", [False, True])
def test_sampling_and_cancel_agree_on_every_rank(vp):
    cfg, model, plan, ids, k, v, twin = _setup("llama-gqa4", 2, 6, seed=3, vp=vp)
    runs = []
    for order in (0, 1):
        ks, vs = _rank_caches(plan, k, v)
        runs.append(twin.run(ks, vs, 1, ids[PROMPT], PROMPT, STEPS, temperature=0.8, top_p=0.9, seed=11,
                             order_seed=order))
    for res in runs:
        assert res.ranks[0].tokens == res.ranks[1].tokens and len(res.ranks[0].tokens) == STEPS
    assert runs[0].ranks[0].tokens == runs[1].ranks[0].tokens, "interleaving changed the sampled tokens"
    # rank 0 sees the host's cancel flag at step 2: every rank emits steps 0..2 and stops at step 3
    ks, vs = _rank_caches(plan, k, v)
    res = twin.run(ks, vs, 1, ids[PROMPT], PROMPT, STEPS, cancel_at_step=2, order_seed=4)
    for rr in res.ranks:
        assert rr.finish == "cancelled" and len(rr.tokens) == 3
        assert rr.tokens == res.ranks[0].tokens


def _interleavings_caught(twin, plan, ids, k, v, words: tuple[str, ...], orders: int = 6) -> int:
    """Runs a broken schedule under a few SM interleavings -> how many the tags caught; every error must name one
    of `words` (the buffer whose tag exposed the missing wait)."""
    caught = 0
    for order in range(orders):
        ks, vs = _rank_caches(plan, k, v)
        try:
            twin.run(ks, vs, 1, ids[PROMPT], PROMPT, 3, order_seed=order)
        except ScheduleError as e:
            assert any(w in str(e) for w in words), e
            caught += 1
    return caught


def test_sampler_waiting_only_for_local_records_is_caught():
    """Vocabulary-parallel: a sampler that waits for its own rank's LM-head records only reads peer records that
    are missing or stale; the record tags must report it in at least one of a few interleavings."""
    cfg, model, plan, ids, k, v, twin = _setup("qwen2-gqa2", 2, 4, vp=True)
    for tw in twin.twins:
        local_n = tw.s.n_lm
        tw.s.per_sm = [[ins[:5] + (local_n,) + ins[6:] if ins[0] == isa.OPS["SAMPLE"] else ins for ins in lst]
                       for lst in tw.s.per_sm]
    assert _interleavings_caught(twin, plan, ids, k, v, ("records", "logits")) > 0


def test_exchange_wait_without_peer_producers_is_caught():
    """GATEUP waiting only for its own rank's OPROJ producers reads peer partials that are not there yet (or
    those of another step): the receive-buffer tags must report it in at least one of a few interleavings."""
    cfg, model, plan, ids, k, v, twin = _setup("qwen2-gqa2", 2, 4)
    local_n = twin.twins[0].s.counts["OPROJ"]
    for tw in twin.twins:
        tw.s.per_sm = [[ins[:5] + (local_n,) + ins[6:] if ins[0] == isa.OPS["GATEUP"] else ins for ins in lst]
                       for lst in tw.s.per_sm]
    assert _interleavings_caught(twin, plan, ids, k, v, ("recv",)) > 0


def test_kernel_plan_refuses_what_the_kernel_cannot_run():
    with pytest.raises(ShardError, match="uniform group"):
        kernel_plan(tiny_cfg(arch="llama", n_heads=6, n_kv_heads=3, hidden_size=96), 2)   # 3 q heads / rank
    with pytest.raises(ShardError, match="bias"):
        kernel_plan(tiny_cfg(arch="llama", o_bias=True), 2)
    with pytest.raises(ShardError, match="1..8"):
        kernel_plan(tiny_cfg(arch="llama", n_heads=16, n_kv_heads=16, head_dim=4), 16)
    plan = kernel_plan(tiny_cfg(), 2)
    assert [s.n_ffn for s in plan.ranks] == [48, 48] and all(s.group == 2 for s in plan.ranks)


def test_schedule_check_knows_exchanged_waits():
    """with_exchange: waits on OPROJ / DOWN (and, vocabulary-parallel, LM) counters count every rank's producers;
    check() accepts exactly that and rejects a wait that counts only the local ones."""
    cfg = tiny_cfg(arch="llama", n_heads=8, n_kv_heads=2, head_dim=8)
    plan = kernel_plan(cfg, 2)
    scheds = [schedule.build(schedule.Dims.of(rank_model(tiny_model(cfg), plan, r, vocab_parallel=True).cfg), 5)
              for r in range(2)]
    tp = schedule.with_exchange(scheds, lm_parallel=True)
    L = cfg.n_layers
    for s in tp:
        schedule.check(s)
        waits = {(ins[0], ins[1]): ins[5] for lst in s.per_sm for ins in lst}
        assert waits[(isa.OPS["GATEUP"], 0)] == sum(x.counts["OPROJ"] for x in scheds)
        assert waits[(isa.OPS["QKV"], 1)] == sum(x.counts["DOWN"] for x in scheds)
        assert waits[(isa.OPS["LMHEAD"], 0)] == sum(x.counts["DOWN"] for x in scheds)
        assert waits[(isa.OPS["SAMPLE"], 0)] == sum(x.n_lm for x in scheds)
        assert waits[(isa.OPS["QKV"], 0)] == 1 and waits[(isa.OPS["DOWN"], L - 1)] == s.counts["GATEUP"]
    bad = tp[0]
    bad.per_sm = [[ins[:5] + (bad.counts["OPROJ"],) + ins[6:] if ins[0] == isa.OPS["GATEUP"] else ins
                   for ins in lst] for lst in bad.per_sm]
    with pytest.raises(AssertionError, match="exchanged wait"):
        schedule.check(bad)
