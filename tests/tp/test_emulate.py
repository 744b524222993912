"""N-rank emulation of tensor-parallel decoding (engine/tp/emulate.py) against the single-device references:
exact mode vs engine.model.Model, delayed mode vs engine.lanes.LaneModel (all lanes on one device).
Prefill, then decode steps through each rank's own KV cache; fp32, tolerance 1e-5."""
import pytest
import torch

from engine.config import ModelConfig
from engine.lanes import load_lane_checkpoint
from engine.model import Model
from engine.testing_lanes import make_tiny_lane_checkpoint
from engine.tp import DelayedTP, ExactTP, greedy_exchange

TOL = dict(atol=1e-5, rtol=1e-5)
PROMPT = [3, 17, 5, 60, 11, 42]
STEPS = 5

CONFIGS = {
    # Qwen2: QKV bias, tied head; ffn 102 and vocab 97 split unevenly for N = 3, 4; 2 KV heads -> replicated at N=3,4
    "qwen2": dict(arch="qwen2", vocab_size=97, hidden_size=64, n_layers=3, n_heads=4, n_kv_heads=2,
                  intermediate_size=102, head_dim=16, qkv_bias=True, tie_word_embeddings=True, rope_theta=1e6),
    # Llama with o_proj / MLP biases, untied head, llama3 RoPE scaling; 6 q / 3 kv: groups straddle cuts at N=2, 4
    "llama": dict(arch="llama", vocab_size=90, hidden_size=96, n_layers=2, n_heads=6, n_kv_heads=3,
                  intermediate_size=100, head_dim=16, qkv_bias=True, o_bias=True, mlp_bias=True,
                  tie_word_embeddings=False, rms_norm_eps=1e-5, rope_theta=5e5,
                  rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                "high_freq_factor": 4.0, "original_max_position_embeddings": 16}),
    # Llama MQA: one KV head replicated on every rank
    "llama_mqa": dict(arch="llama", vocab_size=64, hidden_size=64, n_layers=2, n_heads=8, n_kv_heads=1,
                      intermediate_size=96, head_dim=8, tie_word_embeddings=True),
}


@pytest.mark.parametrize("n", [1, 2, 3, 4])
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_exact_tp_equals_reference(name, n):
    cfg = ModelConfig(**CONFIGS[name])
    max_len = 16
    model = Model(cfg, max_len=max_len).init_random(seed=5, std=0.1)
    k = torch.zeros(1, cfg.n_layers, cfg.n_kv_heads, max_len, cfg.head_dim)
    v = torch.zeros_like(k)
    tp = ExactTP(model, n)
    ids = torch.tensor(PROMPT)
    ref = model.forward(k, v, 0, ids, 0, all_logits=True)
    out = tp.forward(ids, 0, all_logits=True)
    assert ref.std() > 0.3          # logits of a size where 1e-5 means something
    torch.testing.assert_close(out.logits, ref, **TOL)
    token, pos = out.token, len(PROMPT)
    assert token == int(ref[-1].argmax())
    for _ in range(STEPS):
        ref = model.forward(k, v, 0, torch.tensor([token]), pos)
        out = tp.forward(torch.tensor([token]), pos)
        torch.testing.assert_close(out.logits, ref, **TOL)
        assert out.token == int(ref.argmax())
        assert out.exchanges == {"allreduce_hidden": 2 * cfg.n_layers, "argmax_pairs": 1}
        # all ranks hold the same residual stream, bit for bit (same reduction order everywhere)
        assert all(torch.equal(x, tp.residuals[0]) for x in tp.residuals)
        token, pos = out.token, pos + 1
    # each rank's KV cache holds exactly its KV heads of the reference cache (replicated heads on every holder)
    for r, s in enumerate(tp.plan.ranks):
        kv = slice(*s.kv_heads)
        torch.testing.assert_close(tp.k[r][:, :, :pos], k[0, :, kv, :pos], **TOL)
        torch.testing.assert_close(tp.v[r][:, :, :pos], v[0, :, kv, :pos], **TOL)


def test_exact_tp_ranks_use_only_their_shards():
    """Poisoning the full model's weights after sharding must not change the emulation (no hidden reads)."""
    cfg = ModelConfig(**CONFIGS["qwen2"])
    model = Model(cfg, max_len=16).init_random(seed=1, std=0.1)
    k = torch.zeros(1, cfg.n_layers, cfg.n_kv_heads, 16, cfg.head_dim)
    ids = torch.tensor(PROMPT)
    ref = model.forward(k, torch.zeros_like(k), 0, ids, 0)
    tp = ExactTP(model, 3)
    for t in model.params.values():
        t.fill_(float("nan"))
    out = tp.forward(ids, 0).logits
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, ref, **TOL)


def test_greedy_exchange_tie_goes_to_lowest_rank():
    assert greedy_exchange([(1.0, 3), (2.0, 40), (2.0, 70)]) == 40
    assert greedy_exchange([(5.0, 0), (-1.0, 10)]) == 0


LANE_CASES = [
    (1, {}),
    (2, {}),
    (4, {}),
    (2, dict(broadcast_delay=2)),
    (4, dict(broadcast_delay=2, use_early_comm=False)),
    (2, dict(lm_head_type="vocab_parallel")),
    (4, dict(lm_head_type="lane", replicated_rmsn_scale=False)),
    (2, dict(pre_norm_lane_agg=True, replicated_rmsn_scale=False)),
    (2, dict(sliding_window=3, sliding_window_n_layers=2)),
    (2, dict(tie_word_embeddings=True)),
    (2, dict(use_comm=False)),
]


def _lane_model(tmp_path, lanes, overrides, early_queue=None):
    d = make_tiny_lane_checkpoint(tmp_path / "ckpt", lanes=lanes, seed=4, **overrides)
    return load_lane_checkpoint(d, **({} if early_queue is None else {"early_queue": early_queue}))


def _check_delayed(m):
    tp = DelayedTP(m)
    cache = m.new_cache()
    ids = torch.tensor(PROMPT)
    ref = m.forward(ids, cache)
    out = tp.forward(ids)
    torch.testing.assert_close(out.logits, ref, **TOL)
    token = out.token
    assert token == int(ref[-1].argmax())
    for _ in range(STEPS):
        ref, hidden = m.forward(torch.tensor([token]), cache, return_hidden=True)
        out = tp.forward(torch.tensor([token]))
        torch.testing.assert_close(out.logits, ref, **TOL)
        # rank l's residual is lane l's stream of the reference
        for r, x in enumerate(tp.residuals):
            torch.testing.assert_close(x[0, :, 0], hidden[:, r], **TOL)
        assert out.token == int(ref[-1].argmax())
        token = out.token
    return out


@pytest.mark.parametrize("lanes,overrides", LANE_CASES, ids=[f"L{a}-{'-'.join(b) or 'default'}"
                                                             for a, b in LANE_CASES])
def test_delayed_tp_equals_lane_reference(tmp_path, lanes, overrides):
    _check_delayed(_lane_model(tmp_path, lanes, overrides))


def test_delayed_tp_not_queued_variant(tmp_path):
    """Ambiguity A1 'not queued': PAST layers right after the early ones use their own partial only."""
    _check_delayed(_lane_model(tmp_path, 2, dict(broadcast_delay=2, num_hidden_layers=5), early_queue=False))


def test_delayed_tp_rank_holds_one_lane(tmp_path):
    m = _lane_model(tmp_path, 4, {})
    tp = DelayedTP(m)
    wq = m.w["model.layers.0.attention.wq.weight"]                  # [L, Q/L, D]
    for r, rm in enumerate(tp.ranks):
        assert torch.equal(rm.w["model.layers.0.attention.wq.weight"], wq[r:r + 1])
        assert rm.cfg.num_heads == m.cfg.heads_per_lane and rm.cfg.num_kv_heads == m.cfg.kv_heads_per_lane


@pytest.mark.parametrize("early,expect", [(True, {"blocking": 4, "async": 22}),
                                          (False, {"blocking": 0, "async": 26})])
def test_delayed_exchange_count_matches_spec(tmp_path, early, expect):
    """DTP-laneformer.md §7: N=15 layers, delta=2 -> layers 0..12 exchange, x2 sub-blocks = 26 collectives,
    4 of them blocking when use_early_comm (their sums are reused at i+delta, no second transfer)."""
    m = _lane_model(tmp_path, 2, dict(num_hidden_layers=15, broadcast_delay=2, use_early_comm=early))
    out = DelayedTP(m).forward(torch.tensor([1, 2]))
    assert out.exchanges == expect
