"""Test fixtures: complete tiny Hugging Face model directories (config, weights, tokenizer) without downloads."""
from __future__ import annotations

import functools
import json
from dataclasses import fields
from pathlib import Path

import torch
from safetensors.torch import save_file

from .config import ModelConfig
from .model import Model

QWEN_SPECIALS = ["<|endoftext|>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
                 "<|file_sep|>", "<|repo_name|>"]
LLAMA_EXTRA = ["<|begin_of_text|>"]

# A small built-in code corpus: enough for a byte-level BPE to learn common code pieces.
_CORPUS = r'''
import os
import sys
from typing import List, Optional


def add(a, b):
    """Return the sum of a and b."""
    return a + b


def fibonacci(n: int) -> List[int]:
    result = [0, 1]
    for i in range(2, n):
        result.append(result[i - 1] + result[i - 2])
    return result[:n]


class Stack:
    def __init__(self):
        self.items = []

    def push(self, item):
        self.items.append(item)

    def pop(self):
        if not self.items:
            raise IndexError("pop from empty stack")
        return self.items.pop()

    def __len__(self):
        return len(self.items)


def read_file(path: str) -> Optional[str]:
    if not os.path.exists(path):
        return None
    with open(path, "r", encoding="utf-8") as f:
        return f.read()


def main(argv):
    for arg in argv[1:]:
        text = read_file(arg)
        if text is None:
            print(f"missing: {arg}", file=sys.stderr)
            continue
        print(len(text.splitlines()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

function greet(name) {
  const message = `Hello, ${name}!`;
  console.log(message);
  return message;
}

for (let i = 0; i < 10; i++) {
  if (i % 2 === 0) {
    console.log(i);
  }
}

fn main() {
    let mut total = 0;
    for x in 0..10 {
        total += x * x;
    }
    println!("{}", total);
}

#include <stdio.h>
int main(void) {
    int values[4] = {1, 2, 3, 4};
    for (int i = 0; i < 4; ++i) printf("%d\n", values[i]);
    return 0;
}
# 注释: 日本語 テキスト 😀 emoji ✓ ünïcödé
'''


@functools.lru_cache(maxsize=4)
def _tokenizer_json(arch: str, vocab_size: int) -> str:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    specials = QWEN_SPECIALS + (LLAMA_EXTRA if arch == "llama" else [])
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), min_frequency=2)
    tok.train_from_iterator([_CORPUS] * 4, trainer=trainer)
    return tok.to_str()


def _tiny_config(arch: str, vocab_size: int, eos: int, bos: int | None, overrides: dict) -> ModelConfig:
    base = dict(arch=arch, vocab_size=vocab_size, hidden_size=64, n_layers=2, n_heads=4, n_kv_heads=2,
                intermediate_size=128, head_dim=16, rms_norm_eps=1e-6, rope_theta=10000.0,
                max_position_embeddings=2048, tie_word_embeddings=True, qkv_bias=(arch == "qwen2"),
                bos_token_id=bos, eos_token_ids=(eos,), torch_dtype="float32", name=f"tiny-{arch}")
    names = {f.name for f in fields(ModelConfig)}
    bad = set(overrides) - names
    if bad:
        raise ValueError(f"unknown override(s) {sorted(bad)}; known: {sorted(names)} + shards, init_std, "
                         f"tokenizer_vocab")
    base.update(overrides)
    if "head_dim" not in overrides and "hidden_size" in overrides:
        base["head_dim"] = base["hidden_size"] // base["n_heads"]
    return ModelConfig(**base)


def make_tiny_checkpoint(dir, arch: str = "qwen2", seed: int = 0, shards: int = 1, init_std: float = 0.08,
                         tokenizer_vocab: int = 512, **overrides) -> Path:
    """Write a complete HF-layout model directory and return its path.

    arch: "qwen2" | "llama"; overrides: ModelConfig fields (hidden_size, n_layers, n_heads, n_kv_heads, head_dim,
    intermediate_size, rope_scaling, tie_word_embeddings, qkv_bias, vocab_size, ...); shards > 1 writes
    model-0000K-of-0000N.safetensors + model.safetensors.index.json.
    """
    if arch not in ("qwen2", "llama"):
        raise ValueError(f"arch must be 'qwen2' or 'llama', not {arch!r}")
    d = Path(dir)
    d.mkdir(parents=True, exist_ok=True)
    tj = _tokenizer_json(arch, tokenizer_vocab)
    (d / "tokenizer.json").write_text(tj)
    vocab = json.loads(tj)["added_tokens"]
    ids = {t["content"]: t["id"] for t in vocab}
    n_tok = max(json.loads(tj)["model"]["vocab"].values()) + 1
    n_tok = max(n_tok, max(ids.values()) + 1)
    bos = ids["<|begin_of_text|>"] if arch == "llama" else None
    overrides.setdefault("vocab_size", n_tok)
    cfg = _tiny_config(arch, overrides.pop("vocab_size"), ids["<|endoftext|>"], bos, overrides)
    if cfg.vocab_size < n_tok:
        raise ValueError(f"vocab_size {cfg.vocab_size} < tokenizer size {n_tok}")
    (d / "config.json").write_text(json.dumps(cfg.to_hf_dict(), indent=2))
    tc = {"eos_token": "<|endoftext|>", "model_max_length": cfg.max_position_embeddings}
    if arch == "llama":
        tc.update(add_bos_token=True, bos_token="<|begin_of_text|>")
    else:
        tc.update(add_bos_token=False, bos_token=None)
    (d / "tokenizer_config.json").write_text(json.dumps(tc, indent=2))
    model = Model(cfg, device="cpu", dtype=torch.float32, max_len=8).init_random(seed, std=init_std)
    tensors = {n: t.contiguous().clone() for n, t in model.params.items()}
    for old in list(d.glob("model*.safetensors")) + list(d.glob("model.safetensors.index.json")):
        old.unlink()
    if shards <= 1:
        save_file(tensors, str(d / "model.safetensors"), metadata={"format": "pt"})
    else:
        names = list(tensors)
        per = -(-len(names) // shards)
        wm = {}
        for k in range(shards):
            fn = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
            part = {n: tensors[n] for n in names[k * per:(k + 1) * per]}
            save_file(part, str(d / fn), metadata={"format": "pt"})
            wm.update({n: fn for n in part})
        total = sum(t.numel() * t.element_size() for t in tensors.values())
        (d / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {"total_size": total}, "weight_map": wm}, indent=2))
    return d


class FakeTokenStream:
    """The host-polling half of a stand-in for a monokernel in CPU tests of the backends: a launch fills
    `tokens` at once (and resets `shown`, `cancelled`); count() then reveals one more token per poll, as tokens
    arrive from a running kernel; cancel() freezes what was shown; wait() returns at once."""

    tokens: list[int] = []
    shown = 0
    cancelled = False

    def count(self) -> int:
        if not self.cancelled:
            self.shown = min(self.shown + 1, len(self.tokens))
        return self.shown

    def token(self, i: int) -> int:
        return self.tokens[i]

    def done(self) -> bool:
        return self.cancelled or self.shown >= len(self.tokens)

    def kernel_finished(self) -> bool:
        return True

    def cancel(self) -> None:
        self.cancelled = True

    def wait(self, timeout_s: float | None = None) -> None:
        return None
