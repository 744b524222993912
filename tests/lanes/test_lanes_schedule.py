"""Engine-shaped simulation of delayed TP (spec §7, A1=[V]): every lane holds only its shard
(lane_shard), its own KV cache and its own last-δ raw partials, and sees the other lanes only
through collectives (sum of partials, sum of normed states, concat of logits). Prefill plus
token-by-token decode must reproduce the single-device reference at every step.

Lane-local compute reuses LaneModel's attention/MLP on a one-lane view of the shard (dims Hq/L,
Hkv/L, F/L); what is under test here is the communication schedule, not the local math.
"""

import math

import pytest
import torch

from engine.lanes import LaneModel, ReduceMode, lane_shard

SEQ = [7, 21, 3, 55, 80, 12, 41, 66, 9, 30]


class Lane:
    def __init__(self, cfg, weights, lane):
        self.cfg, self.lane = cfg, lane
        self.shard = lane_shard(cfg, weights, lane)
        local = cfg.with_overrides(num_lanes=1, num_heads=cfg.heads_per_lane,
                                   num_kv_heads=cfg.kv_heads_per_lane,
                                   intermediate_size=cfg.ffn_per_lane, replicated_rmsn_scale=True,
                                   lm_head_type="replicate", pre_norm_lane_agg=False,
                                   tie_word_embeddings=False)
        w = {}
        for k, t in self.shard.items():
            w[k] = t[None] if (".attention.w" in k or ".feed_forward.w" in k) else t
        w.setdefault("lm_head.weight", torch.zeros(1, cfg.hidden_size))   # unused by the local view
        self.local = LaneModel(local, w)
        self.cache = self.local.new_cache()
        self.own = {}            # (layer, sub) -> own raw partial, kept for δ layers only

    def partial(self, i, sub, x, pos):
        """x [S, D] -> own partial [S, D] from local weights and the local KV cache only."""
        m, p = self.local, f"model.layers.{i}."
        gain = self.shard[p + ("attention_norm" if sub == "attn" else "ffn_norm")
                          + (".weight" if self.cfg.replicated_rmsn_scale else ".scale")]
        a = m._norm(x, gain)[None, :, None]                              # [1, S, 1, D]
        out = m._attention(i, a, pos, self.cache) if sub == "attn" else m._mlp(i, a)
        return out[0, :, 0]


def all_reduce(values):
    total = values[0].clone()
    for v in values[1:]:
        total = total + v
    return [total.clone() for _ in values]        # every lane gets the same sum


def run_step(cfg, lanes, ids, start):
    """One forward of `ids` (prefill chunk or one token) at positions start.. on all lanes."""
    L, delay = cfg.num_lanes, cfg.broadcast_delay
    pos = torch.arange(start, start + len(ids))
    x = [ln.shard["model.tok_embeddings.weight"][torch.tensor(ids)].clone() for ln in lanes]
    sums = {}                                     # (layer, sub) -> result of the collective
    for i in range(cfg.num_layers):
        modes = cfg.layer_modes(i)
        for sub, mode in zip(("attn", "mlp"), modes):
            p = [ln.partial(i, sub, x[l], pos) for l, ln in enumerate(lanes)]
            if mode is ReduceMode.PRESENT:
                s = all_reduce(p)                 # blocking; the sum is reused at i + δ
                x = [x[l] + s[l] for l in range(L)]
            elif mode is ReduceMode.NO_REDUCE:
                x = [x[l] + math.sqrt(L) * p[l] for l in range(L)]
            else:
                old, mine = sums.pop((i - delay, sub)), [ln.own.pop((i - delay, sub)) for ln in lanes]
                x = [x[l] + (p[l] + (old[l] - mine[l])) for l in range(L)]
            if i + delay < cfg.num_layers and cfg.layer_modes(i + delay)[0 if sub == "attn" else 1] \
                    is ReduceMode.PAST:
                sums[(i, sub)] = s if mode is ReduceMode.PRESENT else all_reduce(p)   # "async"
                for l, ln in enumerate(lanes):
                    ln.own[(i, sub)] = p[l]
    assert not sums and all(not ln.own for ln in lanes)   # every queued collective was consumed
    for ln in lanes:
        ln.cache.length += len(ids)
    normed = [ln.local._norm(x[l], ln.shard["model.norm.weight" if cfg.final_norm_shared
                                             else "model.norm.scale"]) for l, ln in enumerate(lanes)]
    if cfg.lm_head_type == "vocab_parallel":
        return torch.cat([n @ ln.shard["lm_head.weight"].T for n, ln in zip(normed, lanes)], dim=-1)
    if cfg.lm_head_type == "lane":
        return all_reduce([n @ ln.shard["lm_head.linear.weight"].T for n, ln in zip(normed, lanes)])[0]
    h = all_reduce(normed)[0] / L
    return h @ lanes[0].shard["lm_head.weight"].T


@pytest.mark.parametrize("lanes,overrides", [
    (2, dict(broadcast_delay=2, use_early_comm=True, sliding_window=4, sliding_window_n_layers=2)),
    (4, dict(broadcast_delay=1, use_early_comm=False, lm_head_type="vocab_parallel")),
    (2, dict(broadcast_delay=2, use_early_comm=False, lm_head_type="lane", replicated_rmsn_scale=False)),
    (4, dict(broadcast_delay=3, use_early_comm=True)),
])
def test_per_lane_schedule_matches_reference(lane_model, lanes, overrides):
    ref = lane_model(lanes=lanes, seed=13, **overrides)
    cfg = ref.cfg
    want = ref(torch.tensor(SEQ))
    sim = [Lane(cfg, ref.w, l) for l in range(lanes)]
    got = [run_step(cfg, sim, SEQ[:4], 0)]
    for p in range(4, len(SEQ)):
        got.append(run_step(cfg, sim, SEQ[p:p + 1], p))
    torch.testing.assert_close(torch.cat(got), want, atol=1e-4, rtol=1e-4)
    assert sim[1].cache.k[0].shape[:2] == (1, cfg.kv_heads_per_lane)   # lane holds only its KV heads
