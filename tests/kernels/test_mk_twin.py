"""The CPU twin runs the kernel's instruction lists (with the dependency counters, in random SM order) and must
equal the reference model; its data tags must catch a schedule whose waits are too weak."""
import numpy as np
import pytest
import torch

from engine.model import rope_inv_freq
from engine.sampling import SamplingParams, sample
from kernels import isa, schedule
from kernels.sampling_rng import gumbel, mix_uniform
from kernels.twin import ScheduleError, Twin
from kernels.testing import fresh_cache, tiny_cfg, tiny_model, twin_schedule_error

SHAPES = {
    "qwen2-gqa2": dict(arch="qwen2"),
    "llama-gqa4-llama3rope": dict(arch="llama", n_heads=8, n_kv_heads=2, head_dim=8, rope_theta=500000.0,
                                  rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                "high_freq_factor": 4.0, "original_max_position_embeddings": 16}),
    "qwen2-gqa3-hd32": dict(arch="qwen2", n_heads=6, n_kv_heads=2, head_dim=32, hidden_size=96),
    "llama-mha-untied": dict(arch="llama", n_heads=4, n_kv_heads=4, tie_word_embeddings=False),
}


def _prefill(model, cfg, ids, slots=2):
    k, v = fresh_cache(cfg, slots=slots)
    model.forward(k, v, 1, torch.tensor(ids), 0)
    return k, v


def _teacher_forced(model, cfg, seed):
    """14 random tokens: a 9-token prompt prefilled into slot 1, then the reference's logits of the 5 forced steps.
    -> (prompt, forced, k_ref, v_ref, ref) with k_ref / v_ref the reference's cache after those steps."""
    ids = torch.randint(0, cfg.vocab_size, (14,), generator=torch.Generator().manual_seed(seed)).tolist()
    prompt, forced = ids[:9], ids[9:]
    k_ref, v_ref = _prefill(model, cfg, prompt)
    k0, v0 = k_ref.clone(), v_ref.clone()
    ref = torch.stack([model.forward(k_ref, v_ref, 1, torch.tensor([t]), len(prompt) + j)
                       for j, t in enumerate(forced)])
    return prompt, forced, k0, v0, k_ref, v_ref, ref


def _assert_logits_match(res, ref, tol=1e-4):
    for s in range(len(ref)):
        err = ((res.logits[s] - ref[s]).norm() / ref[s].norm()).item()
        assert err < tol, (s, err)


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("n_sm", [5, 16])
# every split / a few splits / one split carries the positions / one chunk of 4 staged positions per split (3 or 4
# splits at n 10..14, at least 2)
@pytest.mark.parametrize("min_pos,min_splits", [(1, 0), (3, 0), (64, 0), (1, 2)])
@pytest.mark.parametrize("fused", [False, True], ids=["gateup-down", "fused-mlp"])
def test_teacher_forced_logits_equal_reference(shape, n_sm, min_pos, min_splits, fused):
    cfg = tiny_cfg(**SHAPES[shape])
    model = tiny_model(cfg, seed=hash(shape) % 1000)
    prompt, forced, k_tw, v_tw, k_ref, v_ref, ref = _teacher_forced(model, cfg, n_sm)
    sched = schedule.build(schedule.Dims.of(cfg), n_sm=n_sm, fused_mlp=fused)
    schedule.check(sched)
    res = Twin(model, sched, rope_inv_freq(cfg)).run(k_tw, v_tw, 1, forced[0], len(prompt), len(forced),
                                                      forced=forced, order_seed=n_sm, attn_min_pos=min_pos,
                                                      attn_min_splits=min_splits, kv_stage_pos=4)
    assert res.steps_run == len(forced) and res.finish == "length"
    _assert_logits_match(res, ref)
    end = len(prompt) + len(forced)
    assert torch.allclose(k_tw[1, :, :, :end], k_ref[1, :, :, :end], atol=1e-5)
    assert torch.allclose(v_tw[1, :, :, :end], v_ref[1, :, :, :end], atol=1e-5)
    assert torch.isnan(k_tw[1, :, :, end:]).all(), "twin wrote KV beyond the last step"
    assert torch.isnan(k_tw[0]).all(), "twin touched another slot"


CLUSTER_SHAPES = [k for k in SHAPES if k != "llama-mha-untied"]   # q heads x head_dim per kv head: 16 < 32


@pytest.mark.parametrize("shape", CLUSTER_SHAPES)
# (n_sm, cs, cluster_ctas): with cluster_ctas < n_sm the CTAs after the clusters are a side launch (no ATTN)
@pytest.mark.parametrize("n_sm,cs,cl_ctas", [(16, 8, None), (24, 8, None), (32, 16, None), (20, 8, 16),
                                             (37, 16, 32)])
@pytest.mark.parametrize("fused", [False, True], ids=["gateup-down", "fused-mlp"])
def test_cluster_schedule_logits_equal_reference(shape, n_sm, cs, cl_ctas, fused):
    """schedule.build(cluster=cs): each kv head's cs splits sit on ranks 0 .. cs - 1 of one cluster (rotating with the
    layer, two heads on one cluster when there are fewer clusters than heads) and the results still equal the
    reference. With a side launch (cluster_ctas) its CTAs take a share of every other stage."""
    cfg = tiny_cfg(**SHAPES[shape])
    model = tiny_model(cfg, seed=hash(shape) % 1000)
    prompt, forced, k_tw, v_tw, k_ref, v_ref, ref = _teacher_forced(model, cfg, n_sm)
    sched = schedule.build(schedule.Dims.of(cfg), n_sm=n_sm, fused_mlp=fused, cluster=cs, cluster_ctas=cl_ctas)
    schedule.check(sched)
    assert sched.n_splits == cs and sched.cluster == cs and sched.cluster_ctas == (cl_ctas or n_sm)
    where = {}
    for sm, lst in enumerate(sched.per_sm):
        for ins in lst:
            if ins[0] == isa.OPS["ATTN"]:
                assert sm % cs == ins[3], "split s must run on rank s"
                assert sm < sched.cluster_ctas, "ATTN on a side-launch CTA"
                where.setdefault((ins[1], ins[2]), set()).add(sm // cs)
    assert all(len(c) == 1 for c in where.values()), "a head's splits span clusters"
    if cl_ctas:   # every side CTA has work in every layer's matvec stages
        side_ops = {ins[0] for lst in sched.per_sm[cl_ctas:] for ins in lst}
        assert {isa.OPS["QKV"], isa.OPS["LMHEAD"]} <= side_ops
    res = Twin(model, sched, rope_inv_freq(cfg)).run(k_tw, v_tw, 1, forced[0], len(prompt), len(forced),
                                                      forced=forced, order_seed=n_sm, attn_min_pos=2)
    _assert_logits_match(res, ref)


# (q heads per kv head, head_dim, parts, n_sm, cluster, cluster CTAs): the 0.5B layout's 7 q heads in 3 / 2 / 2 and
# 4 / 3, a group of 4 in 2 parts, with and without a side launch
ATTNQ_CASES = [(7, 32, 3, 52, 8, 48), (7, 32, 2, 32, 8, 32), (4, 16, 2, 34, 8, 32), (4, 16, 1, 16, 8, 16)]
# kv_apart needs CTAs without a part: the side launch's, and with 5 clusters for 4 parts a free cluster that rotates
ATTNQ_KV_CASES = [(7, 32, 3, 52, 8, 48), (4, 16, 2, 34, 8, 32), (7, 32, 2, 48, 8, 40)]


def _two_orders(model, sched, prompt, forced, k_ref, v_ref):
    """The twin's teacher-forced run of `forced` after `prompt` in slot 1 under two execution orders, the slot's rows
    past the prompt NaN until a step appends them: (result, the K cache it left) per order."""
    for order in (sched.n_sm, sched.n_sm + 1):
        k_tw, v_tw = k_ref.clone(), v_ref.clone()
        k_tw[1, :, :, len(prompt):], v_tw[1, :, :, len(prompt):] = float("nan"), float("nan")
        yield Twin(model, sched, rope_inv_freq(model.cfg)).run(k_tw, v_tw, 1, forced[0], len(prompt), len(forced),
                                                                forced=forced, order_seed=order, attn_min_pos=2), k_tw


@pytest.mark.parametrize("group,hd,parts,n_sm,cs,cl_ctas,kv_apart",
                         [c + (False,) for c in ATTNQ_CASES] + [c + (True,) for c in ATTNQ_KV_CASES])
@pytest.mark.parametrize("fused", [False, True], ids=["gateup-down", "fused-mlp"])
def test_attnq_schedule_logits_equal_reference(group, hd, parts, n_sm, cs, cl_ctas, kv_apart, fused):
    """schedule.build(qkv_parts=P): no QKV stage; each kv head's q heads in P parts, each part's q / k / v rows
    computed by the ranks of its cluster (rank r its share, pushed to every rank, then waited for) before the part's
    attention. With kv_apart the parts compute q rows only and QKV instructions on the CTAs without a part compute
    the k / v rows, which each part's split holding pos waits for. Teacher-forced logits equal the reference; the
    KV cache gets every step's row exactly once."""
    cfg = tiny_cfg(n_heads=2 * group, n_kv_heads=2, head_dim=hd, hidden_size=96)
    model = tiny_model(cfg, seed=group + parts)
    prompt, forced, k_tw, v_tw, k_ref, v_ref, ref = _teacher_forced(model, cfg, n_sm)
    sched = schedule.build(schedule.Dims.of(cfg), n_sm=n_sm, fused_mlp=fused, cluster=cs, cluster_ctas=cl_ctas,
                           qkv_parts=parts, kv_apart=kv_apart)
    schedule.check(sched)
    ops = {ins[0] for lst in sched.per_sm for ins in lst}
    assert (isa.OPS["QKV"] in ops) == kv_apart and isa.OPS["ATTN"] not in ops and isa.OPS["ATTNQ"] in ops
    if kv_apart:   # the k / v rows only, none on a CTA that runs a part of the same layer
        for sm, lst in enumerate(sched.per_sm):
            for ins in lst:
                if ins[0] == isa.OPS["QKV"]:
                    assert ins[2] >= cfg.n_heads * hd
                    assert not any(i[0] == isa.OPS["ATTNQ"] and i[1] == ins[1] for i in lst)
    # the kernel's rows of an ATTNQ rank (a1 rows of W_qkv in attnq_order from a0, as a QKV instruction's; with
    # kv_apart W_qkv's own order) are the part's rows the twin computes
    dm = schedule.Dims.of(cfg)
    order = list(range(dm.q_dim)) if kv_apart else schedule.attnq_order(dm, parts)
    for ins in (i for lst in sched.per_sm for i in lst if i[0] == isa.OPS["ATTNQ"]):
        j0, gq, h, sp = ins[6] & 255, (ins[6] >> 8) & 255, (ins[6] >> 16) & 255, ins[6] >> 24
        assert order[ins[2]:ins[2] + ins[3]] == [schedule.attnq_row(dm, h, j0, gq, r)
                                                  for r in range(sp * ins[3], (sp + 1) * ins[3])]
    for layer in range(cfg.n_layers):   # a layer's parts on distinct clusters
        cl = {(sm // cs, ins[6] & 0xffffff) for sm, lst in enumerate(sched.per_sm) for ins in lst
              if ins[0] == isa.OPS["ATTNQ"] and ins[1] == layer}
        assert len({c for c, _ in cl}) == len(cl) == 2 * parts
    for res, k_tw in _two_orders(model, sched, prompt, forced, k_ref, v_ref):
        _assert_logits_match(res, ref)
        end = len(prompt) + len(forced) - 1   # the last step's row is appended too
        assert torch.allclose(k_tw[1, :, :, :end], k_ref[1, :, :, :end], atol=1e-5)
        assert torch.isnan(k_tw[1, :, :, end + 1:]).all()


@pytest.mark.parametrize("group,hd,parts,n_sm,cs,cl_ctas,kv_apart", [(7, 32, 3, 52, 8, 48, True),
                                                                       (4, 16, 2, 34, 8, 32, False),
                                                                       (7, 32, 3, 48, 8, 48, False)])
def test_paired_mlp_schedule_logits_equal_reference(group, hd, parts, n_sm, cs, cl_ctas, kv_apart):
    """schedule.build(mlp_pairs=True): the MLP instructions of cluster CTAs 2k and 2k + 1 are paired (each sends its
    h rows to the other, which adds half of the outputs over both slices); the side launch's stay whole. Teacher-forced
    logits equal the reference under two execution orders."""
    cfg = tiny_cfg(n_heads=2 * group, n_kv_heads=2, head_dim=hd, hidden_size=96)
    model = tiny_model(cfg, seed=group + parts)
    prompt, forced, k_tw, v_tw, k_ref, v_ref, ref = _teacher_forced(model, cfg, n_sm)
    sched = schedule.build(schedule.Dims.of(cfg), n_sm=n_sm, fused_mlp=True, cluster=cs, cluster_ctas=cl_ctas,
                           qkv_parts=parts, kv_apart=kv_apart, mlp_pairs=True)
    schedule.check(sched)
    mlp = [(sm, ins) for sm, lst in enumerate(sched.per_sm) for ins in lst if ins[0] == isa.OPS["MLP"]]
    paired = [(sm, ins) for sm, ins in mlp if schedule.mlp_partner(ins[7])]
    assert paired and all(sm < cl_ctas for sm, _ in paired)
    assert all(schedule.mlp_partner(ins[7]) is None for sm, ins in mlp if sm >= cl_ctas)
    for res, _ in _two_orders(model, sched, prompt, forced, k_ref, v_ref):
        _assert_logits_match(res, ref)


@pytest.mark.parametrize("weights", [(1.25, 0.75), (0.8, 1.3)])
def test_weighted_mlp_rows_logits_equal_reference(weights):
    """schedule.build(mlp_weights=(free, side)): a layer's MLP rows in proportion to 1 on its parts' CTAs, `free` on
    the cluster CTAs without a part and `side` on the side launch's (paired as before). Every row once (check), the
    shares as asked, and teacher-forced logits equal the reference under two execution orders."""
    cfg = tiny_cfg(n_heads=14, n_kv_heads=2, head_dim=32, hidden_size=96, intermediate_size=480)   # 8 rows x 60
    model = tiny_model(cfg, seed=11)
    n_sm, cs, cl_ctas = 60, 8, 48
    prompt, forced, k_tw, v_tw, k_ref, v_ref, ref = _teacher_forced(model, cfg, n_sm)
    sched = schedule.build(schedule.Dims.of(cfg), n_sm=n_sm, fused_mlp=True, cluster=cs, cluster_ctas=cl_ctas,
                           qkv_parts=2, kv_apart=True, mlp_pairs=True, mlp_weights=weights)
    schedule.check(sched)
    for layer in range(cfg.n_layers):
        parts = {sm // cs for sm, lst in enumerate(sched.per_sm) for i in lst
                 if i[0] == isa.OPS["ATTNQ"] and i[1] == layer}
        rows = {sm: i[3] for sm, lst in enumerate(sched.per_sm) for i in lst
                if i[0] == isa.OPS["MLP"] and i[1] == layer}
        assert len(rows) == n_sm and sum(rows.values()) == cfg.intermediate_size
        cls = {c: "side" if c >= cl_ctas else "part" if c // cs in parts else "free" for c in rows}
        mean = {k: sum(r for c, r in rows.items() if cls[c] == k) / list(cls.values()).count(k)
                for k in ("part", "free", "side")}
        assert abs(mean["free"] / mean["part"] - weights[0]) < 0.05
        assert abs(mean["side"] / mean["part"] - weights[1]) < 0.05
    assert any(schedule.mlp_partner(i[7]) for lst in sched.per_sm for i in lst if i[0] == isa.OPS["MLP"])
    for res, _ in _two_orders(model, sched, prompt, forced, k_ref, v_ref):
        _assert_logits_match(res, ref)


def test_paired_mlp_without_its_partner_deadlocks_and_bad_pairs_are_refused():
    """A paired MLP whose partner runs its MLP unpaired waits for h rows that never come: the twin reports a deadlock
    and check refuses the schedule, as it does an aux naming other rows than the partner's. build refuses mlp_pairs
    without clusters or without the fused MLP."""
    cfg = tiny_cfg(n_heads=8, n_kv_heads=2, head_dim=16, hidden_size=96)
    model = tiny_model(cfg)
    dm = schedule.Dims.of(cfg)
    kw = dict(n_sm=34, fused_mlp=True, cluster=8, cluster_ctas=32, qkv_parts=2, mlp_pairs=True)
    sched = schedule.build(dm, **kw)
    lst = sched.per_sm[5]
    j = next(j for j, ins in enumerate(lst) if ins[0] == isa.OPS["MLP"] and ins[1] == 1)
    assert schedule.mlp_partner(lst[j][7]) is not None
    lst[j] = lst[j][:7] + (0,)
    with pytest.raises(AssertionError, match="not paired"):
        schedule.check(sched)
    k, v = _prefill(model, cfg, [1, 2, 3])
    with pytest.raises(ScheduleError, match="deadlock"):
        Twin(model, sched, rope_inv_freq(cfg)).run(k, v, 1, 3, 3, 2, attn_min_pos=2)
    bad = schedule.build(dm, **kw)
    i = next(j for j, ins in enumerate(bad.per_sm[2]) if ins[0] == isa.OPS["MLP"])
    ins = bad.per_sm[2][i]
    a0, a1 = schedule.mlp_partner(ins[7])
    bad.per_sm[2][i] = ins[:7] + (schedule.mlp_pair_aux(a0 + 1, a1),)
    with pytest.raises(AssertionError, match="not paired"):
        schedule.check(bad)
    with pytest.raises(ValueError, match="cluster launch and the fused MLP"):
        schedule.build(dm, n_sm=34, fused_mlp=True, mlp_pairs=True)
    with pytest.raises(ValueError, match="cluster launch and the fused MLP"):
        schedule.build(dm, n_sm=34, cluster=8, cluster_ctas=32, mlp_pairs=True)


def test_attnq_rank_that_never_pushes_deadlocks_and_bad_layouts_are_refused():
    """An ATTNQ rank left out of its part (its instruction dropped) leaves the others waiting for its share: the twin
    reports a deadlock. build refuses qkv_parts without clusters, with more parts than clusters, or parts whose rows do
    not split over the ranks; check refuses a split off its rank."""
    cfg = tiny_cfg(n_heads=8, n_kv_heads=2, head_dim=16, hidden_size=96)
    model = tiny_model(cfg)
    dm = schedule.Dims.of(cfg)
    sched = schedule.build(dm, n_sm=34, fused_mlp=True, cluster=8, cluster_ctas=32, qkv_parts=2)
    lst = sched.per_sm[3]
    lst.remove(next(ins for ins in lst if ins[0] == isa.OPS["ATTNQ"] and ins[1] == 1))
    k, v = _prefill(model, cfg, [1, 2, 3])
    with pytest.raises(ScheduleError, match="deadlock"):
        Twin(model, sched, rope_inv_freq(cfg)).run(k, v, 1, 3, 3, 2, attn_min_pos=2)
    with pytest.raises(ValueError, match="cluster launch"):
        schedule.build(dm, n_sm=34, qkv_parts=2)
    with pytest.raises(ValueError, match="need as many clusters"):
        schedule.build(dm, n_sm=34, cluster=8, cluster_ctas=24, qkv_parts=2)
    with pytest.raises(ValueError, match="does not split"):
        schedule.build(schedule.Dims.of(tiny_cfg(n_heads=12, n_kv_heads=2, head_dim=16, hidden_size=96)), n_sm=34,
                       cluster=8, cluster_ctas=32, qkv_parts=2)
    bad = schedule.build(dm, n_sm=34, fused_mlp=True, cluster=8, cluster_ctas=32, qkv_parts=2)
    i = next(j for j, ins in enumerate(bad.per_sm[0]) if ins[0] == isa.OPS["ATTNQ"])
    ins = bad.per_sm[0][i]
    bad.per_sm[0][i] = ins[:6] + (ins[6] & 0xffffff | 1 << 24,) + ins[7:]
    with pytest.raises(AssertionError, match="on rank"):
        schedule.check(bad)


def test_kv_apart_split_waits_for_every_kv_row_and_bad_layouts_are_refused():
    """kv_apart: a part's split holding pos waits for the layer's k / v producers its aux names. One QKV instruction
    dropped: the twin reports a deadlock; an aux that names one producer too few is refused by check, and so is a
    schedule with no CTA left for the k / v rows."""
    cfg = tiny_cfg(n_heads=8, n_kv_heads=2, head_dim=16, hidden_size=96)
    model = tiny_model(cfg)
    dm = schedule.Dims.of(cfg)
    sched = schedule.build(dm, n_sm=34, fused_mlp=True, cluster=8, cluster_ctas=32, qkv_parts=2, kv_apart=True)
    schedule.check(sched)
    sm = next(i for i, lst in enumerate(sched.per_sm) if any(ins[0] == isa.OPS["QKV"] for ins in lst))
    sched.per_sm[sm] = [ins for ins in sched.per_sm[sm] if not (ins[0] == isa.OPS["QKV"] and ins[1] == 1)]
    k, v = _prefill(model, cfg, [1, 2, 3])
    with pytest.raises(ScheduleError, match="deadlock"):
        Twin(model, sched, rope_inv_freq(cfg)).run(k, v, 1, 3, 3, 2, attn_min_pos=2)
    bad = schedule.build(dm, n_sm=34, fused_mlp=True, cluster=8, cluster_ctas=32, qkv_parts=2, kv_apart=True)
    i = next(j for j, ins in enumerate(bad.per_sm[0]) if ins[0] == isa.OPS["ATTNQ"])
    ins = bad.per_sm[0][i]
    done, kvn = schedule.attnq_aux_parts(ins[7])
    bad.per_sm[0][i] = ins[:7] + (schedule.attnq_aux(done, kvn - 1),)
    with pytest.raises(AssertionError, match="k / v producers"):
        schedule.check(bad)
    with pytest.raises(ValueError, match="no CTA is left"):
        schedule.build(dm, n_sm=32, cluster=8, cluster_ctas=32, qkv_parts=2, kv_apart=True)
    with pytest.raises(ValueError, match="needs qkv_parts"):
        schedule.build(dm, n_sm=34, cluster=8, cluster_ctas=32, kv_apart=True)


def test_cluster_schedule_refuses_what_the_kernel_cannot_run():
    with pytest.raises(ValueError, match="not a multiple"):
        schedule.build(schedule.Dims.of(tiny_cfg()), n_sm=12, cluster=8)
    with pytest.raises(ValueError, match="2, 4, 8 or 16"):
        schedule.build(schedule.Dims.of(tiny_cfg()), n_sm=12, cluster=3)
    with pytest.raises(ValueError, match="not a multiple"):   # the clustered CTAs of a side launch's schedule
        schedule.build(schedule.Dims.of(tiny_cfg()), n_sm=20, cluster=8, cluster_ctas=12)
    with pytest.raises(ValueError, match="not a multiple"):
        schedule.build(schedule.Dims.of(tiny_cfg()), n_sm=20, cluster=8, cluster_ctas=24)
    with pytest.raises(ValueError, match="multiple of 32"):   # a warp's lanes must cover whole output elements
        schedule.build(schedule.Dims.of(tiny_cfg(**SHAPES["llama-mha-untied"])), n_sm=16, cluster=8)


@pytest.mark.parametrize("cluster", [0, 8], ids=["plain", "clusters-of-8"])
def test_oproj_waiting_for_one_split_fewer_is_caught(cluster):
    """Every split signals ATTN_DONE after merging its slice of the head's outputs (over L2 in the plain schedule,
    over DSMEM in a cluster one): an OPROJ waiting for one signal fewer may read a head whose last slice is not
    written yet."""
    n_kv = tiny_cfg().n_kv_heads

    def one_fewer(ins, sched):
        if ins[0] != isa.OPS["OPROJ"]:
            return None
        assert ins[5] == n_kv * sched.n_splits
        return ins[:5] + (ins[5] - 1,) + ins[6:]
    _assert_weakened_wait_caught(False, one_fewer, 12, n_sm=16, cluster=cluster, attn_min_pos=1)


def test_plain_schedule_keeps_one_attention_split_per_sm_and_layer():
    """A split with positions waits inside its ATTN for every split of its head, so two splits of one layer on an
    SM could wait for each other across SMs: the schedule refuses more splits than SMs per kv head."""
    dims = schedule.Dims.of(tiny_cfg())
    for n_sm in (5, 16, 24):
        sched = schedule.build(dims, n_sm=n_sm)
        for lst in sched.per_sm:
            layers = [ins[1] for ins in lst if ins[0] == isa.OPS["ATTN"]]
            assert len(layers) == len(set(layers))
    with pytest.raises(ValueError, match="at most one ATTN per SM"):
        schedule.build(dims, n_sm=16, n_splits=16)


def test_greedy_loop_equals_reference_and_order_does_not_matter(qwen_tiny):
    cfg, model = qwen_tiny
    prompt = [3, 17, 42, 9, 100, 7]
    k_ref, v_ref = _prefill(model, cfg, prompt)
    want, tok = [], prompt[-1]
    # reference loop: the last prompt token is fed again at its position (its KV is rewritten identically)
    k_w, v_w = k_ref.clone(), v_ref.clone()
    for j in range(8):
        logits = model.forward(k_w, v_w, 1, torch.tensor([tok]), len(prompt) - 1 + j)
        tok = sample(logits, SamplingParams())
        want.append(tok)
    sched = schedule.build(schedule.Dims.of(cfg), n_sm=7)
    twin = Twin(model, sched, rope_inv_freq(cfg))
    runs = []
    for order in range(3):
        k, v = k_ref.clone(), v_ref.clone()
        r = twin.run(k, v, 1, prompt[-1], len(prompt) - 1, 8, order_seed=order, valid_len=len(prompt) - 1)
        runs.append(r)
    assert runs[0].tokens == want
    for r in runs[1:]:
        assert r.tokens == runs[0].tokens and torch.equal(r.logits, runs[0].logits)


def test_stop_id_and_cancel(qwen_tiny):
    cfg, model = qwen_tiny
    prompt = [5, 6, 7, 8]
    k0, v0 = _prefill(model, cfg, prompt)
    sched = schedule.build(schedule.Dims.of(cfg), n_sm=6)
    twin = Twin(model, sched, rope_inv_freq(cfg))
    free = twin.run(k0.clone(), v0.clone(), 1, 8, 4, 6)
    assert free.finish == "length" and len(free.tokens) == 6
    stop = free.tokens[2]
    first = free.tokens.index(stop)
    r = twin.run(k0.clone(), v0.clone(), 1, 8, 4, 6, stop_ids={stop})
    assert r.finish == "stop" and r.tokens == free.tokens[:first + 1]
    c = twin.run(k0.clone(), v0.clone(), 1, 8, 4, 6, cancel_at_step=3)
    assert c.finish == "cancelled" and c.tokens == free.tokens[:3]


def _assert_weakened_wait_caught(fused_mlp: bool, weaken, orders: int, n_sm: int = 8, cluster: int = 0,
                                 **run_kw) -> None:
    """Tiny model on n_sm SMs: weaken(ins, sched) -> the instruction with a weaker wait, or None to keep it; some
    SM order among `orders` must make the twin's tags raise (run_kw: more Twin.run arguments)."""
    cfg = tiny_cfg()
    model = tiny_model(cfg)
    k, v = _prefill(model, cfg, [1, 2, 3])
    sched = schedule.build(schedule.Dims.of(cfg), n_sm=n_sm, fused_mlp=fused_mlp, cluster=cluster)
    schedule.check(sched)
    for lst in sched.per_sm:
        for i, ins in enumerate(lst):
            lst[i] = weaken(ins, sched) or ins
    twin = Twin(model, sched, rope_inv_freq(cfg))
    with pytest.raises(ScheduleError):
        for order in range(orders):
            twin.run(k.clone(), v.clone(), 1, 3, 3, 3, order_seed=order, **run_kw)


def test_weakened_wait_is_caught():
    """Lower one OPROJ wait so it may run before attention is combined: the tags must notice."""
    _assert_weakened_wait_caught(False, lambda ins, _: ins[:4] + (isa.counter_index(ins[1], isa.CTR_QKV), 1) + ins[6:]
                                 if ins[0] == isa.OPS["OPROJ"] else None, 6)


def test_twin_schedule_error_of_a_schedule_and_of_a_broken_one():
    """kernels.testing.twin_schedule_error (the schedule experiments' CPU check): a built schedule is within float
    rounding of the reference; one whose ATTN waits for too few QKV producers is refused by the twin's tags."""
    cfg = tiny_cfg(**SHAPES["qwen2-gqa2"])
    model = tiny_model(cfg, seed=3)
    sched = schedule.build(schedule.Dims.of(cfg), n_sm=8, fused_mlp=True)
    assert twin_schedule_error(model, sched, ids_seed=1, order_seed=2) < 1e-5
    weak = [[ins[:5] + (1,) + ins[6:] if ins[0] == isa.OPS["ATTN"] else ins for ins in lst] for lst in sched.per_sm]
    broken = schedule.Schedule(dims=sched.dims, n_sm=8, n_splits=sched.n_splits, rows=sched.rows, counts=sched.counts,
                               per_sm=weak, n_counters=sched.n_counters, fused_mlp=True)
    with pytest.raises(ScheduleError):
        for order in range(1, 9):
            twin_schedule_error(model, broken, ids_seed=1, order_seed=order)


def test_temperature_sampling_is_seeded_and_top_p_stays_in_nucleus(qwen_tiny):
    cfg, model = qwen_tiny
    k0, v0 = _prefill(model, cfg, [4, 5, 6])
    sched = schedule.build(schedule.Dims.of(cfg), n_sm=5)
    twin = Twin(model, sched, rope_inv_freq(cfg))
    a = twin.run(k0.clone(), v0.clone(), 1, 6, 3, 5, temperature=0.8, seed=11)
    b = twin.run(k0.clone(), v0.clone(), 1, 6, 3, 5, temperature=0.8, seed=11, order_seed=9)
    assert a.tokens == b.tokens
    for T, top_p in ((1.0, 0.5), (0.7, 0.9)):
        r = twin.run(k0.clone(), v0.clone(), 1, 6, 3, 5, temperature=T, top_p=top_p, seed=3)
        for s, tok in enumerate(r.tokens):
            p = torch.softmax(r.logits[s].double() / T, -1)
            sp, si = torch.sort(p, descending=True)
            nucleus = set(si[(torch.cumsum(sp, 0) - sp) < top_p].tolist())
            assert tok in nucleus


def test_gumbel_max_matches_softmax_frequencies():
    logits = np.array([2.0, 1.0, 0.0, -1.0], dtype=np.float32)
    T = 0.7
    counts = np.zeros(4)
    for step in range(4000):
        counts[np.argmax(logits / T + gumbel(123, step, np.arange(4)))] += 1
    p = np.exp(logits / T) / np.exp(logits / T).sum()
    assert np.abs(counts / counts.sum() - p).max() < 0.03
    u = mix_uniform(5, 1, np.arange(100000))
    assert 0 < u.min() and u.max() < 1 and abs(u.mean() - 0.5) < 0.01


def test_fused_mlp_residual_waits_are_caught():
    """Fused MLP schedule: a QKV (or LMHEAD) waiting for one MLP instruction fewer reads an accumulator that is
    still missing a partial, and an MLP that does not wait for every OPROJ adds into a layer's output that OPROJ
    has not zeroed yet; the twin's accumulator tags must notice both, in some SM order."""
    for target in ("QKV", "MLP"):
        _assert_weakened_wait_caught(True, lambda ins, _: ins[:5] + (ins[5] - 1,) + ins[6:]
                                     if ins[0] == isa.OPS[target] and ins[1] == 1 else None, 12)


def test_fused_mlp_greedy_tokens_equal_the_unfused_schedule(qwen_tiny):
    cfg, model = qwen_tiny
    prompt = [3, 17, 42, 9, 100, 7]
    k0, v0 = _prefill(model, cfg, prompt)
    runs = []
    for fused in (False, True):
        sched = schedule.build(schedule.Dims.of(cfg), n_sm=7, fused_mlp=fused)
        runs.append(Twin(model, sched, rope_inv_freq(cfg)).run(k0.clone(), v0.clone(), 1, prompt[-1],
                                                                len(prompt) - 1, 8, valid_len=len(prompt) - 1))
    assert runs[1].tokens == runs[0].tokens
    err = ((runs[1].logits - runs[0].logits).norm() / runs[0].logits.norm()).item()
    assert 0 < err < 1e-5   # same math up to the fixed-point rounding and summation order


@pytest.mark.parametrize("shape", ["qwen2-gqa2", "llama-mha-untied"])
@pytest.mark.parametrize("n_sm", [3, 7])
def test_screened_lm_head_gives_the_exact_heads_tokens(shape, n_sm):
    """The screened LM head (kernels/lm_screen.py) in the instruction stream: each LMHEAD instruction screens its
    own rows against its own maxima and records only its candidates' exact logits; greedy and Gumbel-max tokens
    equal the exact head's, teacher-forced and free-running, and the screen keeps a minority of the rows."""
    cfg = tiny_cfg(**SHAPES[shape], vocab_size=512)
    model = tiny_model(cfg)
    prompt = [3, 17, 42, 9, 100, 7]
    sched = schedule.build(schedule.Dims.of(cfg), n_sm=n_sm, fused_mlp=True)
    k0, v0 = _prefill(model, cfg, prompt)
    runs = {}
    for screen in (False, True):
        twin = Twin(model, sched, rope_inv_freq(cfg), lm_screen=screen)
        for T, seed in ((0.0, 0), (0.9, 5)):
            k, v = k0.clone(), v0.clone()
            runs[screen, T] = twin.run(k, v, 1, prompt[-1], len(prompt) - 1, 12, temperature=T, seed=seed,
                                       valid_len=len(prompt) - 1)
    for T in (0.0, 0.9):
        assert runs[True, T].tokens == runs[False, T].tokens
        assert torch.equal(runs[True, T].logits, runs[False, T].logits)
        cands = runs[True, T].lm_candidates
        assert len(cands) == 12 * sched.n_lm and all(c >= 1 for c in cands)
        assert sum(cands) < 12 * cfg.vocab_size // 4
    assert not runs[False, 0.0].lm_candidates
