"""Static properties of the per-SM instruction lists for real model shapes and tiny ones."""
import dataclasses

import pytest
from hypothesis import given, strategies as st

from engine.config import preset
from kernels import isa, schedule
from kernels.testing import tiny_cfg


@pytest.mark.parametrize("name", ["qwen2.5-coder-0.5b", "llama-3.2-1b", "qwen2.5-coder-1.5b"])
def test_real_shapes_on_h200(name):
    dims = schedule.Dims.of(preset(name))
    s = schedule.build(dims, n_sm=132)
    schedule.check(s)
    # every matvec stage keeps all SMs busy with at most one instruction each
    for op in ("QKV", "OPROJ", "GATEUP", "DOWN", "LMHEAD"):
        assert s.counts[op] <= 132, (op, s.counts[op])
        assert s.rows[op] * (2 if op == "GATEUP" else 1) * schedule.items_per_row(
            {"QKV": dims.d, "OPROJ": dims.q_dim, "GATEUP": dims.d, "DOWN": dims.ffn, "LMHEAD": dims.d}[op]
        ) <= isa.SMEM_RED_FLOATS
    assert s.counts["ATTN"] <= 132
    assert s.smem_bytes() <= 227 * 1024
    per_sm = [len(lst) for lst in s.per_sm]
    assert max(per_sm) - min(per_sm) <= dims.n_layers + 2   # balanced to within ~one instruction per stage
    off, ins = s.flat()
    assert off[-1] == len(ins) and ins.shape[1] == isa.INSTR_WORDS


@pytest.mark.parametrize("name", ["qwen2.5-coder-0.5b", "llama-3.2-1b", "qwen2.5-coder-1.5b"])
def test_fused_mlp_schedule_on_h200(name):
    dims = schedule.Dims.of(preset(name))
    plain, s = schedule.build(dims, n_sm=132), schedule.build(dims, n_sm=132, fused_mlp=True)
    schedule.check(s)
    ops = {ins[0] for lst in s.per_sm for ins in lst}
    assert isa.OPS["MLP"] in ops and not ops & {isa.OPS["GATEUP"], isa.OPS["DOWN"]}
    # an MLP instruction takes exactly a GATEUP instruction's rows; one handoff per layer fewer
    assert s.rows["MLP"] == plain.rows["GATEUP"] and s.counts["MLP"] == plain.counts["GATEUP"] <= 132
    assert sum(map(len, s.per_sm)) == sum(map(len, plain.per_sm)) - dims.n_layers * plain.counts["DOWN"]
    assert schedule.mlp_partial_floats(dims.d) <= isa.SMEM_RED_FLOATS
    assert s.smem_bytes() == plain.smem_bytes()
    # the next layer's QKV and the LM head wait for every MLP instruction of the layer before
    L = dims.n_layers
    waits = {(ins[0], ins[1]): (ins[4], ins[5]) for lst in s.per_sm for ins in lst}
    assert waits[(isa.OPS["QKV"], 1)] == (isa.counter_index(0, isa.CTR_GATEUP), s.counts["MLP"])
    assert waits[(isa.OPS["LMHEAD"], 0)] == (isa.counter_index(L - 1, isa.CTR_GATEUP), s.counts["MLP"])


def test_fused_mlp_rejects_a_hidden_size_the_partials_do_not_fit():
    with pytest.raises(ValueError):
        schedule.build(schedule.Dims.of(tiny_cfg(hidden_size=16384, n_heads=128, n_kv_heads=8, head_dim=128)),
                       n_sm=8, fused_mlp=True)


@pytest.mark.parametrize("n_sm", [1, 3, 8, 13])
def test_tiny_any_sm_count(n_sm):
    s = schedule.build(schedule.Dims.of(tiny_cfg()), n_sm=n_sm)
    schedule.check(s)
    assert s.per_sm[0][-1][0] == isa.OPS["SAMPLE"]


def test_check_catches_a_wrong_wait():
    s = schedule.build(schedule.Dims.of(tiny_cfg()), n_sm=4)
    lst = s.per_sm[1]
    i = next(k for k, ins in enumerate(lst) if ins[0] == isa.OPS["OPROJ"])
    bad = list(lst[i])
    bad[5] -= 1   # waits for one combine fewer than exist
    lst[i] = tuple(bad)
    with pytest.raises(AssertionError):
        schedule.check(s)


def test_rejects_unsupported_group():
    with pytest.raises(ValueError):
        schedule.build(schedule.Dims.of(tiny_cfg(n_heads=18, n_kv_heads=1, hidden_size=288)), n_sm=8)


@pytest.mark.parametrize("k", [64, 896, 1536, 2048, 4864, 8192, 8960, 11008, 13824])
def test_matvec_item_count(k):
    # the reduction buffer is sized with the kernel's items per row: 32 lanes x MV_UNROLL 16-byte chunks each
    assert schedule.items_per_row(k) == -(-(k // 8) // (32 * isa.MV_UNROLL))


@pytest.mark.parametrize("name,cluster", [("qwen2.5-coder-0.5b", 16), ("llama-3.2-1b", 0), ("qwen2.5-coder-1.5b", 16),
                                          ("dense-2b", 0), ("qwen2.5-coder-3b", 0)])
def test_attention_cluster_per_model(name, cluster):
    # the measured winners for the bench shapes (bench/NOTES.md, sessions 13, 20 and 29): clusters of 16 for small
    # layers, and for bigger ones whose ATTNQ layout with k / v apart fits an H200's 7 clusters (1.5B)
    dims = schedule.Dims.of(preset(name))
    assert schedule.attn_cluster_model(dims) == cluster
    small = schedule.layer_weight_bytes(dims) <= schedule.CLUSTER_LAYER_BYTES
    fits = schedule.qkv_parts_default(dims, 16, schedule.H200_CLUSTERS, kv_apart=True) > 0
    assert (small or fits) == bool(cluster)
    if cluster:   # and the schedule it picks builds on the 112 CTAs an H200 holds in clusters of 16, with the side
        s = schedule.build(dims, 132, cluster=cluster, cluster_ctas=112, fused_mlp=True,
                           qkv_parts=schedule.qkv_parts_default(dims, 16, 7, kv_apart=True), kv_apart=True)
        schedule.check(s)
        assert s.cluster == cluster


def test_attention_cluster_needs_warp_uniform_heads():
    # q heads x head_dim per kv head must be a multiple of 32: a small model whose heads are not gets no clusters
    dims = schedule.Dims(d=96, n_layers=2, n_heads=3, n_kv=3, head_dim=16, ffn=192, vocab=100, eps=1e-6)
    assert schedule.layer_weight_bytes(dims) < schedule.CLUSTER_LAYER_BYTES
    assert schedule.attn_cluster_model(dims) == 0
    with pytest.raises(ValueError, match="multiple of 32"):
        schedule.build(dims, 16, cluster=8)


def _hosts(s, op, layer):
    """SM index -> instruction of stage `op` in `layer` (at most one per SM)."""
    out = {}
    for sm, lst in enumerate(s.per_sm):
        for ins in lst:
            if ins[0] == isa.OPS[op] and ins[1] == layer:
                assert sm not in out, (op, sm)
                out[sm] = ins
    return out


@pytest.mark.parametrize("name,spread", [("qwen2.5-coder-0.5b", True), ("qwen2.5-coder-1.5b", True),
                                         ("llama-3.2-1b", False)])
def test_oproj_leaves_the_low_attention_splits_free(name, spread):
    dims = schedule.Dims.of(preset(name))
    s = schedule.build(dims, n_sm=132)
    schedule.check(s)
    base = -(-dims.d // 132)
    assert (s.rows["OPROJ"] > base) == spread
    assert s.rows["OPROJ"] * 4 <= base * 5
    for layer in (0, dims.n_layers - 1):
        attn = _hosts(s, "ATTN", layer)
        oproj = _hosts(s, "OPROJ", layer)
        low = {sm for sm, ins in attn.items() if ins[3] < schedule.KEEP_SPLITS}
        if spread:
            assert not low & set(oproj), sorted(low & set(oproj))
        # the highest splits' SMs get OPROJ first
        by_split = sorted(attn, key=lambda sm: -attn[sm][3])
        assert set(by_split[:min(len(oproj), len(by_split))]) <= set(oproj)


def _fewest(n: int, per: int) -> int:
    """The fewest parts of at most `per` positions that hold n positions, counted up one by one."""
    k = 1
    while k * per < n:
        k += 1
    return k


@given(n=st.integers(1, 20000), n_splits=st.integers(1, 64), min_pos=st.integers(1, 4096),
       min_splits=st.integers(0, 16), stage_pos=st.integers(1, 600))
def test_attention_splits_in_use(n, n_splits, min_pos, min_splits, stage_pos):
    # the host's copy of mk_attention.cuh attn_splits: as many splits as parts of at least min_pos positions fit
    # (every split at most), and with min_splits > 0 no more than min_splits or the fewest that hold n positions in
    # one staged chunk of stage_pos each, whichever is more; at least one
    want = min(n_splits, _fewest(n, min_pos))
    if min_splits:
        want = min(want, max(min_splits, _fewest(n, stage_pos)))
    assert schedule.attn_splits_in_use(n, n_splits, min_pos, min_splits, stage_pos) == want


def test_attention_splits_at_long_contexts():
    # the runtime's defaults (min_pos 64, min_splits 8) with 128 staged positions: 8 splits at 512 as before, then
    # one chunk per split (16 at 2048, 64 at 8192); 66 splits in the schedule (0.5B on an H200)
    assert [schedule.attn_splits_in_use(n, 66, 64, 8, 128) for n in (64, 300, 512, 1024, 2048, 4096, 8192)] == \
        [1, 5, 8, 8, 16, 32, 64]
    assert [schedule.attn_splits_in_use(n, 66, 64, 0, 128) for n in (512, 1024, 2048)] == [8, 16, 32]


@pytest.mark.parametrize("name,cluster,rule,used", [
    ("qwen2.5-coder-1.5b", 0, (16, 32), [7, 32, 32]), ("llama-3.2-1b", 0, (64, 8), [2, 8, 16]),
    ("qwen2.5-coder-0.5b", 16, (40, 16), [3, 13, 16]), ("qwen2.5-coder-0.5b", 8, (40, 8), [3, 8, 8]),
    ("qwen2.5-coder-0.5b", 0, (16, 32), [7, 32, 32])])
def test_attention_split_defaults_per_model(name, cluster, rule, used):
    # the measured winners (bench/NOTES.md, sessions 14 and 26): 2 kv heads take 32 splits of >= 16 positions, 8 kv
    # heads keep 8 of >= 64; a cluster launch has `cluster` splits per kv head (the schedule's n_splits) and fills
    # them at >= 40 positions each
    dims = schedule.Dims.of(preset(name))
    assert schedule.attn_split_defaults(dims, cluster) == rule
    n_splits = cluster or 64
    assert [schedule.attn_splits_in_use(n, n_splits, *rule, 128) for n in (100, 512, 2048)] == used


def test_attention_split_defaults_bounds():
    # one kv head (a tensor-parallel rank's share of 1.5B) stops at 32 splits; many kv heads never go below 8
    one = schedule.Dims(d=768, n_layers=2, n_heads=6, n_kv=1, head_dim=128, ffn=1024, vocab=100, eps=1e-6)
    many = schedule.Dims(d=1024, n_layers=2, n_heads=32, n_kv=32, head_dim=32, ffn=1024, vocab=100, eps=1e-6)
    assert schedule.attn_split_defaults(one) == (16, 32)
    assert schedule.attn_split_defaults(many) == (64, 8)


OPTIN = 227 * 1024 - 1024   # what runtime.Monokernel lets a CTA use on an H200


@pytest.mark.parametrize("name", ["qwen2.5-coder-0.5b", "llama-3.2-1b", "qwen2.5-coder-1.5b"])
@pytest.mark.parametrize("ranks", [2, 4, 8])
def test_vocab_parallel_sampler_candidates_fit_up_to_8_ranks(name, ranks):
    """The vocabulary-parallel sampler reduces every rank's LM-head records (132 each on an H200): their top-k
    candidates used to be bounded by the partial-sum region alone (8192 floats: 3 ranks at most); they may run to
    the end of shared memory, which holds 8 ranks' worth at the real shapes."""
    from kernels.tp_local import kernel_plan, local_cfg
    cfg = preset(name)
    plan = kernel_plan(cfg, ranks)
    sch = [schedule.build(schedule.Dims.of(local_cfg(cfg, plan, r, vocab_parallel=True)), 132) for r in range(ranks)]
    n_rec = sum(s.n_lm for s in sch)
    lays = [schedule.smem_layout(s, 4096, OPTIN) for s in sch]
    assert n_rec * isa.TOPK * 2 > isa.SMEM_RED_FLOATS or ranks < 4
    assert all(schedule.sampler_fits(n_rec, lay.sampler_floats) for lay in lays), (n_rec, lays)
    for ml in (4096, 8192):   # and with the staging the ranks take (runtime.l1_keep_bytes: 64 KiB on an H200)
        kept = [schedule.smem_layout(s, ml, OPTIN, l1_keep=64 * 1024) for s in sch]
        assert all(schedule.sampler_fits(n_rec, lay.sampler_floats) for lay in kept), (ml, n_rec, kept)
    for s, lay in zip(sch, lays):
        dm = s.dims
        assert lay.smem <= OPTIN and lay.sm_kv * 4 >= s.smem_bytes() and lay.sm_kv % 4 == 0
        # the candidates may run up to the tables (layer table + instruction list), which end shared memory
        assert lay.sampler_floats == lay.sm_tab - max(dm.d, dm.q_dim, dm.ffn)
        assert lay.sm_tab % 4 == 0 and lay.sm_tab >= lay.sm_kv + lay.stage_floats
        assert lay.smem == 4 * (lay.sm_tab + schedule.tables_floats(s))
        assert schedule.tables_floats(s) == dm.n_layers * isa.LAYER_WORDS + max(len(x) for x in s.per_sm) * isa.INSTR_WORDS


def test_smem_layout_staging_bounds():
    s = schedule.build(schedule.Dims.of(preset("qwen2.5-coder-1.5b")), 132)
    assert schedule.smem_layout(s, 512, OPTIN).stage_pos == 128                 # at least 128 positions
    long = schedule.smem_layout(s, 1 << 20, OPTIN)                              # capped by shared memory
    assert 16 <= long.stage_pos < (1 << 20) // s.n_splits and long.smem <= OPTIN
    capped = schedule.smem_layout(s, 1 << 20, OPTIN, cap=64)                    # and by a cap, when given
    assert capped.stage_pos == 64 and capped.smem < long.smem
    assert schedule.smem_layout(s, 512, OPTIN, cap=4096).stage_pos == 128        # a cap above the need changes nothing
    with pytest.raises(ValueError, match="no shared memory left"):
        schedule.smem_layout(s, 4096, s.smem_bytes() + 1024)
    assert not schedule.sampler_fits(1000, 1000 * isa.TOPK * 2 - 1) and schedule.sampler_fits(1000, 16000)


def test_smem_layout_leaves_the_l1_its_share_where_128_positions_still_fit():
    """l1_keep (runtime.l1_keep_bytes: 64 KiB on an H200): the staging stops short of the last l1_keep bytes when it
    keeps at least min(its need, 128) positions there, so the carveout stays at 164 KiB; a need that fits anyway,
    a layout that would keep fewer positions, and l1_keep = 0 are as before."""
    import types
    from kernels.runtime import L1_KEEP_CARVEOUT, l1_keep_bytes
    keep = l1_keep_bytes(types.SimpleNamespace(shared_memory_per_block_optin=227 * 1024))
    assert keep == 64 * 1024 and OPTIN + 1024 - keep == L1_KEEP_CARVEOUT - 1024
    assert l1_keep_bytes(types.SimpleNamespace(shared_memory_per_block_optin=100 * 1024)) == 0
    s = schedule.build(schedule.Dims.of(preset("qwen2.5-coder-1.5b")), 132, fused_mlp=True)
    full, kept = (schedule.smem_layout(s, 1 << 15, OPTIN, l1_keep=k) for k in (0, keep))
    assert full.stage_pos > kept.stage_pos >= schedule.L1_KEEP_MIN_POS
    assert kept.smem <= OPTIN - keep < full.smem
    # the staging holds as many positions as the kept budget allows, no fewer
    assert schedule.smem_layout(s, 1 << 15, OPTIN - keep).stage_pos == kept.stage_pos
    small = schedule.smem_layout(s, 832, OPTIN, l1_keep=keep)   # 128 positions fit below it: unchanged
    assert small == schedule.smem_layout(s, 832, OPTIN)
    # a working region so large that fewer than 128 positions fit below the kept bytes: the whole budget, as before
    big = schedule.build(schedule.Dims.of(preset("qwen2.5-coder-7b")), 132, fused_mlp=True)
    assert schedule.smem_layout(big, 8192, OPTIN, l1_keep=keep) == schedule.smem_layout(big, 8192, OPTIN)
    assert schedule.smem_layout(big, 8192, OPTIN).smem > OPTIN - keep


@pytest.mark.parametrize("name", ["qwen2.5-coder-0.5b", "llama-3.2-1b", "qwen2.5-coder-1.5b"])
def test_side_launch_schedule_and_its_alone_schedule_share_one_layout(name):
    """A cluster launch of 112 CTAs with a side launch of 20 (runtime.Monokernel(side=True)): the attention stays on
    the clusters, every side CTA takes a share of each matvec stage, and one shared-memory layout holds both the
    132-CTA schedule and the main launch's own (more rows per instruction) that it runs alone on."""
    dm = schedule.Dims.of(preset(name))
    both = schedule.build(dm, 132, fused_mlp=True, cluster=16, cluster_ctas=112)
    alone = schedule.build(dm, 112, fused_mlp=True, cluster=16)
    schedule.check(both)
    schedule.check(alone)
    assert both.cluster_ctas == 112 and alone.cluster_ctas == 112
    side_ops = [{ins[0] for ins in lst} for lst in both.per_sm[112:]]
    assert all(isa.OPS["ATTN"] not in ops and {isa.OPS["QKV"], isa.OPS["MLP"]} <= ops for ops in side_ops)
    assert all(both.rows[op] <= alone.rows[op] for op in both.rows) and both.rows["MLP"] < alone.rows["MLP"]
    lay = schedule.smem_layout(both, 4096, OPTIN, alone=alone)
    for s in (both, alone):
        own = schedule.smem_layout(s, 4096, OPTIN)
        assert lay.sm_kv >= own.sm_kv and lay.smem - 4 * lay.sm_tab >= own.smem - 4 * own.sm_tab
    assert lay.smem - 4 * lay.sm_tab == 4 * max(schedule.tables_floats(both), schedule.tables_floats(alone))


@pytest.mark.parametrize("name,cluster,n_clusters,kv_apart,want", [
    ("qwen2.5-coder-0.5b", 16, 7, False, 3),   # 7 q heads in 3 / 2 / 2: 20 / 16 rows per rank (2 parts: 24 rows)
    ("qwen2.5-coder-0.5b", 16, 7, True, 3),    # q rows only: 12 / 8 rows per rank
    ("qwen2.5-coder-1.5b", 16, 7, False, 0),   # rows of 1,536: 16 per batch; 2 q heads + k + v: 32 rows per rank
    ("qwen2.5-coder-1.5b", 16, 7, True, 3),    # 6 q heads in 2 / 2 / 2, q rows only: 16 rows per rank
    ("qwen2.5-coder-1.5b", 8, 14, False, 0),   # 8 ranks: every layout has more than 16 rows per rank
    ("qwen2.5-coder-1.5b", 8, 14, True, 6),    # one q head per part: 16 rows per rank, 12 of the 14 clusters
    ("llama-3.2-1b", 16, 7, True, 0),          # 8 kv heads do not fit 7 clusters even in one part each
])
def test_qkv_parts_default_takes_the_most_parts_that_fit(name, cluster, n_clusters, kv_apart, want):
    """The ATTNQ layout's default parts: the most that the clusters hold with every rank's q / k / v rows (q rows
    with kv_apart) in one early-load batch (16 warps x 2 rows, of 1 row past 1,024 columns); the layout it names
    builds and checks on the H200's cluster launch."""
    dims = schedule.Dims.of(preset(name))
    got = schedule.qkv_parts_default(dims, cluster, n_clusters, kv_apart)
    assert got == want
    if got:
        for parts in range(got + 1, dims.group + 1):   # more parts than the default: past the clusters
            assert dims.n_kv * parts > n_clusters
        s = schedule.build(dims, n_sm=cluster * n_clusters + 20, fused_mlp=True, cluster=cluster,
                           cluster_ctas=cluster * n_clusters, qkv_parts=got, kv_apart=kv_apart)
        schedule.check(s)
        assert s.rows["ATTNQ"] * schedule.items_per_row(dims.d) <= 2 * isa.NWARPS


@pytest.mark.parametrize("name", ["qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b", "llama-3.2-1b"])
def test_mlp_pairs_default_is_on_wherever_build_takes_pairs(name):
    """Monokernel's mlp_pairs default: on for a cluster launch with the fused MLP (the engine's launch of these
    shapes, which then builds and checks with pairs), off without clusters or with GATEUP + DOWN, where build
    refuses pairs; off for a hidden size that is not in 16-byte halves, which build refuses too."""
    dims = schedule.Dims.of(preset(name))
    assert schedule.mlp_pairs_default(dims, 16, True)
    parts = schedule.qkv_parts_default(dims, 16, 7, kv_apart=True)
    s = schedule.build(dims, n_sm=132, fused_mlp=True, cluster=16, cluster_ctas=112, qkv_parts=parts,
                       kv_apart=parts > 0, mlp_pairs=True)
    schedule.check(s)
    assert s.mlp_pairs
    for cluster, fused in ((0, True), (16, False)):
        assert not schedule.mlp_pairs_default(dims, cluster, fused)
        with pytest.raises(ValueError, match="mlp_pairs"):
            schedule.build(dims, n_sm=132, fused_mlp=fused, cluster=cluster, cluster_ctas=112 if cluster else None,
                           mlp_pairs=True)
    odd = dataclasses.replace(dims, d=dims.d + 8)
    assert not schedule.mlp_pairs_default(odd, 16, True)
    with pytest.raises(ValueError, match="multiple of 16"):
        schedule.build(odd, n_sm=132, fused_mlp=True, cluster=16, cluster_ctas=112, mlp_pairs=True)


@given(n=st.integers(1, 40_000), n_splits=st.sampled_from([1, 8, 16, 32]), min_pos=st.sampled_from([1, 16, 40, 64]),
       min_splits=st.sampled_from([0, 8]), stage_pos=st.integers(1, 300))
def test_longest_split_chunks_counts_the_kernels_longest_split(n, n_splits, min_pos, min_splits, stage_pos):
    """longest_split_chunks (runtime.Monokernel.lib_for: which library a launch runs) against the kernel's split
    bounds (mk_attention.cuh attn_step_fill: split s holds [s n / S, (s + 1) n / S) of S splits in use): the staged
    chunks of the longest split."""
    s = schedule.attn_splits_in_use(n, n_splits, min_pos, min_splits, stage_pos)
    longest = max((i + 1) * n // s - i * n // s for i in range(s))
    assert schedule.longest_split_chunks(n, n_splits, min_pos, min_splits, stage_pos) == -(-longest // stage_pos)


@given(m=st.integers(4, 20_000), weights=st.lists(st.floats(0.25, 4.0), min_size=2, max_size=140))
def test_mlp_row_split_covers_the_rows_in_proportion(m, weights):
    """mlp_row_split: bounds from 0 to m, even inside, every share at least two rows, and where every share's
    proportion is at least four rows each bound within one row of its proportion (the even rounding)."""
    if m < 2 * len(weights):
        return
    b = schedule.mlp_row_split(m, weights)
    assert b[0] == 0 and b[-1] == m and len(b) == len(weights) + 1
    assert all(x % 2 == 0 for x in b[1:-1])
    assert all(hi - lo >= 2 for lo, hi in zip(b, b[1:]))
    total = sum(weights)
    if m * min(weights) / total >= 4:
        acc = 0.0
        for i, w in enumerate(weights[:-1]):
            acc += w
            assert abs(b[i + 1] - m * acc / total) <= 1 + 1e-6


def test_mlp_weights_need_the_attnq_layout_and_two_rows_per_cta():
    """build refuses mlp_weights without ATTNQ parts or the fused MLP, with non-positive weights or fewer than two MLP
    rows per CTA; with them every CTA has one MLP instruction (the side launch's schedule and the main launch's own)."""
    dims = schedule.Dims.of(preset("qwen2.5-coder-0.5b"))
    kw = dict(n_sm=132, fused_mlp=True, cluster=16, cluster_ctas=112, qkv_parts=3, kv_apart=True)
    with pytest.raises(ValueError, match="ATTNQ layout"):
        schedule.build(dims, n_sm=132, fused_mlp=True, cluster=16, cluster_ctas=112, mlp_weights=(1.1, 0.9))
    with pytest.raises(ValueError, match="positive"):
        schedule.build(dims, **kw, mlp_weights=(1.0, 0.0))
    with pytest.raises(ValueError, match="MLP rows for 132 CTAs"):
        schedule.build(dataclasses.replace(dims, ffn=256), **kw, mlp_weights=(1.1, 0.9))
    s = schedule.build(dims, **kw, mlp_weights=(1.1, 0.9))
    schedule.check(s)
    assert s.rows["MLP"] > schedule.build(dims, **kw).rows["MLP"] and s.counts["MLP"] == 132
    # the main launch's own schedule (no side CTAs, 112 of them: 4,864 rows are 111 default instructions) takes them too
    alone = schedule.build(dims, n_sm=112, fused_mlp=True, cluster=16, qkv_parts=3, kv_apart=True, mlp_pairs=True,
                           mlp_weights=(1.1, 0.9))
    schedule.check(alone)
    assert alone.counts["MLP"] == 112


@pytest.mark.parametrize("name", ["qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"])
def test_mlp_weights_default_weighs_where_the_kv_rows_are_apart(name):
    """Monokernel's mlp_weights default (schedule.mlp_weights_default): MLP_WEIGHTS for the engine's launch of these
    shapes (ATTNQ parts, k / v rows apart, the fused MLP), the side launch's schedule and the main launch's own, which
    build takes; (1.0, 1.0) without any of the three or with fewer than two MLP rows per CTA."""
    dims = schedule.Dims.of(preset(name))
    parts = schedule.qkv_parts_default(dims, 16, 7, kv_apart=True)
    assert parts > 0
    for n_sm in (132, 112):
        w = schedule.mlp_weights_default(dims, n_sm, 112, 16, parts, True, True)
        assert w == schedule.MLP_WEIGHTS
        s = schedule.build(dims, n_sm=n_sm, fused_mlp=True, cluster=16, cluster_ctas=112, qkv_parts=parts,
                           kv_apart=True, mlp_pairs=True, mlp_weights=w)
        schedule.check(s)
        assert s.mlp_weights == w and s.counts["MLP"] == n_sm
    for args in ((parts, False, True), (0, False, True), (parts, True, False)):
        assert schedule.mlp_weights_default(dims, 132, 112, 16, *args) == (1.0, 1.0)
    assert schedule.mlp_weights_default(dataclasses.replace(dims, ffn=256), 132, 112, 16, parts, True,
                                        True) == (1.0, 1.0)


@given(d=st.integers(4, 128).map(lambda k: 64 * k), ffn=st.integers(33, 40_000).map(lambda k: 8 * k))
def test_mlp_weights_default_only_where_build_takes_them(d, ffn):
    """Wherever mlp_weights_default picks MLP_WEIGHTS (its bound on the longest share), build takes them; where the
    bound says the longest share would not fit the partial sums, build refuses MLP_WEIGHTS or is within one row pair of
    refusing (the bound's margin)."""
    dims = dataclasses.replace(schedule.Dims.of(preset("qwen2.5-coder-0.5b")), d=d, ffn=ffn, n_layers=2)
    kw = dict(n_sm=132, fused_mlp=True, cluster=16, cluster_ctas=112, qkv_parts=3, kv_apart=True, mlp_pairs=True)
    schedule.build(dims, **kw)
    w = schedule.mlp_weights_default(dims, 132, 112, 16, 3, True, True)
    if w == schedule.MLP_WEIGHTS:
        schedule.check(schedule.build(dims, **kw, mlp_weights=w))
        return
    assert w == (1.0, 1.0)
    try:
        s = schedule.build(dims, **kw, mlp_weights=schedule.MLP_WEIGHTS)
    except ValueError as e:
        assert "mlp_weights" in str(e)
        return
    assert not schedule._red_fits(s.rows["MLP"] + 2, d, 2)
