"""Exact-mode sharding plans (engine/tp/shard.py): which heads / channels / vocabulary rows each rank owns, and
per-rank weights that reassemble the dense model."""
import json

import pytest
import torch

from engine.config import ModelConfig, preset
from engine.model import Model
from engine.tp import ShardError, make_plan, rank_layers, shard_weights, split_range


def cfg_(**kw):
    base = dict(arch="qwen2", vocab_size=97, hidden_size=64, n_layers=2, n_heads=4, n_kv_heads=2,
                intermediate_size=102, head_dim=16, qkv_bias=True, tie_word_embeddings=True)
    base.update(kw)
    return ModelConfig(**base)


def test_split_range_balanced_contiguous():
    assert split_range(10, 3) == [(0, 4), (4, 7), (7, 10)]
    assert split_range(8960, 2) == [(0, 4480), (4480, 8960)]
    # aligned units of 64: 8960 = 140 units -> 47, 47, 46 units
    assert split_range(8960, 3, align=64) == [(0, 3008), (3008, 6016), (6016, 8960)]
    assert split_range(100, 2, align=64) == [(0, 64), (64, 100)]     # the last shard takes the partial unit
    with pytest.raises(ShardError):
        split_range(100, 3, align=64)      # only 2 units of 64: a rank would be empty
    with pytest.raises(ShardError):
        split_range(5, 0)


def ranges(plan):
    return [(r.q_heads, r.kv_heads) for r in plan.ranks]


def test_kv_split_when_kv_heads_divide():
    p = make_plan(preset("llama-3.2-1b"), 2)          # 32 q / 8 kv
    assert p.head_split == "kv" and not p.kv_replicated
    assert ranges(p) == [((0, 16), (0, 4)), ((16, 32), (4, 8))]
    assert all(r.group == 4 for r in p.ranks)
    p = make_plan(preset("qwen2.5-coder-1.5b"), 2)    # 12 q / 2 kv
    assert ranges(p) == [((0, 6), (0, 1)), ((6, 12), (1, 2))]
    assert [r.ffn for r in p.ranks] == [(0, 4480), (4480, 8960)]
    assert [r.vocab for r in p.ranks] == [(0, 75968), (75968, 151936)]


def test_group_split_replicates_kv_heads():
    p = make_plan(preset("qwen2.5-coder-0.5b"), 4)    # 14 q / 2 kv over 4 ranks: each kv head on 2 ranks
    assert p.head_split == "group" and p.kv_replicated
    assert ranges(p) == [((0, 4), (0, 1)), ((4, 7), (0, 1)), ((7, 11), (1, 2)), ((11, 14), (1, 2))]
    assert p.kv_holders(0) == [0, 1] and p.kv_holders(1) == [2, 3]
    assert [r.group for r in p.ranks] == [4, 3, 4, 3]
    p = make_plan(preset("qwen2.5-coder-1.5b"), 8)    # 12 q / 2 kv over 8 ranks
    assert [r.n_q for r in p.ranks] == [2, 2, 1, 1, 2, 2, 1, 1] and all(r.n_kv == 1 for r in p.ranks)


def test_balanced_split_straddling_group():
    p = make_plan(cfg_(n_heads=6, n_kv_heads=3, hidden_size=96), 2)   # group 2, cut inside kv head 1
    assert p.head_split == "balanced"
    assert ranges(p) == [((0, 3), (0, 2)), ((3, 6), (1, 3))]
    assert p.kv_holders(1) == [0, 1]
    assert p.ranks[0].kv_of_q == (0, 0, 1) and p.ranks[0].group is None
    assert p.ranks[1].kv_of_q == (0, 1, 1)
    p = make_plan(cfg_(), 3)                                           # 4 q / 2 kv on 3 ranks
    assert ranges(p) == [((0, 2), (0, 1)), ((2, 3), (1, 2)), ((3, 4), (1, 2))]


def test_refusals():
    with pytest.raises(ShardError, match="exceeds the 4 attention heads"):
        make_plan(cfg_(), 5)
    with pytest.raises(ShardError, match="tp must be >= 1"):
        make_plan(cfg_(), 0)
    with pytest.raises(ShardError, match="non-empty"):
        make_plan(cfg_(intermediate_size=3), 4)


def test_plan_serialises_and_counts_bytes():
    c = cfg_()
    p = make_plan(c, 3)
    d = json.loads(json.dumps(p.to_dict()))
    assert d["n_ranks"] == 3 and len(d["ranks"]) == 3 and d["reduce_order"] == [0, 1, 2]
    one = make_plan(c, 1)
    # one rank: every matrix + norms + one embedding row (no biases counted)
    no_bias = c.replace(qkv_bias=False)
    assert one.rank_weight_bytes(0, 1) == no_bias.n_params() + c.hidden_size
    assert sum(p.rank_weight_bytes(r) for r in range(3)) > one.rank_weight_bytes(0)   # replicated KV + norms


@pytest.mark.parametrize("n", [1, 2, 3, 4])
@pytest.mark.parametrize("kw", [{}, dict(arch="llama", qkv_bias=True, o_bias=True, mlp_bias=True,
                                         tie_word_embeddings=False)])
def test_shards_reassemble_dense_weights(n, kw):
    c = cfg_(**kw)
    m = Model(c, max_len=8).init_random(3, std=0.1)
    P = m.params
    plan = make_plan(c, n)
    shards = [shard_weights(P, plan, r) for r in range(n)]
    hd = c.head_dim
    for s in shards:
        for t in s.values():
            assert t.is_contiguous()
    for i in range(c.n_layers):
        a, f = f"model.layers.{i}.self_attn.", f"model.layers.{i}.mlp."
        assert torch.equal(torch.cat([s[a + "q_proj.weight"] for s in shards]), P[a + "q_proj.weight"])
        assert torch.equal(torch.cat([s[a + "q_proj.bias"] for s in shards]), P[a + "q_proj.bias"])
        assert torch.equal(torch.cat([s[a + "o_proj.weight"] for s in shards], 1), P[a + "o_proj.weight"])
        assert torch.equal(torch.cat([s[f + "gate_proj.weight"] for s in shards]), P[f + "gate_proj.weight"])
        assert torch.equal(torch.cat([s[f + "up_proj.weight"] for s in shards]), P[f + "up_proj.weight"])
        assert torch.equal(torch.cat([s[f + "down_proj.weight"] for s in shards], 1), P[f + "down_proj.weight"])
        for r, s in zip(plan.ranks, shards):
            kv = slice(r.kv_heads[0] * hd, r.kv_heads[1] * hd)
            assert torch.equal(s[a + "k_proj.weight"], P[a + "k_proj.weight"][kv])
            assert torch.equal(s[a + "v_proj.bias"], P[a + "v_proj.bias"][kv])
            assert (a + "o_proj.bias" in s) == (r.rank == 0 and c.o_bias)
            assert (f + "down_proj.bias" in s) == (r.rank == 0 and c.mlp_bias)
        layers = [rank_layers(s, c.n_layers)[i] for s in shards]
        assert sum(w.wqkv.shape[0] for w in layers) == sum((r.n_q + 2 * r.n_kv) * hd for r in plan.ranks)
    head = P.get("lm_head.weight", P["model.embed_tokens.weight"])
    assert torch.equal(torch.cat([s["lm_head.weight"] for s in shards]), head)
    assert all(torch.equal(s["model.embed_tokens.weight"], P["model.embed_tokens.weight"]) for s in shards)


def test_shard_dtype_cast():
    c = cfg_()
    m = Model(c, max_len=8).init_random(0)
    s = shard_weights(m.params, make_plan(c, 2), 1, dtype=torch.bfloat16)
    assert all(t.dtype == torch.bfloat16 for t in s.values())
    assert s["model.layers.0.self_attn.o_proj.weight"].shape == (64, 32)   # [out, in], 2 of 4 heads
