"""Load Hugging Face safetensors checkpoints (single file or sharded index) into engine.model.Model.

Tensors are read one at a time from memory-mapped files and copied (cast) straight into the model's
preallocated (fused) storage, so the checkpoint is never held twice in memory.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path

import torch
from safetensors import safe_open

from .config import ModelConfig
from .model import Model

log = logging.getLogger("engine")

# Buffers some exporters save that carry no weights of ours.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def checkpoint_files(model_dir: Path) -> dict[str, Path]:
    """tensor name -> file holding it."""
    index = model_dir / "model.safetensors.index.json"
    single = model_dir / "model.safetensors"
    if index.exists():
        try:
            wm = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError) as e:
            raise ValueError(f"corrupt checkpoint index {index}: {e}") from e
        out = {}
        for name, fn in wm.items():
            p = model_dir / fn
            if not p.exists():
                raise ValueError(f"checkpoint shard {p} listed in {index.name} does not exist")
            out[name] = p
        return out
    if single.exists():
        return {name: single for name in _keys(single)}
    raise ValueError(f"no model.safetensors or model.safetensors.index.json in {model_dir}")


def _keys(path: Path) -> list[str]:
    try:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            return list(f.keys())
    except Exception as e:
        raise ValueError(f"corrupt or truncated safetensors file {path}: {e}") from e


def load_weights(model: Model, model_dir: str | Path) -> None:
    model_dir = Path(model_dir)
    files = checkpoint_files(model_dir)
    expected = model.params
    by_file: dict[Path, list[str]] = {}
    for name, p in files.items():
        by_file.setdefault(p, []).append(name)
    problems: list[str] = []
    seen = set()
    plan: list[tuple[Path, str]] = []
    for p, names in by_file.items():
        try:
            with safe_open(str(p), framework="pt", device="cpu") as f:
                present = set(f.keys())
                for name in names:
                    if name not in present:
                        problems.append(f"{name}: listed in the index but absent from {p.name}")
                        continue
                    if name.endswith(_IGNORED_SUFFIXES):
                        continue
                    if name not in expected:
                        if name == "lm_head.weight" and model.cfg.tie_word_embeddings:
                            continue  # tied: a saved copy of the embedding is redundant
                        problems.append(f"unexpected tensor {name}")
                        continue
                    shape = tuple(f.get_slice(name).get_shape())
                    if shape != tuple(expected[name].shape):
                        problems.append(f"{name}: shape {list(shape)} != expected {list(expected[name].shape)}")
                        continue
                    seen.add(name)
                    plan.append((p, name))
        except ValueError:
            raise
        except Exception as e:
            raise ValueError(f"corrupt or truncated safetensors file {p}: {e}") from e
    missing = sorted(set(expected) - seen)
    if missing:
        problems.extend(f"missing tensor {n}" for n in missing)
    if problems:
        raise ValueError(f"checkpoint {model_dir} does not match the {model.cfg.arch} config:\n  "
                         + "\n  ".join(problems))
    with torch.inference_mode():
        for p, names in _group(plan).items():
            try:
                with safe_open(str(p), framework="pt", device="cpu") as f:
                    for name in names:
                        expected[name].copy_(f.get_tensor(name))  # copy_ casts dtype and moves device
            except Exception as e:
                raise ValueError(f"corrupt or truncated safetensors file {p} (reading {name}): {e}") from e


def _group(plan):
    out: dict[Path, list[str]] = {}
    for p, n in plan:
        out.setdefault(p, []).append(n)
    return out


def load_model(model_dir: str | Path, device="cpu", dtype=torch.float32, max_len: int = 4096,
               config: ModelConfig | None = None) -> Model:
    model_dir = Path(model_dir)
    cfg = config or ModelConfig.from_json(model_dir)
    model = Model(cfg, device=device, dtype=dtype, max_len=max_len)
    load_weights(model, model_dir)
    log.info("loaded %s: %d params, %s on %s", model_dir, model.n_params(), dtype, device)
    return model
