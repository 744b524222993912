"""CUDA-graph backend: the single-token decode step captured once per (slot, context bucket) and replayed.

Static inputs: token and position live in fixed device tensors; the slot is fixed per graph (one graph per slot
reads that slot's KV in place instead of gathering a copy). Attention runs over a fixed-length window of the
slot's KV (the bucket: the smallest power of two >= pos+1, at least MIN_BUCKET, at most max_len) with a position
mask, so the graph's shapes never change while the step count grows. Prefill runs eagerly through the reference
model. `decode_step` is plain torch: CPU tests run it eagerly to check the mask and position logic.
"""
from __future__ import annotations

import logging

import torch
import torch.nn.functional as F

from ..model import Model, apply_rope, rms_norm
from .base import Backend, BackendUnavailable

log = logging.getLogger("engine")

MIN_BUCKET = 128


def bucket_for(pos: int, max_len: int) -> int:
    b = MIN_BUCKET
    while b < pos + 1:
        b *= 2
    return min(b, max_len)


def masked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """q: [nh, 1, hd]; k, v: [nkv, W, hd] (a fixed window); valid: bool [W] -> [1, nh*hd].

    Positions past the current one may hold anything, NaN included (a poisoned or stale cache): scores there
    become -inf and V there is zeroed, so 0 * NaN never reaches the output.
    """
    nh, _, hd = q.shape
    nkv, W, _ = k.shape
    g = nh // nkv
    s = torch.matmul(q.reshape(nkv, g, hd), k.transpose(1, 2)) * (hd ** -0.5)    # [nkv, g, W]
    s = torch.where(valid, s, float("-inf"))
    p = torch.softmax(s.float(), dim=-1).to(q.dtype)
    v = torch.where(valid[:, None], v, 0.0)
    return torch.matmul(p, v).reshape(1, nh * hd)


@torch.inference_mode()
def decode_step(model: Model, k_cache: torch.Tensor, v_cache: torch.Tensor, slot: int, window: int,
                token: torch.Tensor, pos: torch.Tensor, arange: torch.Tensor) -> torch.Tensor:
    """One token, static shapes. token, pos: LongTensor [1] (device); arange: LongTensor [>= window] (0, 1, ...).

    Writes K/V at `pos` of `slot` and returns fp32 logits [V]. Requires pos < window <= max_len.
    """
    cfg = model.cfg
    nh, nkv, hd, qd, kvd = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.q_dim, cfg.kv_dim
    eps = cfg.rms_norm_eps
    cos = model.cos.index_select(0, pos)    # [1, hd]
    sin = model.sin.index_select(0, pos)
    valid = arange[:window] <= pos          # [window]
    x = F.embedding(token, model.embed).float()     # [1, d] fp32 residual (as in Model.forward)
    for li, w in enumerate(model.layers):
        h = rms_norm(x, w.ln1, eps)
        qkv = F.linear(h, w.wqkv, w.bqkv)
        qk = apply_rope(qkv[:, :qd + kvd].view(1, nh + nkv, hd).transpose(0, 1), cos, sin)   # [nh+nkv, 1, hd]
        kc = k_cache[slot, li, :, :window]  # [nkv, window, hd] view into the cache
        vc = v_cache[slot, li, :, :window]
        kc.index_copy_(1, pos, qk[nh:])
        vc.index_copy_(1, pos, qkv[:, qd + kvd:].view(1, nkv, hd).transpose(0, 1))
        o = masked_attention(qk[:nh], kc, vc, valid)
        x = x + F.linear(o, w.wo, w.bo)
        h = rms_norm(x, w.ln2, eps)
        g, u = F.linear(h, w.wgu, w.bgu).chunk(2, dim=-1)
        x = x + F.linear(F.silu(g) * u, w.wd, w.bd)
    x = rms_norm(x, model.norm, eps)
    return F.linear(x, model.lm_head).float()[0]


class GraphBackend(Backend):
    name = "graph"

    def __init__(self, model: Model, cache, tp: int = 1, tp_mode: str = "exact"):
        super().__init__(model, cache, tp, tp_mode)
        if model.device.type != "cuda":
            raise BackendUnavailable(f"graph needs CUDA (device is {model.device.type})")
        dev = model.device
        self.token = torch.zeros(1, dtype=torch.long, device=dev)
        self.pos = torch.zeros(1, dtype=torch.long, device=dev)
        self.arange = torch.arange(model.max_len, device=dev)
        self.pool = torch.cuda.graph_pool_handle()   # graphs never run concurrently: one memory pool for all
        self.graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.replays = 0
        self.eager_steps = 0
        self.capture_error: str | None = None

    def warmup(self) -> None:
        """Capture every (slot, window) graph now: a capture failure then falls back at load time, and no
        request pays a capture's latency later. Each capture writes K/V at position 0 of its slot, which holds
        nothing yet (warmup runs before the first request)."""
        if any(s.ids for s in self.cache.slots):
            return
        windows = sorted({bucket_for(p, self.model.max_len) for p in range(0, self.model.max_len, MIN_BUCKET)})
        self.token.fill_(0)
        self.pos.fill_(0)
        for slot in range(self.cache.n_slots):
            for w in windows:
                self.graphs[(slot, w)] = self._capture(slot, w)
        torch.cuda.synchronize(self.model.device)
        log.info("graph backend: captured %d decode graphs (%d slots x windows %s)", len(self.graphs),
                 self.cache.n_slots, windows)

    def _capture(self, slot: int, window: int):
        m, c = self.model, self.cache
        args = (m, c.k, c.v, slot, window, self.token, self.pos, self.arange)
        side = torch.cuda.Stream(device=m.device)
        side.wait_stream(torch.cuda.current_stream(m.device))
        with torch.cuda.stream(side):
            decode_step(*args)   # warm-up allocations and kernel selection; rewrites the same KV position
        torch.cuda.current_stream(m.device).wait_stream(side)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self.pool):
            out = decode_step(*args)
        return g, out

    def prefill(self, slot, ids, start_pos, all_logits=False):
        return self.model.forward(self.cache.k, self.cache.v, slot, ids, start_pos, all_logits)

    def decode(self, slot, token, pos):
        """Returns the graph's static logits buffer (valid until the next decode call)."""
        window = bucket_for(pos, self.model.max_len)
        self.token.fill_(token)
        self.pos.fill_(pos)
        entry = self.graphs.get((slot, window))
        if entry is None and self.capture_error is None:
            try:
                entry = self.graphs[(slot, window)] = self._capture(slot, window)
            except Exception as e:  # keep serving: the same step eagerly is slower but correct
                self.capture_error = f"{type(e).__name__}: {e}"
                log.warning("graph capture failed (slot %d, window %d); decoding eagerly from now on: %s",
                            slot, window, self.capture_error)
        if entry is None:
            self.eager_steps += 1
            return decode_step(self.model, self.cache.k, self.cache.v, slot, window, self.token, self.pos,
                               self.arange)
        entry[0].replay()
        self.replays += 1
        return entry[1]

    def stats(self) -> dict:
        return {"graphs": len(self.graphs), "replays": self.replays, "eager_steps": self.eager_steps,
                "capture_error": self.capture_error}
