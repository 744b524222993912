"""One-process emulation of tensor-parallel decoding: N ranks, each with only its own shard and its own KV cache,
exchanging exactly what the multi-GPU engine exchanges. Runs on any device; CPU tests use it as the
specification the in-kernel peer exchange must reproduce.

- ExactTP (tp_mode='exact', engine/tp/shard.py): each rank computes partial O-proj and down-proj outputs from
  its heads / FFN channels; every rank merges the N partials in rank order 0..N-1 where they are consumed (before
  the next RMSNorm), so all residual streams stay bit-identical; the LM head is vocabulary-parallel and greedy
  decoding exchanges one (max logit, index) pair per rank. Equals engine.model.Model up to summation order.
- DelayedTP (tp_mode='delayed', /work/shared/DTP-laneformer.md §7): rank l runs lane l of an
  engine.lanes.LaneModel with only lane l's weights (engine.lanes.lane_shard) and KV heads; the per-lane attention
  and MLP are the lane reference's own code (a one-lane LaneModel per rank), only the exchanges live here:
  PRESENT = blocking sum, PAST = the sum of layer i-delta (kept from an earlier exchange), NO_REDUCE = own x sqrt(L).
  Equals LaneModel (all lanes on one device) up to summation order.

Exchanges are counted per forward call (`exchanges`): what a real engine would send, for schedule checks.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from ..lanes.config import LaneConfig, ReduceMode
from ..lanes.loader import expected_shapes, lane_shard
from ..lanes.model import LaneModel, norm_key
from ..model import Model, apply_rope, rms_norm
from .shard import TPPlan, make_plan, rank_layers, shard_weights, split_range


def ordered_sum(parts: list[torch.Tensor]) -> torch.Tensor:
    """p_0 + p_1 + ... + p_{N-1}, left to right: the one reduction order every rank uses."""
    acc = parts[0]
    for p in parts[1:]:
        acc = acc + p
    return acc


def greedy_exchange(pairs: list[tuple[float, int]]) -> int:
    """pairs[r] = (max logit, global index) of rank r's vocabulary slice -> the global argmax token.
    Strictly greater wins, so ties go to the lowest rank = the lowest index (torch.argmax on full logits)."""
    best_v, best_i = pairs[0]
    for v, i in pairs[1:]:
        if v > best_v:
            best_v, best_i = v, i
    return best_i


@dataclass
class TPStep:
    logits: torch.Tensor                  # fp32 [T, V] (all positions) or [V] (last): the vocab slices concatenated
    token: int                            # greedy next token after the last position, from the (max, index) exchange
    rank_maxima: list[tuple[float, int]]  # what each rank sent for it
    exchanges: dict = field(default_factory=dict)


class ExactTP:
    """Exact-mode TP over `n_ranks` emulated ranks of an engine.model.Model (its weights are sharded, not used)."""

    def __init__(self, model: Model, n_ranks: int, max_len: int | None = None, plan: TPPlan | None = None):
        cfg = model.cfg
        self.cfg, self.model = cfg, model
        self.plan = plan or make_plan(cfg, n_ranks)
        self.max_len = min(max_len or model.max_len, model.max_len)   # the model's RoPE tables bound it
        self.shards = [shard_weights(model.params, self.plan, r) for r in range(self.plan.n_ranks)]
        self.layers = [rank_layers(s, cfg.n_layers) for s in self.shards]
        # Per-rank KV cache [n_layers, local kv heads, max_len, hd] (one sequence): only the heads the rank holds.
        self.k = [torch.zeros(cfg.n_layers, s.n_kv, self.max_len, cfg.head_dim, dtype=model.dtype,
                              device=model.device) for s in self.plan.ranks]
        self.v = [torch.zeros_like(k) for k in self.k]
        self.residuals: list[torch.Tensor] = []    # per-rank final residual of the last call (bit-identity checks)

    @torch.inference_mode()
    def forward(self, ids: torch.Tensor, start: int, all_logits: bool = False) -> TPStep:
        """ids: LongTensor [T] at positions start..start+T-1; writes each rank's KV; returns TPStep."""
        cfg, plan, N = self.cfg, self.plan, self.plan.n_ranks
        T = ids.shape[0]
        end = start + T
        if end > self.max_len:
            raise ValueError(f"sequence of {end} tokens exceeds max_len {self.max_len}")
        cos, sin = self.model.cos[start:end], self.model.sin[start:end]
        mask = None
        if T > 1:
            qpos = torch.arange(start, end, device=ids.device)[:, None]
            mask = torch.arange(end, device=ids.device)[None, :] <= qpos
        # Embedding replicated: every rank reads the same rows; residual fp32 as in the reference.
        xs = [F.embedding(ids, s["model.embed_tokens.weight"]).float() for s in self.shards]
        eps, hd = cfg.rms_norm_eps, cfg.head_dim
        n_ex = 0
        for li in range(cfg.n_layers):
            parts = []
            for r, s in enumerate(plan.ranks):
                w = self.layers[r][li]
                h = rms_norm(xs[r], w.ln1, eps)
                qkv = F.linear(h, w.wqkv, w.bqkv)                                   # [T, (nq + 2 nkv) hd]
                nq, nkv = s.n_q, s.n_kv
                qk = apply_rope(qkv[:, :(nq + nkv) * hd].view(T, nq + nkv, hd).transpose(0, 1), cos, sin)
                kc, vc = self.k[r][li], self.v[r][li]                               # [nkv, max_len, hd]
                kc[:, start:end] = qk[nq:]
                vc[:, start:end] = qkv[:, (nq + nkv) * hd:].view(T, nkv, hd).transpose(0, 1)
                sel = torch.tensor(s.kv_of_q, device=ids.device)
                o = F.scaled_dot_product_attention(qk[:nq][None], kc[sel, :end][None], vc[sel, :end][None],
                                                   attn_mask=mask)[0]               # [nq, T, hd]
                parts.append(F.linear(o.transpose(0, 1).reshape(T, nq * hd), w.wo, w.bo).float())
            xs = [x + ordered_sum(parts) for x in xs]   # each rank merges all partials, rank order
            n_ex += 1
            parts = []
            for r in range(N):
                w = self.layers[r][li]
                h = rms_norm(xs[r], w.ln2, eps)
                g, u = F.linear(h, w.wgu, w.bgu).chunk(2, dim=-1)
                parts.append(F.linear(F.silu(g) * u, w.wd, w.bd).float())
            xs = [x + ordered_sum(parts) for x in xs]
            n_ex += 1
        self.residuals = xs
        if not all_logits:
            xs = [x[-1] for x in xs]
        slices = [F.linear(rms_norm(x, s["model.norm.weight"], eps), s["lm_head.weight"]).float()
                  for x, s in zip(xs, self.shards)]
        last = [sl[-1] if all_logits else sl for sl in slices]
        maxima = []
        for r, sl in enumerate(last):
            v, i = sl.max(dim=-1)
            maxima.append((float(v), int(i) + plan.ranks[r].vocab[0]))
        return TPStep(logits=torch.cat(slices, dim=-1), token=greedy_exchange(maxima), rank_maxima=maxima,
                      exchanges={"allreduce_hidden": n_ex, "argmax_pairs": 1})


# ---- delayed mode ------------------------------------------------------------------------------------------
def lane_rank_config(cfg: LaneConfig) -> LaneConfig:
    """The one-lane config whose LaneModel computes exactly lane l's own partials with lane l's weights."""
    return cfg.with_overrides(num_lanes=1, num_heads=cfg.heads_per_lane, num_kv_heads=cfg.kv_heads_per_lane,
                              intermediate_size=cfg.ffn_per_lane)


def lane_rank_weights(cfg: LaneConfig, weights, lane: int) -> dict[str, torch.Tensor]:
    """engine.lanes.lane_shard(...) for `lane`, with lane tensors given back a lane axis of size 1 so a one-lane
    LaneModel reads them in the published layout ([1, out, in], per-lane gains [1, D])."""
    shapes = expected_shapes(cfg)
    out = {}
    for k, t in lane_shard(cfg, weights, lane).items():
        shp = shapes.get(k)
        lane_axis = shp is not None and (len(shp) == 3 or (len(shp) == 2 and k.endswith(".scale")))
        out[k] = t[None] if lane_axis else t
    return out


class DelayedTP:
    """Delayed-mode TP: one emulated rank per lane of `lane_model`, each holding only its lane's weights and KV."""

    def __init__(self, lane_model: LaneModel):
        cfg = lane_model.cfg
        self.cfg, self.L = cfg, cfg.num_lanes
        rcfg = lane_rank_config(cfg)
        self.ranks = [LaneModel(rcfg, lane_rank_weights(cfg, lane_model.w, r), dtype=lane_model.dtype)
                      for r in range(self.L)]
        self.caches = [m.new_cache() for m in self.ranks]
        self.residuals: list[torch.Tensor] = []

    def _update(self, mode: ReduceMode, own: list[torch.Tensor], past_sum: torch.Tensor | None,
                past_own: list[torch.Tensor] | None) -> tuple[list[torch.Tensor], torch.Tensor | None, int]:
        """Per-rank residual updates of one sub-block; also the sum of `own` if this step all-reduced it now.
        own[r]: rank r's raw partial [1, S, 1, D]. Returns (updates, present_sum or None, blocking exchanges)."""
        if mode is ReduceMode.NO_REDUCE:
            return [p * math.sqrt(self.L) for p in own], None, 0
        if mode is ReduceMode.PRESENT:
            s = ordered_sum(own)
            return [s for _ in own], s, 1
        if past_sum is None:
            if self.cfg.early_queue:
                raise RuntimeError("PAST layer found no exchanged partials (queue indexing bug)")
            return list(own), None, 0        # A1 "not queued": own partial only, scale 1
        return [p + (past_sum - q) for p, q in zip(own, past_own)], None, 0

    @torch.inference_mode()
    def forward(self, ids) -> TPStep:
        """ids [S] token ids (one sequence), continuing each rank's cache. Returns fp32 logits [S, V]."""
        cfg, L, delay = self.cfg, self.L, self.cfg.broadcast_delay
        ids = torch.as_tensor(ids, device=self.ranks[0].device)[None]               # [1, S]
        S = ids.shape[1]
        past_len = self.caches[0].length
        pos = torch.arange(past_len, past_len + S, device=ids.device)
        xs = [m.w["model.tok_embeddings.weight"][ids][:, :, None, :] for m in self.ranks]   # [1, S, 1, D]
        # Per sub-block queues of layer i: sum over ranks (None if never exchanged) and each rank's raw partial.
        sums = {"attn": [], "mlp": []}
        owns = {"attn": [], "mlp": []}
        blocking = asynchronous = 0
        for i in range(cfg.num_layers):
            modes = dict(zip(("attn", "mlp"), cfg.layer_modes(i)))
            pre = f"model.layers.{i}."
            for sub in ("attn", "mlp"):
                own = []
                for r, m in enumerate(self.ranks):
                    if sub == "attn":
                        a = m._norm(xs[r], m.w[norm_key(m.cfg, pre + "attention_norm")])
                        own.append(m._attention(i, a, pos, self.caches[r]))
                    else:
                        a = m._norm(xs[r], m.w[norm_key(m.cfg, pre + "ffn_norm")])
                        own.append(m._mlp(i, a))
                j = i - delay
                past_sum = sums[sub][j] if i >= delay else None
                past_own = owns[sub][j] if i >= delay else None
                upd, now_sum, blk = self._update(modes[sub], own, past_sum, past_own)
                blocking += blk
                xs = [x + u for x, u in zip(xs, upd)]
                if cfg.is_queued(i):
                    if now_sum is None:                 # not summed yet: an async all-reduce, due at i + delay
                        now_sum = ordered_sum(own)
                        asynchronous += 1
                    sums[sub].append(now_sum)
                    owns[sub].append(own)
                else:
                    sums[sub].append(None)
                    owns[sub].append(None)
        for c in self.caches:
            c.length += S
        self.residuals = xs
        logits = self._head(xs)[0].float()                                          # [S, V]
        maxima = []
        for r, (a, b) in enumerate(self._vocab_slices()):
            v, k = logits[-1, a:b].max(dim=-1)
            maxima.append((float(v), int(k) + a))
        return TPStep(logits=logits, token=greedy_exchange(maxima), rank_maxima=maxima,
                      exchanges={"blocking": blocking, "async": asynchronous})

    def _vocab_slices(self) -> list[tuple[int, int]]:
        """Vocabulary rows each rank argmaxes (a vocab_parallel head's own slice; with the other heads the
        logits are the same on every rank, and the engine splits them the same way)."""
        return split_range(self.cfg.vocab_size, self.L)

    def _head(self, xs: list[torch.Tensor]) -> torch.Tensor:
        """Final aggregation across ranks (spec §5, §7 final step). xs[r] [1, S, 1, D] -> logits [1, S, V]."""
        cfg, ms = self.cfg, self.ranks
        fin = [m.w[norm_key(m.cfg, "model.norm", final=True)] for m in ms]
        if cfg.pre_norm_lane_agg:                  # all-reduce of x, shared norm, replicated head
            h = ms[0]._norm(ordered_sum(xs)[:, :, 0], fin[0])
            return h @ ms[0]._replicate_head().T
        n = [m._norm(x, g) for m, x, g in zip(ms, xs, fin)]                        # [1, S, 1, D] each
        if cfg.lm_head_type == "replicate":        # all-reduce of the normed streams, mean, replicated head
            h = ordered_sum(n)[:, :, 0] / self.L
            return h @ ms[0]._replicate_head().T
        if cfg.lm_head_type == "lane":             # all-reduce of per-lane partial logits
            return ordered_sum([x[:, :, 0] @ m.w["lm_head.linear.weight"].T for m, x in zip(ms, n)])
        # vocab_parallel: lane l's V/L slice from its own stream, gathered
        return torch.cat([x[:, :, 0] @ m.w["lm_head.weight"][0].T for m, x in zip(ms, n)], dim=-1)
