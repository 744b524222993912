"""(4) Delayed semantics: the vectorised lane reference vs a deliberately naive per-lane,
per-head, per-token loop written here from the spec's equations (§3-§5), to catch queue indexing,
lane/head layout and head-type mistakes. Also checks that delayed mode differs from dense.
"""

import math

import pytest
import torch

from engine.lanes import to_dense_llama

TOL = 1e-4


def naive_forward(cfg, w, ids):
    """ids: list of token ids (one sequence). Returns logits [S, V] (float64 math)."""
    W = {k: v.double() for k, v in w.items()}
    L, D, N, S = cfg.num_lanes, cfg.hidden_size, cfg.num_layers, len(ids)
    hd, hl, kl = cfg.head_dim, cfg.num_heads // L, cfg.num_kv_heads // L
    rep = cfg.num_heads // cfg.num_kv_heads
    delay = cfg.broadcast_delay

    def gain(key, lane):
        return W[key + ".weight"] if (key + ".weight") in W else W[key + ".scale"][lane]

    def norm(v, g):
        return v / math.sqrt(float((v * v).mean()) + cfg.norm_eps) * g

    def rope(vec, pos):
        out = vec.clone()
        for k in range(hd // 2):
            ang = pos * cfg.rope_theta ** (-2.0 * k / hd)
            a, b = vec[2 * k], vec[2 * k + 1]
            out[2 * k] = a * math.cos(ang) - b * math.sin(ang)
            out[2 * k + 1] = a * math.sin(ang) + b * math.cos(ang)
        return out

    def attn_partial(i, lane, xs):
        p = f"model.layers.{i}."
        a = [norm(x, gain(p + "attention_norm", lane)) for x in xs]
        wq, wk = W[p + "attention.wq.weight"][lane], W[p + "attention.wk.weight"][lane]
        wv, wo = W[p + "attention.wv.weight"][lane], W[p + "attention.wo.weight"][lane]
        # rotated per-head vectors: q[s][j], k[t][j] ([hd] each), rotation at the token's position
        q = [[rope((wq @ v)[j * hd:(j + 1) * hd], s) for j in range(hl)] for s, v in enumerate(a)]
        k = [[rope((wk @ v)[j * hd:(j + 1) * hd], t) for j in range(kl)] for t, v in enumerate(a)]
        v_ = [wv @ v for v in a]
        outs = []
        for s in range(S):
            heads = []
            for j in range(hl):
                g_head = lane * hl + j
                kv_local = g_head // rep - lane * kl     # GQA: global kv head, as a local index
                allowed = [t for t in range(s + 1)
                           if not (cfg.is_swa(i) and s - t >= cfg.sliding_window)]
                sc = torch.stack([q[s][j] @ k[t][kv_local] for t in allowed]) / math.sqrt(hd)
                pr = torch.softmax(sc, 0)
                heads.append(sum(pr[n] * v_[t][kv_local * hd:(kv_local + 1) * hd]
                                 for n, t in enumerate(allowed)))
            outs.append(wo @ torch.cat(heads))
        return outs

    def mlp_partial(i, lane, xs):
        p = f"model.layers.{i}."
        f = p + "feed_forward."
        res = []
        for x in xs:
            a = norm(x, gain(p + "ffn_norm", lane))
            h = torch.nn.functional.silu(W[f + "w1.weight"][lane] @ a) * (W[f + "w3.weight"][lane] @ a)
            res.append(W[f + "w2.weight"][lane] @ h)
        return res

    emb = W["model.tok_embeddings.weight"]
    x = [[emb[t].clone() for t in ids] for _ in range(L)]          # x[lane][pos] -> [D]
    history = {}                                                   # (layer, sub) -> partial[lane][pos]
    for i in range(N):
        for sub, fn in (("attn", attn_partial), ("mlp", mlp_partial)):
            own = [fn(i, lane, x[lane]) for lane in range(L)]
            history[(i, sub)] = own
            comm = cfg.use_comm and (cfg.use_attention_comm if sub == "attn" else cfg.use_mlp_comm)
            for lane in range(L):
                for s in range(S):
                    if i < delay:
                        upd = sum(own[j][s] for j in range(L)) if cfg.use_early_comm \
                            else math.sqrt(L) * own[lane][s]
                    elif not comm:
                        upd = math.sqrt(L) * own[lane][s]
                    elif i - delay < delay and not cfg.early_queue:
                        upd = own[lane][s]                         # A1 "not queued" variant
                    else:
                        old = history[(i - delay, sub)]
                        upd = own[lane][s] + sum(old[j][s] for j in range(L) if j != lane)
                    x[lane][s] = x[lane][s] + upd
    logits = []
    for s in range(S):
        normed = [norm(x[lane][s], gain("model.norm", lane)) for lane in range(L)]
        if cfg.pre_norm_lane_agg:
            h = norm(sum(x[lane][s] for lane in range(L)), W["model.norm.weight"])
            logits.append(W["lm_head.weight"] @ h)
        elif cfg.lm_head_type == "replicate":
            logits.append(W["lm_head.weight"] @ (sum(normed) / L))
        elif cfg.lm_head_type == "lane":
            logits.append(W["lm_head.linear.weight"] @ torch.cat(normed))
        else:
            logits.append(torch.cat([W["lm_head.weight"][lane] @ normed[lane] for lane in range(L)]))
    return torch.stack(logits).float()


SEQ = [5, 17, 3, 88, 41, 9, 60]


@pytest.mark.parametrize("lanes", [2, 4])
@pytest.mark.parametrize("delay", [1, 2])
@pytest.mark.parametrize("early", [True, False])
def test_delayed_matches_naive_and_differs_from_dense(lane_model, hf_logits, lanes, delay, early):
    m = lane_model(lanes=lanes, broadcast_delay=delay, use_early_comm=early, seed=delay)
    got = m(torch.tensor(SEQ))
    torch.testing.assert_close(got, naive_forward(m.cfg, m.w, SEQ), atol=TOL, rtol=TOL)
    kw, sd = to_dense_llama(m.cfg, m.w)
    dense = hf_logits(kw, sd, [SEQ])[0]
    assert (got - dense).abs().max() > 0.05


@pytest.mark.parametrize("overrides", [
    dict(broadcast_delay=2, use_early_comm=True, early_queue=False),      # A1 alternative
    dict(broadcast_delay=2, use_early_comm=False, early_queue=False),
    dict(broadcast_delay=1, use_comm=False),
    dict(broadcast_delay=1, use_mlp_comm=False),                          # released per-sub-block switch
    dict(broadcast_delay=1, replicated_rmsn_scale=False),                 # per-lane gains [L, D]
    dict(broadcast_delay=2, sliding_window=3, sliding_window_n_layers=-2),
    dict(broadcast_delay=1, lm_head_type="lane"),
    dict(broadcast_delay=1, lm_head_type="vocab_parallel"),
    dict(broadcast_delay=2, pre_norm_lane_agg=True),
    dict(broadcast_delay=1, replicated_rmsn_scale=False, pre_norm_lane_agg=True),
])
def test_variants_match_naive(lane_model, overrides):
    early_queue = overrides.pop("early_queue", None)
    m = lane_model(lanes=2, seed=11, **overrides)
    if early_queue is not None:
        m.cfg = m.cfg.with_overrides(early_queue=early_queue)
    got = m(torch.tensor(SEQ))
    torch.testing.assert_close(got, naive_forward(m.cfg, m.w, SEQ), atol=TOL, rtol=TOL)


def test_a1_switch_changes_only_what_it_should(lane_model):
    """A1 matters exactly where a PAST layer reads a layer < δ: for δ=2, N=4 layers 2 and 3 read
    layers 0 and 1, so flipping the switch must change the logits."""
    m = lane_model(lanes=2, broadcast_delay=2, seed=5)
    base = m(torch.tensor(SEQ))
    m.cfg = m.cfg.with_overrides(early_queue=False)
    assert (m(torch.tensor(SEQ)) - base).abs().max() > 1e-2


def test_streams_identical_until_first_past_layer(lane_model):
    m = lane_model(lanes=4, broadcast_delay=2, use_early_comm=True)
    collect = []
    m.forward(torch.tensor(SEQ), collect=collect)
    assert len(collect) == 4 and collect[0].shape == (1, len(SEQ), 4, 64)
    for i, x in enumerate(collect):
        same = torch.equal(x, x[:, :, :1].expand_as(x))
        assert same == (i < 2), i


def test_bf16_reference_tracks_fp32(lane_model):
    """bf16 weights/activations (fp32 norm statistics, RoPE and softmax) stay close to fp32."""
    from engine.lanes import LaneModel
    m = lane_model(lanes=4, broadcast_delay=2, use_early_comm=False, seed=8)
    want = m(torch.tensor(SEQ))
    half = LaneModel(m.cfg, m.w, dtype=torch.bfloat16)
    got = half(torch.tensor(SEQ))
    assert got.dtype == torch.float32 and half.w["model.layers.0.attention.wq.weight"].dtype == torch.bfloat16
    cos = torch.nn.functional.cosine_similarity(got, want, dim=-1)
    assert cos.min() > 0.999, cos
    assert 0 < (got - want).abs().max() < 0.25
