"""Single-device reference of the Laneformer lane model (delayed tensor parallelism, tp_mode='delayed').

All L lanes are simulated in one process: activations carry a lane axis, hidden state [B, S, L, D],
and lane l's slice is lane l's own residual stream (spec /work/shared/DTP-laneformer.md §3-§5).
This module defines the truth that a multi-GPU engine (GPU l = lane l) must reproduce.

Semantics implemented (tags from the spec):
- lane linears: y_l = W[l] · x_l with W of shape [L, out, in] ([V]);
- RMSNorm per lane over D, statistics in fp32, cast to the activation dtype, then × gain
  (shared [D] or per-lane [L, D]);
- RoPE on adjacent pairs (2k, 2k+1) in fp32, position = absolute token index; optional
  Llama-3.1 frequency scaling (ambiguity A2, see config.py);
- attention per lane on its Hq/L query heads and Hkv/L KV heads; global head = l·Hq/L + j,
  GQA maps global q head h to KV head h // (Hq/Hkv) (always in the same lane since L | Hkv);
  softmax in fp32; SWA layers additionally require q_pos − k_pos < W;
- reduce modes per sub-block (§4): NO_REDUCE x += √L·p_l; PRESENT x += Σ_j p_j;
  PAST x += p_l + (Σ_j P_j − P_l) with P the raw partials of the same sub-block, layer i − δ;
  the queue stores raw partials; A1 (early_queue) decides whether layers < δ are queued;
- final aggregation (§5): pre_norm_lane_agg Norm(Σ_l x_l); replicate mean_l Norm_l(x_l);
  lane W[V, L·D]·concat_l Norm_l(x_l); vocab_parallel logits[l·V/L + r] = W[l, r]·Norm_l(x_l).

KV cache (LaneKVCache, batch 1): per layer k and v of shape [L, Hkv/L, T, hd], rotated keys;
SWA layers keep only their last W positions (the window includes the current token), full layers
keep every key. Partials are per token, so nothing but K/V crosses decode steps.
"""

from __future__ import annotations

import math
from typing import Mapping

import torch

from .config import LaneConfig, ReduceMode, rope_frequencies


def norm_key(cfg: LaneConfig, prefix: str, final: bool = False) -> str:
    """State-dict key of an RMSNorm gain: `.weight` [D] when shared, `.scale` [L, D] per lane."""
    shared = cfg.final_norm_shared if final else cfg.replicated_rmsn_scale
    return f"{prefix}.weight" if shared else f"{prefix}.scale"


def head_key(cfg: LaneConfig) -> str:
    return "lm_head.linear.weight" if cfg.lm_head_type == "lane" else "lm_head.weight"


class LaneKVCache:
    """Batch-1 KV cache: per layer, per lane, k/v [L, Hkv/L, T, hd]; SWA layers hold <= W positions."""

    def __init__(self, cfg: LaneConfig, dtype: torch.dtype = torch.float32, device="cpu"):
        self.cfg = cfg
        shape = (cfg.num_lanes, cfg.kv_heads_per_lane, 0, cfg.head_dim)
        self.k = [torch.empty(shape, dtype=dtype, device=device) for _ in range(cfg.num_layers)]
        self.v = [torch.empty(shape, dtype=dtype, device=device) for _ in range(cfg.num_layers)]
        self.length = 0   # tokens seen so far = position of the next token

    def start(self, layer: int) -> int:
        """Absolute position of the first key stored for `layer`."""
        return self.length - self.k[layer].shape[2]

    def extend(self, layer: int, k_new: torch.Tensor, v_new: torch.Tensor):
        """k_new/v_new [L, Hkv/L, S, hd]. Returns (k, v, start) covering old + new keys for this
        step's attention and stores the (possibly window-trimmed) result."""
        start = self.start(layer)
        k = torch.cat([self.k[layer], k_new], dim=2)
        v = torch.cat([self.v[layer], v_new], dim=2)
        keep = k.shape[2]
        if self.cfg.is_swa(layer):
            # the next query (pos p+1) needs keys > p+1-W: the last W-1 suffice; keep W for clarity
            keep = min(keep, self.cfg.sliding_window)
        self.k[layer] = k[:, :, k.shape[2] - keep:].contiguous()
        self.v[layer] = v[:, :, v.shape[2] - keep:].contiguous()
        return k, v, start


class LaneModel:
    """Plain-torch lane reference. `weights` uses the published key layout (spec §2)."""

    def __init__(self, cfg: LaneConfig, weights: Mapping[str, torch.Tensor], dtype=None, compute_dtype=None):
        """dtype: the weights' dtype (default: the embedding's). compute_dtype: the activations' (residual
        streams, partials, K/V; default = dtype). A serving engine keeps bf16 weights for its kernel and computes
        its prefill in fp32 (engine/lanes/serving.py), as engine.model.Model keeps an fp32 residual stream; weights
        are then cast per use, one matrix at a time."""
        self.cfg = cfg
        emb = weights["model.tok_embeddings.weight"]
        self.weight_dtype = dtype or emb.dtype
        self.dtype = compute_dtype or self.weight_dtype
        self.device = emb.device
        self.w = {k: v.to(self.weight_dtype) for k, v in weights.items()}
        self.freqs = rope_frequencies(cfg).to(self.device)          # fp32 [hd/2]

    def new_cache(self) -> LaneKVCache:
        return LaneKVCache(self.cfg, dtype=self.dtype, device=self.device)

    # ---- building blocks ---------------------------------------------------------------------
    def _norm(self, x: torch.Tensor, gain: torch.Tensor) -> torch.Tensor:
        """x [..., L, D] (or [..., D]); gain [D] or [L, D]."""
        x32 = x.float()
        y = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.cfg.norm_eps)
        return y.to(self.dtype) * gain

    def _rope(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """x [B, S, L, H, hd]; pos [S] absolute positions. Adjacent pairs (2k, 2k+1) rotated in fp32."""
        ang = pos.to(torch.float32)[:, None] * self.freqs[None, :]          # [S, hd/2]
        cos = ang.cos()[None, :, None, None, :]
        sin = ang.sin()[None, :, None, None, :]
        xp = x.float().unflatten(-1, (-1, 2))
        re, im = xp[..., 0], xp[..., 1]
        out = torch.stack([re * cos - im * sin, re * sin + im * cos], dim=-1)
        return out.flatten(-2).to(x.dtype)

    @staticmethod
    def _lane_linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """x [B, S, L, in], w [L, out, in] -> [B, S, L, out]."""
        return torch.einsum("bsli,loi->bslo", x, w.to(x.dtype))

    def _attention(self, i: int, a: torch.Tensor, pos: torch.Tensor, cache: LaneKVCache | None):
        """a [B, S, L, D] normed input; pos [S]. Returns the lane partials [B, S, L, D]."""
        cfg, w = self.cfg, self.w
        B, S, L, _ = a.shape
        hd, hl, kl = cfg.head_dim, cfg.heads_per_lane, cfg.kv_heads_per_lane
        pre = f"model.layers.{i}.attention."
        q = self._lane_linear(a, w[pre + "wq.weight"]).unflatten(-1, (hl, hd))
        k = self._lane_linear(a, w[pre + "wk.weight"]).unflatten(-1, (kl, hd))
        v = self._lane_linear(a, w[pre + "wv.weight"]).unflatten(-1, (kl, hd))
        q, k = self._rope(q, pos), self._rope(k, pos)
        if cache is not None:
            if B != 1:
                raise ValueError(f"LaneKVCache holds one sequence; got batch {B}")
            k_all, v_all, start = cache.extend(i, k[0].permute(1, 2, 0, 3), v[0].permute(1, 2, 0, 3))
            k_all, v_all = k_all[None], v_all[None]                  # [1, L, kl, T, hd]
        else:
            k_all, v_all, start = k.permute(0, 2, 3, 1, 4), v.permute(0, 2, 3, 1, 4), int(pos[0])
        T = k_all.shape[3]
        # lane-major flattening of (lane, local head) is exactly the global head index
        qg = q.permute(0, 2, 3, 1, 4).reshape(B, cfg.num_heads, S, hd)
        rep = cfg.num_heads // cfg.num_kv_heads
        kg = k_all.reshape(B, cfg.num_kv_heads, T, hd).repeat_interleave(rep, dim=1)
        vg = v_all.reshape(B, cfg.num_kv_heads, T, hd).repeat_interleave(rep, dim=1)
        kpos = torch.arange(start, start + T, device=pos.device)
        allowed = kpos[None, :] <= pos[:, None]
        if cfg.is_swa(i):
            allowed &= (pos[:, None] - kpos[None, :]) < cfg.sliding_window
        scores = (qg @ kg.transpose(-1, -2)) * (hd ** -0.5)
        probs = scores.float().masked_fill(~allowed, float("-inf")).softmax(-1).to(self.dtype)
        out = (probs @ vg).reshape(B, L, hl, S, hd).permute(0, 3, 1, 2, 4).reshape(B, S, L, hl * hd)
        return self._lane_linear(out, w[pre + "wo.weight"])

    def _mlp(self, i: int, a: torch.Tensor) -> torch.Tensor:
        """a [B, S, L, D] -> lane partials [B, S, L, D] (SwiGLU: w2 · (silu(w1 a) ⊙ w3 a))."""
        pre = f"model.layers.{i}.feed_forward."
        g = self._lane_linear(a, self.w[pre + "w1.weight"])
        u = self._lane_linear(a, self.w[pre + "w3.weight"])
        return self._lane_linear(torch.nn.functional.silu(g) * u, self.w[pre + "w2.weight"])

    def _reduce(self, mode: ReduceMode, p: torch.Tensor, past: torch.Tensor | None) -> torch.Tensor:
        """p, past [B, S, L, D] raw partials (past = layer i−δ). Returns the residual update."""
        if mode is ReduceMode.NO_REDUCE:
            return p * math.sqrt(self.cfg.num_lanes)
        if mode is ReduceMode.PRESENT:
            return p.sum(dim=-2, keepdim=True).expand_as(p)
        if past is None:
            if self.cfg.early_queue:
                raise RuntimeError("PAST layer found no queued partials (queue indexing bug)")
            # A1 "not queued": the source layer < δ was never queued; own partial only, scale 1
            return p
        return p + (past.sum(dim=-2, keepdim=True) - past)

    # ---- whole model -------------------------------------------------------------------------
    @torch.inference_mode()
    def forward(self, ids, cache: LaneKVCache | None = None, *, collect: list | None = None,
                return_hidden: bool = False):
        """ids [B, S] or [S] token ids. With a cache, positions continue at cache.length.
        Returns fp32 logits [B, S, V] (or [S, V] for 1-D ids); with return_hidden also the final
        per-lane residuals [B, S, L, D]. `collect`, if a list, receives x [B, S, L, D] after every
        layer (per-layer, per-lane residuals for engine comparisons)."""
        cfg, w = self.cfg, self.w
        ids = torch.as_tensor(ids, device=self.device)
        squeeze = ids.dim() == 1
        if squeeze:
            ids = ids[None]
        B, S = ids.shape
        L, N, delay = cfg.num_lanes, cfg.num_layers, cfg.broadcast_delay
        past_len = cache.length if cache is not None else 0
        pos = torch.arange(past_len, past_len + S, device=self.device)
        e = w["model.tok_embeddings.weight"][ids].to(self.dtype)             # [B, S, D]
        x = e[:, :, None, :].expand(B, S, L, cfg.hidden_size).contiguous()
        queue_attn: list[torch.Tensor | None] = []
        queue_mlp: list[torch.Tensor | None] = []
        for i in range(N):
            mode_a, mode_m = cfg.layer_modes(i)
            past_a = queue_attn[i - delay] if i >= delay else None
            past_m = queue_mlp[i - delay] if i >= delay else None
            pre = f"model.layers.{i}."
            p_a = self._attention(i, self._norm(x, w[norm_key(cfg, pre + "attention_norm")]), pos, cache)
            x = x + self._reduce(mode_a, p_a, past_a)
            p_m = self._mlp(i, self._norm(x, w[norm_key(cfg, pre + "ffn_norm")]))
            x = x + self._reduce(mode_m, p_m, past_m)
            queued = cfg.is_queued(i)   # False for the last δ layers (never read) and, with A1
            queue_attn.append(p_a if queued else None)   # "not queued", for layers < δ
            queue_mlp.append(p_m if queued else None)
            if collect is not None:
                collect.append(x.clone())
        if cache is not None:
            cache.length += S
        logits = self.head(x).float()
        if squeeze:
            logits, x = logits[0], x[0]
        return (logits, x) if return_hidden else logits

    __call__ = forward

    def head(self, x: torch.Tensor) -> torch.Tensor:
        """x [B, S, L, D] final lane residuals -> logits [B, S, V] in the activation dtype."""
        cfg, w = self.cfg, self.w
        g = w[norm_key(cfg, "model.norm", final=True)]
        if cfg.pre_norm_lane_agg:
            return self._norm(x.sum(dim=-2), g) @ self._replicate_head().T.to(self.dtype)
        n = self._norm(x, g)                                                 # [B, S, L, D]
        if cfg.lm_head_type == "replicate":
            return n.mean(dim=-2) @ self._replicate_head().T.to(self.dtype)
        if cfg.lm_head_type == "lane":
            return n.flatten(-2) @ w["lm_head.linear.weight"].T.to(self.dtype)
        # vocab_parallel: lane l computes its own V/L slice from its own stream
        return torch.einsum("bsld,lvd->bslv", n, w["lm_head.weight"].to(self.dtype)).flatten(-2)

    def _replicate_head(self) -> torch.Tensor:
        if "lm_head.weight" in self.w:
            return self.w["lm_head.weight"]
        if self.cfg.tie_word_embeddings:
            return self.w["model.tok_embeddings.weight"]
        raise KeyError("lm_head.weight missing and tie_word_embeddings is false")
