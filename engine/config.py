"""Model configuration: one dataclass read from a Hugging Face config.json (Llama, Qwen2) plus presets.

Both the legacy keys (`rope_theta`, `rope_scaling`) and the transformers>=5 key (`rope_parameters`) are read.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

# architectures -> our family name; the model file handles both families with the same code.
_ARCHS = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2"}
_MODEL_TYPES = {"llama": "llama", "qwen2": "qwen2"}
_REQUIRED = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")


@dataclass
class ModelConfig:
    arch: str                      # "llama" | "qwen2"
    vocab_size: int
    hidden_size: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    intermediate_size: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    # None or {"rope_type": "llama3", "factor", "low_freq_factor", "high_freq_factor",
    # "original_max_position_embeddings"}
    rope_scaling: dict | None = None
    max_position_embeddings: int = 32768
    tie_word_embeddings: bool = False
    qkv_bias: bool = False         # Qwen2: always; Llama: attention_bias flag
    o_bias: bool = False           # Llama attention_bias also puts a bias on o_proj
    mlp_bias: bool = False
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    torch_dtype: str | None = None
    name: str = ""

    @property
    def q_dim(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.head_dim

    def n_params(self) -> int:
        d, L = self.hidden_size, self.n_layers
        attn = d * (self.q_dim + 2 * self.kv_dim) + self.q_dim * d
        if self.qkv_bias:
            attn += self.q_dim + 2 * self.kv_dim
        if self.o_bias:
            attn += d
        mlp = 3 * d * self.intermediate_size
        if self.mlp_bias:
            mlp += 2 * self.intermediate_size + d
        emb = self.vocab_size * d * (1 if self.tie_word_embeddings else 2)
        return L * (attn + mlp + 2 * d) + d + emb

    # ---- Hugging Face config.json ----
    @classmethod
    def from_hf_dict(cls, hf: dict[str, Any], name: str = "") -> "ModelConfig":
        archs = hf.get("architectures") or []
        arch = None
        for a in archs:
            if a in _ARCHS:
                arch = _ARCHS[a]
        if arch is None:
            mt = hf.get("model_type")
            if archs and not any(a in _ARCHS for a in archs):
                raise ValueError(f"unsupported architecture {archs} (supported: {sorted(_ARCHS)})")
            if mt not in _MODEL_TYPES:
                raise ValueError(f"unsupported model_type {mt!r} (supported: {sorted(_MODEL_TYPES)})")
            arch = _MODEL_TYPES[mt]
        missing = [k for k in _REQUIRED if hf.get(k) is None]
        if missing:
            raise ValueError(f"config.json is missing required key(s): {', '.join(missing)}")
        act = hf.get("hidden_act", "silu")
        if act not in ("silu", "swish"):
            raise ValueError(f"unsupported hidden_act {act!r} (only SwiGLU/silu)")
        if arch == "qwen2" and hf.get("use_sliding_window"):
            raise ValueError("unsupported: Qwen2 use_sliding_window=true")
        n_heads = int(hf["num_attention_heads"])
        n_kv = int(hf.get("num_key_value_heads") or n_heads)
        if n_heads % n_kv:
            raise ValueError(f"num_attention_heads {n_heads} not a multiple of num_key_value_heads {n_kv}")
        d = int(hf["hidden_size"])
        head_dim = hf.get("head_dim") or d // n_heads
        rope = dict(hf.get("rope_parameters") or {})
        legacy = hf.get("rope_scaling")
        if legacy:
            rope.update(legacy)
        theta = float(rope.get("rope_theta", hf.get("rope_theta", 10000.0)))
        rtype = rope.get("rope_type", rope.get("type", "default"))
        scaling = None
        if rtype == "llama3":
            keys = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
            miss = [k for k in keys if k not in rope]
            if miss:
                raise ValueError(f"llama3 rope scaling is missing key(s): {', '.join(miss)}")
            scaling = {"rope_type": "llama3", **{k: float(rope[k]) for k in keys}}
            scaling["original_max_position_embeddings"] = int(rope["original_max_position_embeddings"])
        elif rtype not in ("default", None):
            raise ValueError(f"unsupported rope_type {rtype!r} (supported: default, llama3)")
        eos = hf.get("eos_token_id")
        eos_ids = tuple(int(e) for e in (eos if isinstance(eos, list) else [eos] if eos is not None else []))
        attn_bias = bool(hf.get("attention_bias", False))
        return cls(
            arch=arch, vocab_size=int(hf["vocab_size"]), hidden_size=d, n_layers=int(hf["num_hidden_layers"]),
            n_heads=n_heads, n_kv_heads=n_kv, intermediate_size=int(hf["intermediate_size"]),
            head_dim=int(head_dim), rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)), rope_theta=theta,
            rope_scaling=scaling, max_position_embeddings=int(hf.get("max_position_embeddings", 32768)),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            qkv_bias=True if arch == "qwen2" else attn_bias, o_bias=(arch == "llama" and attn_bias),
            mlp_bias=bool(hf.get("mlp_bias", False)), bos_token_id=hf.get("bos_token_id"),
            eos_token_ids=eos_ids, torch_dtype=hf.get("torch_dtype") or hf.get("dtype"), name=name)

    @classmethod
    def from_json(cls, path: str | Path) -> "ModelConfig":
        path = Path(path)
        if path.is_dir():
            path = path / "config.json"
        if not path.exists():
            raise ValueError(f"no config.json at {path}")
        try:
            hf = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise ValueError(f"{path} is not valid JSON: {e}") from e
        return cls.from_hf_dict(hf, name=path.parent.name)

    def to_hf_dict(self) -> dict[str, Any]:
        """The config.json a Hugging Face loader (and from_hf_dict) understands."""
        hf: dict[str, Any] = {
            "architectures": ["LlamaForCausalLM" if self.arch == "llama" else "Qwen2ForCausalLM"],
            "model_type": self.arch, "vocab_size": self.vocab_size, "hidden_size": self.hidden_size,
            "num_hidden_layers": self.n_layers, "num_attention_heads": self.n_heads,
            "num_key_value_heads": self.n_kv_heads, "intermediate_size": self.intermediate_size,
            "head_dim": self.head_dim, "hidden_act": "silu", "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta, "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings, "bos_token_id": self.bos_token_id,
            "eos_token_id": list(self.eos_token_ids) if len(self.eos_token_ids) != 1 else self.eos_token_ids[0],
            "torch_dtype": self.torch_dtype or "float32",
        }
        params = {"rope_theta": self.rope_theta, "rope_type": "default"}
        if self.rope_scaling:
            hf["rope_scaling"] = dict(self.rope_scaling)
            params.update(self.rope_scaling)
        hf["rope_parameters"] = params
        if self.arch == "llama":
            hf["attention_bias"] = self.o_bias or self.qkv_bias
            hf["mlp_bias"] = self.mlp_bias
        return hf

    def replace(self, **kw) -> "ModelConfig":
        return replace(self, **kw)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _qwen(name, layers, d, nq, nkv, ffn):
    return ModelConfig(arch="qwen2", vocab_size=151936, hidden_size=d, n_layers=layers, n_heads=nq, n_kv_heads=nkv,
                       intermediate_size=ffn, head_dim=d // nq, rms_norm_eps=1e-6, rope_theta=1e6,
                       max_position_embeddings=32768, tie_word_embeddings=True, qkv_bias=True,
                       eos_token_ids=(151643,), name=name)


PRESETS: dict[str, ModelConfig] = {
    "qwen2.5-coder-0.5b": _qwen("qwen2.5-coder-0.5b", 24, 896, 14, 2, 4864),
    "qwen2.5-coder-1.5b": _qwen("qwen2.5-coder-1.5b", 28, 1536, 12, 2, 8960),
    "qwen2.5-coder-3b": _qwen("qwen2.5-coder-3b", 36, 2048, 16, 2, 11008),
    "qwen2.5-coder-7b": replace(_qwen("qwen2.5-coder-7b", 28, 3584, 28, 4, 18944), vocab_size=152064,
                                tie_word_embeddings=False),
    "llama-3.2-1b": ModelConfig(
        arch="llama", vocab_size=128256, hidden_size=2048, n_layers=16, n_heads=32, n_kv_heads=8,
        intermediate_size=8192, head_dim=64, rms_norm_eps=1e-5, rope_theta=500000.0,
        rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                      "original_max_position_embeddings": 8192},
        max_position_embeddings=131072, tie_word_embeddings=True, bos_token_id=128000,
        eos_token_ids=(128001, 128008, 128009), name="llama-3.2-1b"),
    # Not a released checkpoint: a ~2.3B dense Llama with the sizes inferred for Kog's laneformer-2b
    # (shared/DTP-laneformer.md section 1; head_dim 96), for benchmarks and kernel tests on random weights.
    "dense-2b": ModelConfig(
        arch="llama", vocab_size=32000, hidden_size=3072, n_layers=15, n_heads=32, n_kv_heads=16,
        intermediate_size=12288, head_dim=96, rms_norm_eps=1e-5, rope_theta=10000.0, max_position_embeddings=4096,
        tie_word_embeddings=False, name="dense-2b"),
}


def preset(name: str) -> ModelConfig:
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r} (known: {', '.join(sorted(PRESETS))})")
    return replace(PRESETS[name])
