"""A Laneformer lane checkpoint as an engine model (tp_mode='delayed').

The engine holds a model with `cfg` (a ModelConfig shape), `device`, `dtype`, `max_len`, `n_params()` and
`forward(k_cache, v_cache, slot, ids, start, all_logits)` writing K/V into its KVCache. `LaneServingModel` gives a
LaneModel (engine/lanes/model.py, the truth) that interface:

- the engine's KVCache [slots, layers, all lanes' KV heads, max_len, hd] holds the lanes' heads lane-major, keys in
  the delayed kernel's half-rotation layout: exactly what TPMonokernel(mode="delayed").load_cache reads, so the
  tensor-parallel backend's KVMirror copies rank r's heads (kernels/tp_local.py lane_kv_bounds: the one sharding
  rule) and gives the decoded positions back unchanged;
- `forward` (the prefill, also the tp=1 reference backend's decode) rebuilds a LaneKVCache of positions [0, start)
  from that cache, runs LaneModel.forward on the chunk and writes the chunk's new K/V back at [start, start + T).

LaneModel's ids are positions past its cache, so any prefix the engine's prefix cache kept is read from the
KVCache, never recomputed. Sliding-window layers: the rebuilt cache holds every position and LaneModel masks
(and trims) by the window itself, so the result equals an uncached run.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..config import ModelConfig
from .config import LaneConfig
from .loader import load_lane_checkpoint
from .model import LaneKVCache, LaneModel

log = logging.getLogger("engine")


@dataclass
class LaneServingConfig(ModelConfig):
    """The engine-facing shape of a lane model: n_heads / n_kv_heads / intermediate_size count every lane (the
    KVCache holds all lanes' KV heads); `lanes` is the LaneConfig the lane code reads."""
    lanes: Any = None


def _ids(v) -> tuple[int, ...]:
    if v is None:
        return ()
    return tuple(int(x) for x in v) if isinstance(v, (list, tuple)) else (int(v),)


def serving_config(cfg: LaneConfig, name: str = "") -> LaneServingConfig:
    bos = _ids(cfg.bos_token_id)
    return LaneServingConfig(
        arch="laneformer", vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, n_layers=cfg.num_layers,
        n_heads=cfg.num_heads, n_kv_heads=cfg.num_kv_heads, intermediate_size=cfg.intermediate_size,
        head_dim=cfg.head_dim, rms_norm_eps=cfg.norm_eps, rope_theta=cfg.rope_theta,
        max_position_embeddings=cfg.max_position_embeddings, tie_word_embeddings=cfg.tie_word_embeddings,
        bos_token_id=bos[0] if bos else None, eos_token_ids=_ids(cfg.eos_token_id),
        name=name or f"laneformer {cfg.num_lanes} lanes", lanes=cfg)


class _ChunkCache(LaneKVCache):
    """A LaneKVCache that also keeps each layer's new (rotated) keys and values of the current chunk: a
    sliding-window layer trims its stored keys, the chunk's own are what go back into the engine's cache."""

    def __init__(self, cfg, dtype, device):
        super().__init__(cfg, dtype=dtype, device=device)
        self.new_k: list[torch.Tensor | None] = [None] * cfg.num_layers
        self.new_v: list[torch.Tensor | None] = [None] * cfg.num_layers

    def extend(self, layer, k_new, v_new):
        self.new_k[layer], self.new_v[layer] = k_new, v_new
        return super().extend(layer, k_new, v_new)


class LaneServingModel:
    """engine.model.Model's interface around a LaneModel (see the module docstring)."""

    checkpoint_kind = "lane"    # engine/backends/tp_monokernel.py kernel_mode_kwargs and select_backend read it

    def __init__(self, lane: LaneModel, max_len: int = 4096, name: str = ""):
        self.lane = lane
        self.lane_config: LaneConfig = lane.cfg
        self.cfg = serving_config(lane.cfg, name)
        # dtype: the weights' and the KV cache's (bf16 on a GPU: what the kernel streams and reads); the lane model
        # may compute in a wider dtype (load_lane_serving: fp32 activations)
        self.device, self.dtype = torch.device(lane.device), lane.weight_dtype
        self.max_len = max_len

    def n_params(self) -> int:
        return sum(t.numel() for t in self.lane.w.values())

    # ---- the engine's KVCache <-> the lane model's cache ----
    def lane_cache_of(self, k_cache: torch.Tensor, v_cache: torch.Tensor, slot: int, length: int) -> _ChunkCache:
        """Positions [0, length) of `slot` as a LaneKVCache (keys back in the lane model's adjacent-pair order)."""
        from kernels.tp_local import lane_keys_from_kernel
        cfg = self.lane_config
        L, kl, hd = cfg.num_lanes, cfg.kv_heads_per_lane, cfg.head_dim
        act = self.lane.dtype
        c = _ChunkCache(cfg, act, self.device)
        for i in range(cfg.num_layers):
            k = k_cache[slot, i, :, :length].reshape(L, kl, length, hd)
            c.k[i] = lane_keys_from_kernel(k).to(act)
            c.v[i] = v_cache[slot, i, :, :length].reshape(L, kl, length, hd).to(act)
        c.length = length
        return c

    def write_chunk(self, c: _ChunkCache, k_cache: torch.Tensor, v_cache: torch.Tensor, slot: int,
                    start: int) -> None:
        """The chunk's new K/V (lanes' heads lane-major, keys in the kernel layout) into positions start.."""
        from kernels.tp_local import lane_keys_to_kernel
        cfg = self.lane_config
        for i in range(cfg.num_layers):
            k, v = c.new_k[i], c.new_v[i]                 # [L, kl, T, hd]
            T = k.shape[2]
            k_cache[slot, i, :, start:start + T] = lane_keys_to_kernel(k).flatten(0, 1).to(k_cache.dtype)
            v_cache[slot, i, :, start:start + T] = v.flatten(0, 1).to(v_cache.dtype)

    @torch.inference_mode()
    def forward(self, k_cache: torch.Tensor, v_cache: torch.Tensor, slot: int, ids: torch.Tensor, start: int,
                all_logits: bool = False) -> torch.Tensor:
        """As engine.model.Model.forward: ids LongTensor [T] at positions start..start+T-1 of `slot`; writes their
        K/V and returns fp32 logits [T, V] (all_logits) or [V] (last position)."""
        T = int(ids.shape[0])
        if T == 0:
            raise ValueError("prefill of an empty chunk")
        if start + T > self.max_len:
            raise ValueError(f"sequence of {start + T} tokens exceeds max_seq_len {self.max_len}")
        c = self.lane_cache_of(k_cache, v_cache, slot, start)
        logits = self.lane.forward(ids.to(self.device), c)           # fp32 [T, V]
        self.write_chunk(c, k_cache, v_cache, slot, start)
        return logits if all_logits else logits[-1]


class LanePrefill:
    """The tensor-parallel backend's prefill object for a lane model (the role PrefillGraphs plays for an ordinary
    one): the lane reference forward, eager, on the first GPU. No CUDA graphs: LaneModel's per-call Python
    (cache rebuild, einsums) is not capturable as is; the count says how often this eager path ran."""

    def __init__(self, model: LaneServingModel, cache):
        self.model, self.cache = model, cache
        self.calls, self.tokens = 0, 0

    def warmup(self) -> None:
        """Nothing to capture (see the class docstring)."""

    def prefill(self, slot: int, ids: torch.Tensor, start_pos: int, all_logits: bool = False) -> torch.Tensor:
        self.calls += 1
        self.tokens += int(ids.shape[0])
        return self.model.forward(self.cache.k, self.cache.v, slot, ids, start_pos, all_logits)

    def stats(self) -> dict:
        return {"prefill_lane_eager": self.calls, "prefill_lane_tokens": self.tokens}


def is_lane_model(model) -> bool:
    return getattr(model, "checkpoint_kind", "dense") == "lane"


def load_lane_serving(path: str | Path, device="cpu", dtype=torch.float32, max_len: int = 4096,
                      name: str = "") -> LaneServingModel:
    """A lane checkpoint directory (engine/lanes/loader.py) as an engine model on `device`, weights and KV cache in
    `dtype`. The lane model computes in fp32 whatever `dtype` (fp32 residual streams and K/V before they are
    stored, as engine.model.Model does): a bf16-activation prefill was measured at rel L2 ~9e-3 of the logits
    against fp32 on a random 4-layer model, most of the kernel test's 1e-2 budget."""
    loaded = load_lane_checkpoint(path, dtype=dtype, device=device)
    lane = LaneModel(loaded.cfg, loaded.w, dtype=dtype, compute_dtype=torch.float32)   # the same weight tensors
    m = LaneServingModel(lane, max_len=max_len, name=name or str(path))
    log.info("loaded lane checkpoint %s: %d params, %d lanes, %s on %s", path, m.n_params(),
             m.lane_config.num_lanes, dtype, device)
    return m
