"""Laneformer (delayed tensor parallelism) configuration: the config.json keys of
/work/shared/DTP-laneformer.md §1, validated, plus the switches for the spec's open ambiguities.

Ambiguity switches (spec §6) and the defaults chosen here:
- A1 ``early_queue`` (default True = [V], the verified HF remote code): partials of layers < δ are
  queued like every other layer and folded in (minus own) at layer i+δ, so with use_early_comm they
  are counted twice. False = the "not queued" reading: a PAST layer whose source layer i−δ < δ has
  nothing queued and adds only its own partial (scale 1).
- A2 ``rope_scaling``: Llama-3.1-style frequency scaling is applied only when config.json carries a
  scaling dict (``rope_scaling`` or ``rope_scaling_args``); ``rope_scaling=None`` in overrides turns it off.
- A4 ``use_early_comm``: read from config.json (class default True when absent); any override wins.
- A5 SWA layers: ``swa_layers`` if present, else ``sliding_window_n_layers`` (n>0 first n layers,
  n<0 last |n| layers), else none; ``unclamped_layers`` always forces full attention.
- ``use_attention_comm`` / ``use_mlp_comm`` (released revision) default to ``use_comm``.

Architecture dimensions (hidden_size, num_hidden_layers, num_attention_heads, intermediate_size,
vocab_size, num_lanes) are required: a missing one is an error rather than a silent class default
(4096 wide, 32 layers ...), which would only surface later as a confusing shape mismatch.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from enum import Enum
from pathlib import Path
from typing import Any, Mapping

LANE_MODEL_TYPES = ("laneformer_tp", "laneformer")
HEAD_TYPES = ("replicate", "lane", "vocab_parallel")
REQUIRED_KEYS = ("hidden_size", "num_hidden_layers", "num_attention_heads",
                 "intermediate_size", "vocab_size", "num_lanes")


class LaneConfigError(ValueError):
    """config.json of a lane checkpoint is missing a key, has a bad value, or violates divisibility."""


class ReduceMode(Enum):
    NO_REDUCE = "no_reduce"   # x_l += sqrt(L) * p_l
    PRESENT = "present"       # x_l += sum_j p_j
    PAST = "past"             # x_l += p_l + (sum_j P_j - P_l), P = partials of layer i - delta


@dataclass(frozen=True)
class LaneConfig:
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    num_lanes: int
    broadcast_delay: int = 1
    use_comm: bool = True
    use_early_comm: bool = True
    use_attention_comm: bool = True
    use_mlp_comm: bool = True
    lm_head_type: str = "replicate"
    pre_norm_lane_agg: bool = False
    replicated_rmsn_scale: bool = True
    tie_word_embeddings: bool = False
    sliding_window: int | None = None
    swa_layers: tuple[int, ...] = ()
    rope_theta: float = 10000.0
    rope_scaling: Mapping[str, float] | None = None
    norm_eps: float = 1e-5
    max_position_embeddings: int = 131072
    eos_token_id: Any = None
    bos_token_id: Any = None
    pad_token_id: Any = None
    early_queue: bool = True          # ambiguity A1, see module docstring
    raw: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    # ---- derived sizes -------------------------------------------------------------------
    @property
    def q_dim(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def heads_per_lane(self) -> int:
        return self.num_heads // self.num_lanes

    @property
    def kv_heads_per_lane(self) -> int:
        return self.num_kv_heads // self.num_lanes

    @property
    def ffn_per_lane(self) -> int:
        return self.intermediate_size // self.num_lanes

    @property
    def final_norm_shared(self) -> bool:
        # [V]: the final norm is a plain [D] RMSNorm when gains are replicated OR lanes are summed first.
        return self.replicated_rmsn_scale or self.pre_norm_lane_agg

    def is_swa(self, layer: int) -> bool:
        return self.sliding_window is not None and layer in self.swa_layers

    def layer_modes(self, layer: int) -> tuple[ReduceMode, ReduceMode]:
        """(attention mode, MLP mode) of decoder layer `layer` (spec §4)."""
        if layer < self.broadcast_delay:
            m = ReduceMode.PRESENT if self.use_early_comm else ReduceMode.NO_REDUCE
            return m, m
        attn = ReduceMode.PAST if (self.use_comm and self.use_attention_comm) else ReduceMode.NO_REDUCE
        mlp = ReduceMode.PAST if (self.use_comm and self.use_mlp_comm) else ReduceMode.NO_REDUCE
        return attn, mlp

    def is_queued(self, layer: int) -> bool:
        """Whether the raw partials of `layer` are kept for layer + delta (A1 switch)."""
        if layer + self.broadcast_delay >= self.num_layers:
            return False
        return self.early_queue or layer >= self.broadcast_delay

    def with_overrides(self, **kw) -> "LaneConfig":
        out = replace(self, **kw)
        out.validate()
        return out

    # ---- construction ----------------------------------------------------------------------
    @classmethod
    def from_dict(cls, d: Mapping[str, Any], **overrides) -> "LaneConfig":
        mt = d.get("model_type")
        if mt is not None and mt not in LANE_MODEL_TYPES:
            raise LaneConfigError(
                f"config.json model_type is {mt!r}, not a Laneformer lane checkpoint "
                f"(expected one of {LANE_MODEL_TYPES}); ordinary checkpoints run in tp_mode='exact'")
        missing = [k for k in REQUIRED_KEYS if d.get(k) is None]
        if missing:
            raise LaneConfigError(f"lane config.json lacks required key(s): {', '.join(missing)}")
        D = _int(d, "hidden_size")
        hq = _int(d, "num_attention_heads")
        hkv = d.get("num_key_value_heads")
        hkv = hq if hkv is None else _int(d, "num_key_value_heads")
        # [V] has no head_dim key (D // Hq); the released revision may add head_dim / rope_dim [T].
        hd = d.get("head_dim") or d.get("rope_dim")
        if hd is None:
            if D % hq:
                raise LaneConfigError(f"hidden_size {D} is not divisible by num_attention_heads {hq} "
                                      "and config.json has no head_dim")
            hd = D // hq
        use_comm = bool(d.get("use_comm", True))
        n_layers = _int(d, "num_hidden_layers")
        window = d.get("sliding_window")
        kw: dict[str, Any] = dict(
            vocab_size=_int(d, "vocab_size"), hidden_size=D, num_layers=n_layers,
            num_heads=hq, num_kv_heads=hkv, head_dim=int(hd),
            intermediate_size=_int(d, "intermediate_size"), num_lanes=_int(d, "num_lanes"),
            broadcast_delay=int(d.get("broadcast_delay", 1)),
            use_comm=use_comm, use_early_comm=bool(d.get("use_early_comm", True)),
            use_attention_comm=bool(d.get("use_attention_comm", True)),
            use_mlp_comm=bool(d.get("use_mlp_comm", True)),
            lm_head_type=d.get("lm_head_type", "replicate"),
            pre_norm_lane_agg=bool(d.get("pre_norm_lane_agg", False)),
            replicated_rmsn_scale=bool(d.get("replicated_rmsn_scale", True)),
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
            sliding_window=None if window is None else int(window),
            swa_layers=_swa_layers(d, n_layers),
            rope_theta=float(d.get("rope_theta", 10000.0)),
            rope_scaling=_rope_scaling(d),
            norm_eps=float(d.get("norm_eps", d.get("rms_norm_eps", 1e-5))),
            max_position_embeddings=int(d.get("max_position_embeddings", 131072)),
            eos_token_id=d.get("eos_token_id"), bos_token_id=d.get("bos_token_id"),
            pad_token_id=d.get("pad_token_id"), raw=dict(d),
        )
        unknown = set(overrides) - set(kw) - {"early_queue"}
        if unknown:
            raise LaneConfigError(f"unknown LaneConfig override(s): {sorted(unknown)}")
        kw.update(overrides)
        cfg = cls(**kw)
        cfg.validate()
        return cfg

    @classmethod
    def from_json(cls, path: str | Path, **overrides) -> "LaneConfig":
        p = Path(path)
        if p.is_dir():
            p = p / "config.json"
        if not p.is_file():
            raise LaneConfigError(f"no config.json at {p}")
        try:
            d = json.loads(p.read_text())
        except json.JSONDecodeError as e:
            raise LaneConfigError(f"{p} is not valid JSON: {e}") from e
        return cls.from_dict(d, **overrides)

    def validate(self) -> None:
        L = self.num_lanes
        for name in ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads",
                     "head_dim", "intermediate_size", "num_lanes"):
            if getattr(self, name) < 1:
                raise LaneConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.head_dim % 2:
            raise LaneConfigError(f"head_dim {self.head_dim} must be even for RoPE")
        if self.num_heads % self.num_kv_heads:
            raise LaneConfigError(f"num_attention_heads {self.num_heads} is not a multiple of "
                                  f"num_key_value_heads {self.num_kv_heads}")
        checks = [("num_attention_heads", self.num_heads), ("num_key_value_heads", self.num_kv_heads),
                  ("intermediate_size", self.intermediate_size)]
        if self.lm_head_type == "vocab_parallel":
            checks.append(("vocab_size (vocab_parallel head)", self.vocab_size))
        for name, v in checks:
            if v % L:
                raise LaneConfigError(f"num_lanes {L} does not divide {name} {v}: every lane needs "
                                      "an equal share of heads / FFN width / vocabulary")
        if self.lm_head_type not in HEAD_TYPES:
            raise LaneConfigError(f"lm_head_type {self.lm_head_type!r} is not one of {HEAD_TYPES}")
        if self.pre_norm_lane_agg and self.lm_head_type != "replicate":
            raise LaneConfigError("pre_norm_lane_agg is only defined with lm_head_type='replicate'")
        if self.tie_word_embeddings and self.lm_head_type != "replicate":
            raise LaneConfigError("tie_word_embeddings needs lm_head_type='replicate' ([V, D] head)")
        if self.broadcast_delay < 0:
            raise LaneConfigError(f"broadcast_delay must be >= 0, got {self.broadcast_delay}")
        if self.broadcast_delay == 0 and self.use_comm and self.num_layers > 0 and \
                (self.use_attention_comm or self.use_mlp_comm):
            raise LaneConfigError("broadcast_delay 0 with use_comm: PAST layers would read a layer "
                                  "that has not run; the delay must be >= 1")
        if self.sliding_window is not None and self.sliding_window < 1:
            raise LaneConfigError(f"sliding_window must be >= 1, got {self.sliding_window}")
        bad = [i for i in self.swa_layers if not 0 <= i < self.num_layers]
        if bad:
            raise LaneConfigError(f"swa_layers {bad} outside 0..{self.num_layers - 1}")


def _int(d: Mapping[str, Any], key: str) -> int:
    v = d[key]
    if isinstance(v, bool) or not isinstance(v, (int, float)) or int(v) != v:
        raise LaneConfigError(f"config.json key {key!r} must be an integer, got {v!r}")
    return int(v)


def _swa_layers(d: Mapping[str, Any], n_layers: int) -> tuple[int, ...]:
    unclamped = set(d.get("unclamped_layers") or [])
    if d.get("sliding_window") is None:
        return ()
    if d.get("swa_layers") is not None:
        layers = [int(i) for i in d["swa_layers"]]
    else:
        n = int(d.get("sliding_window_n_layers") or 0)
        layers = list(range(n)) if n > 0 else list(range(n_layers + n, n_layers)) if n < 0 else []
    return tuple(i for i in layers if i not in unclamped)


def _rope_scaling(d: Mapping[str, Any]) -> dict[str, float] | None:
    """TorchTitan/Llama-3.1 style scaling; the released key name is unknown (spec A2), so accept both."""
    s = d.get("rope_scaling") or d.get("rope_scaling_args")
    if not s:
        return None
    kind = s.get("rope_type", s.get("type", "llama3"))
    if kind not in ("llama3", "default"):
        raise LaneConfigError(f"rope scaling type {kind!r} is not supported (only llama3-style)")
    if kind == "default":
        return None
    try:
        return {
            "factor": float(s.get("factor", s.get("scaling_factor"))),
            "low_freq_factor": float(s.get("low_freq_factor", 1.0)),
            "high_freq_factor": float(s.get("high_freq_factor", 4.0)),
            "original_max_position_embeddings": float(s.get("original_max_position_embeddings", 8192)),
        }
    except TypeError as e:
        raise LaneConfigError(f"rope scaling entry {s!r} has no factor / scaling_factor") from e


def rope_frequencies(cfg: LaneConfig):
    """fp32 [hd/2] frequencies freq_k = theta^(-2k/hd), rescaled Llama-3.1-style if configured."""
    import torch
    from engine.model import llama3_scaled
    hd = cfg.head_dim
    freqs = 1.0 / (cfg.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
    s = cfg.rope_scaling
    if s is None:
        return freqs
    return llama3_scaled(freqs, s["factor"], s["low_freq_factor"], s["high_freq_factor"],
                         s["original_max_position_embeddings"])
