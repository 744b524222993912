"""CUDA-graph backend: the single-token decode step captured once per (slot, context bucket) and replayed.

Static inputs: token and position live in fixed device tensors; the slot is fixed per graph (one graph per slot
reads that slot's KV in place instead of gathering a copy). Attention runs over a fixed-length window of the
slot's KV (the bucket: the smallest power of two >= pos+1, at least MIN_BUCKET, at most max_len) with a position
mask, so the graph's shapes never change while the step count grows. Last-position prefill (the completion
path) replays graphs too (PrefillGraphs: one per slot, padded chunk length and window); all-logits scoring runs
the reference model eagerly. `static_step` (decode is its one-token case) is plain torch: CPU tests run it
eagerly to check the mask, padding and position logic against the reference.
"""
from __future__ import annotations

import logging
import time

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
    """q: [nh, T, hd]; k, v: [nkv, W, hd] (a fixed window); valid: bool [T, W] (query row i may read key j)
    -> [T, nh*hd].

    Positions a row may not read may hold anything, NaN included (a poisoned or stale cache, a padded chunk's
    tail): scores there become -inf, and V is zeroed where no row reads (valid[-1]: the last row reads the
    most), so 0 * NaN never reaches the output. Query head j*g + i reads kv head j (GQA): q viewed as
    [nkv, g*T, hd] lines up with the cache without expanding K/V.

    Launches (each ~3-10 us inside a prefill graph): the scale rides on the one contiguous copy of q the batched
    matmul needs anyway (the rope leaves q transposed), and the softmax reads the masked scores in q's dtype and
    writes that dtype, computing in fp32 inside (torch's accumulate type); scaling, upcasting and downcasting the
    [nkv, g*T, W] scores as three more launches cost ~0.3 ms per 1.5B prefill (bench/NOTES.md, session 35).
    """
    nh, T, hd = q.shape
    nkv, W, _ = k.shape
    g = nh // nkv
    qs = torch.mul(q, hd ** -0.5, out=torch.empty((nh, T, hd), dtype=q.dtype, device=q.device))
    s = torch.matmul(qs.view(nkv, g * T, hd), k.transpose(1, 2)).view(nkv, g, T, W)
    p = torch.softmax(torch.where(valid, s, float("-inf")), dim=-1)
    v = torch.where(valid[-1][:, None], v, 0.0)
    o = torch.matmul(p.view(nkv, g * T, W), v)                                     # [nkv, g*T, hd]
    return o.view(nh, T, hd).transpose(0, 1).reshape(T, nh * hd)


@torch.inference_mode()
def static_step(model: Model, k_cache: torch.Tensor, v_cache: torch.Tensor, slot: int, window: int,
                ids: torch.Tensor, start: torch.Tensor, last: torch.Tensor | None, arange: torch.Tensor) -> torch.Tensor:
    """The forward of a chunk with static shapes (what a CUDA graph captures): ids: LongTensor [T] at positions
    start..start+T-1; start: LongTensor [1] (device); last: LongTensor [1], the row whose logits are returned
    (None: row 0, T == 1); arange: LongTensor [>= window] (0, 1, ...).

    Writes K/V of all T rows into `slot` and returns fp32 logits [V] of row `last`. Requires
    start + T <= window <= max_len. Rows after `last` (a padded chunk's tail) are computed like the others:
    their K/V land at positions past the real chunk, which no real row reads (causal) and which the slot does
    not record as valid, so the next prefill or decode step overwrites them.
    """
    cfg = model.cfg
    nh, nkv, hd, qd, kvd = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.q_dim, cfg.kv_dim
    eps = cfg.rms_norm_eps
    T = ids.shape[0]
    pos = start + arange[:T] if T > 1 else start      # [T] absolute positions
    cos = model.cos.index_select(0, pos)              # [T, hd]
    sin = model.sin.index_select(0, pos)
    valid = arange[:window][None, :] <= pos[:, None]  # [T, window]: causal over the cached prefix and the chunk
    x = F.embedding(ids, model.embed).float()         # [T, d] fp32 residual (as in Model.forward)
    for li, w in enumerate(model.layers):
        h = rms_norm(x, w.ln1, eps)
        qkv = F.linear(h, w.wqkv, w.bqkv)
        qk = apply_rope(qkv[:, :qd + kvd].view(T, nh + nkv, hd).transpose(0, 1), cos, sin)   # [nh+nkv, T, hd]
        kc = k_cache[slot, li, :, :window]  # [nkv, window, hd] view into the cache
        vc = v_cache[slot, li, :, :window]
        kc.index_copy_(1, pos, qk[nh:])
        vc.index_copy_(1, pos, qkv[:, qd + kvd:].view(T, nkv, hd).transpose(0, 1))
        o = masked_attention(qk[:nh], kc, vc, valid)
        x = x + F.linear(o, w.wo, w.bo)
        h = rms_norm(x, w.ln2, eps)
        g, u = F.linear(h, w.wgu, w.bgu).chunk(2, dim=-1)
        x = x + F.linear(F.silu(g) * u, w.wd, w.bd)
    if last is not None:
        x = x.index_select(0, last)                   # [1, d]: only this row reaches the norm and the LM head
    x = rms_norm(x, model.norm, eps)
    return F.linear(x, model.lm_head).float()[0]


def decode_step(model: Model, k_cache: torch.Tensor, v_cache: torch.Tensor, slot: int, window: int,
                token: torch.Tensor, pos: torch.Tensor, arange: torch.Tensor) -> torch.Tensor:
    """One token, static shapes. token, pos: LongTensor [1] (device); arange: LongTensor [>= window] (0, 1, ...).

    Writes K/V at `pos` of `slot` and returns fp32 logits [V]. Requires pos < window <= max_len.
    """
    return static_step(model, k_cache, v_cache, slot, window, token, pos, None, arange)


def capture(fn, args: tuple, device: torch.device, pool) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
    """CUDA-graph `fn(*args)`: one eager run on a side stream first (allocations, kernel selection; it does the
    same writes the graph will), then the capture. Returns (graph, its static output)."""
    side = torch.cuda.Stream(device=device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        fn(*args)
    torch.cuda.current_stream(device).wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, pool=pool):
        out = fn(*args)
    return g, out


PREFILL_BUCKETS = (32, 64, 128, 256, 512)   # chunk lengths with a graph; a chunk is padded to the next one


def prefill_bucket(n: int) -> int | None:
    """Smallest bucket >= n, or None (longer than the largest: eager)."""
    return next((b for b in PREFILL_BUCKETS if b >= n), None)


class PrefillGraphs:
    """Last-position prefill (the completion path) replayed from CUDA graphs, one per (slot, chunk bucket,
    window): eager prefill of the 1.5B model costs ~20 ms of per-op launch overhead whatever the chunk length,
    a replay costs the GPU time. Backends own one and call `prefill` (it falls back to the reference forward
    for all-logits scoring, chunks longer than the largest bucket, and chunks too close to max_len to pad).

    The chunk is padded to its bucket; the pad rows' K/V land after the real chunk (see static_step) inside
    the slot and the window, never past start + bucket <= max_len. Off CUDA (`use_graphs` False: CPU tests,
    the CPU run of bench/prefill.py) the same static step runs eagerly, so the host logic is tested there too.
    Graphs are captured lazily on first use, or all at once by `warmup()` (at backend start, so no request
    pays a capture); a capture failure switches this object to eager for good and says why in stats().
    """

    def __init__(self, model: Model, cache, use_graphs: bool | None = None):
        self.model, self.cache = model, cache
        dev = model.device
        self.use_graphs = dev.type == "cuda" if use_graphs is None else use_graphs
        self.ids = torch.zeros(PREFILL_BUCKETS[-1], dtype=torch.long, device=dev)   # static inputs
        self.start = torch.zeros(1, dtype=torch.long, device=dev)
        self.last = torch.zeros(1, dtype=torch.long, device=dev)
        self.arange = torch.arange(model.max_len, device=dev)
        self.pool = torch.cuda.graph_pool_handle() if self.use_graphs else None
        self.graphs: dict[tuple[int, int, int], tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.counts = {"graph": 0, "static_eager": 0, "eager_all_logits": 0, "eager_too_long": 0,
                       "eager_near_max_len": 0, "eager_capture_failed": 0}
        self.capture_error: str | None = None
        self.capture_s = 0.0

    def shapes(self) -> list[tuple[int, int]]:
        """Every (bucket, window) a chunk can map to: windows are decode's (bucket_for), each >= the bucket."""
        L = self.model.max_len
        wins = sorted({bucket_for(p, L) for p in range(0, L, MIN_BUCKET)})
        return [(b, w) for w in wins for b in PREFILL_BUCKETS if b <= w]

    def warmup(self) -> None:
        """Capture every (slot, bucket, window) graph. Each capture writes K/V at positions 0..bucket-1 of its slot,
        which hold nothing yet (warmup runs before the first request; skipped once a slot holds tokens)."""
        if not self.use_graphs or any(s.ids for s in self.cache.slots):
            return
        t0 = time.perf_counter()
        self.ids.zero_()
        self.start.zero_()
        self.last.zero_()
        for slot in range(self.cache.n_slots):
            for b, w in self.shapes():
                if self._graph(slot, b, w) is None:
                    return
        torch.cuda.synchronize(self.model.device)
        self.capture_s = time.perf_counter() - t0
        log.info("prefill graphs: captured %d (%d slots x %d shapes, buckets %s) in %.1f s", len(self.graphs),
                 self.cache.n_slots, len(self.shapes()), PREFILL_BUCKETS, self.capture_s)

    def _args(self, slot: int, b: int, w: int) -> tuple:
        m, c = self.model, self.cache
        return (m, c.k, c.v, slot, w, self.ids[:b], self.start, self.last, self.arange)

    def _graph(self, slot: int, b: int, w: int):
        key = (slot, b, w)
        entry = self.graphs.get(key)
        if entry is None and self.capture_error is None:
            t0 = time.perf_counter()
            try:
                entry = self.graphs[key] = capture(static_step, self._args(slot, b, w), self.model.device, self.pool)
            except Exception as e:  # keep serving: the eager reference prefill is slower but correct
                self.capture_error = f"{type(e).__name__}: {e}"
                log.warning("prefill graph capture failed (slot %d, bucket %d, window %d); prefilling eagerly from "
                            "now on: %s", slot, b, w, self.capture_error)
            self.capture_s += time.perf_counter() - t0
        return entry

    def prefill(self, slot: int, ids: torch.Tensor, start_pos: int, all_logits: bool = False) -> torch.Tensor:
        """Backend.prefill: ids LongTensor [T] on the model device at positions start_pos.. -> fp32 [V] (or
        [T, V] with all_logits, from the reference forward); writes the chunk's K/V."""
        m = self.model
        n = ids.shape[0]
        if n == 0:
            raise ValueError("prefill of an empty chunk")
        b = prefill_bucket(n)
        why = ("eager_all_logits" if all_logits else "eager_too_long" if b is None
               else "eager_near_max_len" if start_pos + b > m.max_len
               else "eager_capture_failed" if self.use_graphs and self.capture_error is not None else None)
        if why is not None:
            self.counts[why] += 1
            return m.forward(self.cache.k, self.cache.v, slot, ids, start_pos, all_logits)
        w = bucket_for(start_pos + b - 1, m.max_len)
        self.ids[:n].copy_(ids)
        if n < b:
            self.ids[n:b].zero_()   # pad ids: any valid id would do, zeros keep replays reproducible
        self.start.fill_(start_pos)
        self.last.fill_(n - 1)
        if not self.use_graphs:
            self.counts["static_eager"] += 1
            return static_step(*self._args(slot, b, w))
        entry = self._graph(slot, b, w)
        if entry is None:
            self.counts["eager_capture_failed"] += 1
            return m.forward(self.cache.k, self.cache.v, slot, ids, start_pos, all_logits)
        entry[0].replay()
        self.counts["graph"] += 1
        return entry[1].clone()   # the caller owns its logits; the static buffer is rewritten by the next replay

    def stats(self) -> dict:
        return {"prefill_graphs": len(self.graphs), "prefill_capture_s": round(self.capture_s, 2),
                "prefill_capture_error": self.capture_error, **{f"prefill_{k}": v for k, v in self.counts.items()}}


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
        self.prefill_graphs = PrefillGraphs(model, cache)

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
        self.prefill_graphs.warmup()

    def _capture(self, slot: int, window: int):
        m, c = self.model, self.cache
        # The warm-up run inside capture() rewrites the same KV position the graph writes.
        return capture(decode_step, (m, c.k, c.v, slot, window, self.token, self.pos, self.arange), m.device,
                       self.pool)

    def prefill(self, slot, ids, start_pos, all_logits=False):
        return self.prefill_graphs.prefill(slot, ids, start_pos, all_logits)

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
                "capture_error": self.capture_error, **self.prefill_graphs.stats()}
