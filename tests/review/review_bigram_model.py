"""A deterministic "oracle" checkpoint for review tests: a tiny Qwen2 whose next-token distribution is the bigram
distribution of a given text, built in closed form (no training).

Attention and MLP outputs are zeroed (o_proj = down_proj = 0), so the final hidden state is
rmsnorm(embedding[x]) of the current token x; the untied lm_head is solved by least squares so that
lm_head @ h_x = log P_bigram(. | x) for every token x of the text (exact while the text has at most
hidden_size distinct tokens). On the text itself every token then has p >= 1/count(prev token); a token
swapped for one that never followed its predecessor gets p ~ e^-30 while the model is sure of the original.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

FLOOR = -30.0  # logit of a successor never seen after x (relative to log-probs of seen ones)


def make_bigram_checkpoint(dir, text: str, hidden_size: int = 128) -> Path:
    from engine.testing import make_tiny_checkpoint
    from engine.tokenizer import Tokenizer

    d = make_tiny_checkpoint(dir, tie_word_embeddings=False, hidden_size=hidden_size, intermediate_size=128)
    tok = Tokenizer.from_dir(d)
    ids = tok.encode(text)
    follow: dict[int, Counter] = defaultdict(Counter)
    for a, b in zip(ids, ids[1:]):
        follow[a][b] += 1
    seen = sorted(follow)
    if len(seen) > hidden_size:
        raise ValueError(f"{len(seen)} distinct context tokens > hidden_size {hidden_size}")
    path = d / "model.safetensors"
    w = load_file(str(path))
    for k in list(w):
        if k.endswith("o_proj.weight") or k.endswith("down_proj.weight"):
            w[k] = torch.zeros_like(w[k])
    emb, g = w["model.embed_tokens.weight"].double(), w["model.norm.weight"].double()
    eps = 1e-6
    x = emb[seen]  # [n_seen, H]
    h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * g  # final hidden per context token
    vocab = w["lm_head.weight"].shape[0]
    target = torch.full((len(seen), vocab), FLOOR, dtype=torch.float64)
    for r, a in enumerate(seen):
        total = sum(follow[a].values())
        for b, c in follow[a].items():
            target[r, b] = torch.log(torch.tensor(c / total, dtype=torch.float64))
    # lm_head [V, H]: h @ lm_head.T = target  ->  lm_head.T = pinv(h) @ target
    w["lm_head.weight"] = (torch.linalg.pinv(h) @ target).T.contiguous().float()
    save_file(w, str(path), metadata={"format": "pt"})
    return d
