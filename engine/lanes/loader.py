"""Loader for the published Laneformer checkpoint layout (spec §2): config.json (model_type
"laneformer_tp") + model.safetensors or a sharded model-*.safetensors with model.safetensors.index.json.

Every expected key is checked against the shape config.json implies; all problems are reported in
one LaneCheckpointError. Extra keys are logged (they cannot change the math; a layout misreading
shows up as a missing key anyway). `check_tp_mode` refuses mode/checkpoint mismatches.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Mapping

import torch

from .config import LANE_MODEL_TYPES, LaneConfig
from .model import LaneModel, head_key, norm_key

log = logging.getLogger(__name__)

TP_MODES = ("exact", "delayed")


class LaneCheckpointError(ValueError):
    """A lane checkpoint is missing tensors or has tensors whose shape disagrees with config.json."""


class TPModeError(ValueError):
    """tp_mode does not fit the checkpoint kind (ordinary vs lane-trained)."""


def expected_shapes(cfg: LaneConfig) -> dict[str, tuple[int, ...]]:
    """Every state-dict key the model reads, with its shape (spec §2)."""
    L, D, V = cfg.num_lanes, cfg.hidden_size, cfg.vocab_size
    Q, K, F = cfg.q_dim, cfg.kv_dim, cfg.intermediate_size
    gain = (D,) if cfg.replicated_rmsn_scale else (L, D)
    out: dict[str, tuple[int, ...]] = {"model.tok_embeddings.weight": (V, D)}
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        out[p + "attention.wq.weight"] = (L, Q // L, D)
        out[p + "attention.wk.weight"] = (L, K // L, D)
        out[p + "attention.wv.weight"] = (L, K // L, D)
        out[p + "attention.wo.weight"] = (L, D, Q // L)
        out[p + "feed_forward.w1.weight"] = (L, F // L, D)
        out[p + "feed_forward.w3.weight"] = (L, F // L, D)
        out[p + "feed_forward.w2.weight"] = (L, D, F // L)
        out[norm_key(cfg, p + "attention_norm")] = gain
        out[norm_key(cfg, p + "ffn_norm")] = gain
    out[norm_key(cfg, "model.norm", final=True)] = (D,) if cfg.final_norm_shared else (L, D)
    if cfg.lm_head_type == "replicate":
        if not cfg.tie_word_embeddings:
            out["lm_head.weight"] = (V, D)
    elif cfg.lm_head_type == "lane":
        out["lm_head.linear.weight"] = (V, L * D)
    else:
        out["lm_head.weight"] = (L, V // L, D)
    return out


def _safetensor_files(path: Path) -> list[Path]:
    single = path / "model.safetensors"
    if single.is_file():
        return [single]
    index = path / "model.safetensors.index.json"
    if index.is_file():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        files = [path / n for n in names]
        absent = [str(f) for f in files if not f.is_file()]
        if absent:
            raise LaneCheckpointError(f"index lists missing shard(s): {absent}")
        return files
    raise LaneCheckpointError(f"no model.safetensors or model.safetensors.index.json in {path}")


def read_tensors(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file
    out: dict[str, torch.Tensor] = {}
    for f in _safetensor_files(path):
        out.update(load_file(str(f)))
    return out


def check_weights(cfg: LaneConfig, weights: Mapping[str, torch.Tensor]) -> list[str]:
    """Raise LaneCheckpointError listing every missing or mis-shaped tensor; return extra keys."""
    exp = expected_shapes(cfg)
    missing = [k for k in exp if k not in weights]
    bad = [f"{k}: expected {list(s)}, got {list(weights[k].shape)}"
           for k, s in exp.items() if k in weights and tuple(weights[k].shape) != s]
    problems = []
    if missing:
        problems.append(f"{len(missing)} missing tensor(s): {', '.join(missing[:12])}"
                        + (" ..." if len(missing) > 12 else ""))
    if bad:
        problems.append(f"{len(bad)} tensor(s) with a shape that disagrees with config.json "
                        f"(L={cfg.num_lanes}, D={cfg.hidden_size}, Hq={cfg.num_heads}, "
                        f"Hkv={cfg.num_kv_heads}, hd={cfg.head_dim}, F={cfg.intermediate_size}, "
                        f"V={cfg.vocab_size}, head={cfg.lm_head_type}): " + "; ".join(bad[:12]))
    if problems:
        raise LaneCheckpointError("lane checkpoint does not match its config: " + " | ".join(problems))
    extra = sorted(set(weights) - set(exp))
    if extra:
        log.warning("lane checkpoint has %d unused tensor(s), ignored: %s", len(extra), extra[:8])
    return extra


def load_lane_checkpoint(path: str | Path, dtype: torch.dtype | None = None,
                         device: str | torch.device = "cpu", **overrides) -> LaneModel:
    """Load config.json + safetensors into a LaneModel. `overrides` set LaneConfig fields
    (e.g. early_queue=False for ambiguity A1, use_early_comm=... for A4)."""
    path = Path(path)
    cfg = LaneConfig.from_json(path, **overrides)
    weights = read_tensors(path)
    check_weights(cfg, weights)
    keep = expected_shapes(cfg)
    if cfg.tie_word_embeddings and "lm_head.weight" in weights:
        keep = {**keep, "lm_head.weight": (cfg.vocab_size, cfg.hidden_size)}
    w = {k: weights[k].to(device) for k in keep if k in weights}
    return LaneModel(cfg, w, dtype=dtype)


# ---- mode / checkpoint kind ------------------------------------------------------------------
def checkpoint_kind(source: str | Path | Mapping[str, Any]) -> str:
    """'lane' for a Laneformer (delayed-TP-trained) checkpoint, 'dense' for anything else.
    `source` is a model directory, a config.json path, or the parsed config dict."""
    if isinstance(source, Mapping):
        d = source
    else:
        p = Path(source)
        p = p / "config.json" if p.is_dir() else p
        d = json.loads(p.read_text())
    return "lane" if d.get("model_type") in LANE_MODEL_TYPES else "dense"


def check_tp_mode(checkpoint_kind: str, tp_mode: str, tp: int | None = None,
                  num_lanes: int | None = None) -> None:
    """Refuse loading an ordinary checkpoint in 'delayed' mode or a lane checkpoint in 'exact' mode.
    With tp > 1 for a lane checkpoint, tp must equal the lane count it was trained for."""
    if tp_mode not in TP_MODES:
        raise TPModeError(f"unknown tp_mode {tp_mode!r}; expected one of {TP_MODES}")
    if checkpoint_kind not in ("lane", "dense"):
        raise TPModeError(f"unknown checkpoint kind {checkpoint_kind!r}; expected 'lane' or 'dense'")
    if checkpoint_kind == "dense" and tp_mode == "delayed":
        raise TPModeError(
            "tp_mode='delayed' needs a checkpoint trained with delayed tensor parallelism (a Laneformer "
            "lane checkpoint, model_type 'laneformer_tp'); this is an ordinary checkpoint, whose math "
            "delayed exchanges would change. Use tp_mode='exact'.")
    if checkpoint_kind == "lane" and tp_mode == "exact":
        raise TPModeError(
            "this is a Laneformer lane checkpoint (model_type 'laneformer_tp'): its lanes exchange "
            "partial sums with a delay, so tp_mode='exact' would compute a different model. "
            "Use tp_mode='delayed'.")
    if checkpoint_kind == "lane" and tp is not None and num_lanes is not None \
            and tp > 1 and tp != num_lanes:
        raise TPModeError(f"lane checkpoint was trained for {num_lanes} lanes; tp={tp} must be 1 "
                          f"(all lanes simulated on one device) or {num_lanes} (one GPU per lane)")


# ---- dense equivalent ------------------------------------------------------------------------
def to_dense_llama(cfg: LaneConfig, weights: Mapping[str, torch.Tensor]):
    """(LlamaConfig kwargs, HF Llama state dict) of the dense model the lanes compute while every
    layer is PRESENT (spec §2: wq.reshape(-1, D), wo.permute(1, 0, 2).reshape(D, -1)).
    RoPE pairs: the lane model rotates adjacent pairs, HF Llama rotates halves, so the rows of
    wq/wk are permuted per head (even dims first, then odd) — q·k is unchanged by that.
    With pre_norm_lane_agg the lane model normalises L·x instead of x: equal up to the norm eps."""
    if not cfg.replicated_rmsn_scale:
        raise ValueError("per-lane RMSNorm gains make the lanes differ: no dense equivalent")
    D, hd, L = cfg.hidden_size, cfg.head_dim, cfg.num_lanes
    perm = torch.cat([torch.arange(0, hd, 2), torch.arange(1, hd, 2)])

    def rows(w):       # row lane linear [L, out/L, in] -> dense [out, in]
        return w.reshape(-1, w.shape[-1])

    def cols(w):       # column lane linear [L, out, in/L] -> dense [out, in]
        return w.permute(1, 0, 2).reshape(w.shape[1], -1)

    def rope_rows(w, heads):
        return w.reshape(heads, hd, -1)[:, perm].reshape(heads * hd, -1)

    sd = {"model.embed_tokens.weight": weights["model.tok_embeddings.weight"],
          "model.norm.weight": weights["model.norm.weight"]}
    for i in range(cfg.num_layers):
        s, d = f"model.layers.{i}.", f"model.layers.{i}."
        sd[d + "self_attn.q_proj.weight"] = rope_rows(rows(weights[s + "attention.wq.weight"]), cfg.num_heads)
        sd[d + "self_attn.k_proj.weight"] = rope_rows(rows(weights[s + "attention.wk.weight"]), cfg.num_kv_heads)
        sd[d + "self_attn.v_proj.weight"] = rows(weights[s + "attention.wv.weight"])
        sd[d + "self_attn.o_proj.weight"] = cols(weights[s + "attention.wo.weight"])
        sd[d + "mlp.gate_proj.weight"] = rows(weights[s + "feed_forward.w1.weight"])
        sd[d + "mlp.up_proj.weight"] = rows(weights[s + "feed_forward.w3.weight"])
        sd[d + "mlp.down_proj.weight"] = cols(weights[s + "feed_forward.w2.weight"])
        sd[d + "input_layernorm.weight"] = weights[s + "attention_norm.weight"]
        sd[d + "post_attention_layernorm.weight"] = weights[s + "ffn_norm.weight"]
    if cfg.lm_head_type == "replicate":
        sd["lm_head.weight"] = weights.get("lm_head.weight", weights["model.tok_embeddings.weight"])
    elif cfg.lm_head_type == "vocab_parallel":
        sd["lm_head.weight"] = rows(weights["lm_head.weight"])
    else:  # lane head on identical streams: the L column blocks act on the same vector
        sd["lm_head.weight"] = weights[head_key(cfg)].reshape(cfg.vocab_size, L, D).sum(1)
    kwargs = dict(vocab_size=cfg.vocab_size, hidden_size=D, intermediate_size=cfg.intermediate_size,
                  num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads,
                  num_key_value_heads=cfg.num_kv_heads, head_dim=hd, rms_norm_eps=cfg.norm_eps,
                  rope_theta=cfg.rope_theta, max_position_embeddings=cfg.max_position_embeddings,
                  tie_word_embeddings=False, attention_bias=False, mlp_bias=False)
    return kwargs, sd


def write_dense_llama_checkpoint(cfg: LaneConfig, weights: Mapping[str, torch.Tensor],
                                 out_dir: str | Path) -> Path:
    """Save the dense equivalent (to_dense_llama) as an ordinary HF Llama directory
    (config.json + model.safetensors), loadable by engine.loader / transformers in tp_mode='exact'.
    It equals the lane model only while every layer is PRESENT (use_early_comm, δ >= N)."""
    from safetensors.torch import save_file
    kw, sd = to_dense_llama(cfg, weights)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    hf = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
          "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta},
          "eos_token_id": cfg.eos_token_id, "bos_token_id": cfg.bos_token_id, **kw}
    if cfg.rope_scaling is not None:
        hf["rope_parameters"] = {"rope_type": "llama3", "rope_theta": cfg.rope_theta, **cfg.rope_scaling}
        hf["rope_parameters"]["original_max_position_embeddings"] = \
            int(cfg.rope_scaling["original_max_position_embeddings"])
    (out / "config.json").write_text(json.dumps(hf, indent=2))
    save_file({k: v.contiguous() for k, v in sd.items()}, str(out / "model.safetensors"),
              metadata={"format": "pt"})
    return out


def lane_shard(cfg: LaneConfig, weights: Mapping[str, torch.Tensor], lane: int) -> dict[str, torch.Tensor]:
    """The tensors GPU `lane` needs in a one-GPU-per-lane engine (spec §7), same key names:
    lane weights -> W[lane] (2-D, contiguous); per-lane gains -> row `lane` ([D]); embedding, shared
    gains and a replicate head whole; vocab_parallel head -> its [V/L, D] slice; lane head -> its
    column block [V, D] (the engine all-reduces the per-lane partial logits)."""
    if not 0 <= lane < cfg.num_lanes:
        raise ValueError(f"lane {lane} outside 0..{cfg.num_lanes - 1}")
    out = {}
    for k, shape in expected_shapes(cfg).items():
        w = weights[k]
        if k == "lm_head.linear.weight":
            out[k] = w[:, lane * cfg.hidden_size:(lane + 1) * cfg.hidden_size].contiguous()
        elif len(shape) == 3 or (len(shape) == 2 and k.endswith(".scale")):
            out[k] = w[lane].contiguous()
        else:
            out[k] = w
    if "lm_head.weight" not in out and cfg.tie_word_embeddings:
        out["lm_head.weight"] = weights.get("lm_head.weight", weights["model.tok_embeddings.weight"])
    return out
