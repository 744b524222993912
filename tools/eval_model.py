"""Held-out evaluation of the default model: perplexity, masked single-line FIM exact match, next-line
exact match. Everything runs on the *saved* checkpoint (bf16 weights upcast to fp32), i.e. what ships.

Masked-line task: pick a non-blank line of a held-out file; prompt
  <|fim_prefix|>{up to 1024 tokens before the line}<|fim_suffix|>{up to 256 tokens after it}<|fim_middle|>
(the suffix starts at the next line), greedy-decode up to 48 tokens, cut at the first newline or
<|endoftext|>, and compare with the line, both stripped of surrounding whitespace.
Next-line task: the same lines, prompt = the prefix alone (plain left-to-right).
"""
from __future__ import annotations

import math
import random

import torch

PREFIX_TOKENS, SUFFIX_TOKENS, MAX_NEW = 1024, 256, 48


def perplexity(model, tok, docs, *, seq_len: int, max_tokens: int, device: str, eos_id: int,
               batch: int = 16) -> dict:
    """Mean next-token NLL over held-out files (each followed by <|endoftext|>), non-overlapping windows."""
    ids, n_bytes = [], 0
    for d in docs:
        e = tok.encode(d.text, add_special_tokens=False).ids
        ids += e + [eos_id]
        n_bytes += len(d.text.encode("utf-8")) + 1
        if len(ids) >= max_tokens:
            break
    n_win = max(1, min(len(ids), max_tokens) // seq_len)
    used = ids[: n_win * seq_len + 1]
    bytes_per_token = n_bytes / max(1, len(ids))     # average over the encoded files
    x = torch.tensor(used[: n_win * seq_len], dtype=torch.long).view(n_win, seq_len)
    nll, count = 0.0, 0
    with torch.no_grad():
        for b in range(0, n_win, batch):
            xb = x[b:b + batch].to(device)
            logits = model(input_ids=xb, use_cache=False).logits.float()     # [B, T, V]
            lp = torch.log_softmax(logits[:, :-1], -1)
            tgt = xb[:, 1:]
            nll -= lp.gather(-1, tgt[..., None]).sum().item()
            count += tgt.numel()
    mean = nll / max(1, count)
    return {"tokens": count, "nll": round(mean, 4), "perplexity": round(math.exp(mean), 3),
            "bits_per_byte": round(mean / math.log(2) / bytes_per_token, 4), "bytes_per_token": round(bytes_per_token, 3)}


def pick_lines(docs, n: int, seed: int) -> list[tuple[str, str, str]]:
    """-> n (before, line, after) triples: a uniform non-blank line (not the first) of a uniform file."""
    rng = random.Random(seed)
    pool = [d for d in docs if sum(1 for l in d.text.splitlines() if l.strip()) >= 3]
    out = []
    while pool and len(out) < n:
        d = rng.choice(pool)
        lines = d.text.splitlines(keepends=True)
        cand = [i for i, l in enumerate(lines) if l.strip() and i > 0]
        i = rng.choice(cand)
        out.append(("".join(lines[:i]), lines[i], "".join(lines[i + 1:])))
    return out


def greedy_batch(model, prompts: list[list[int]], *, max_new: int, eos_id: int, device: str,
                 batch: int = 64) -> list[list[int]]:
    """Greedy continuations of left-padded prompts (HF generate computes positions from the mask)."""
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    outs: list = [None] * len(prompts)
    for b in range(0, len(order), batch):
        group = [order[k] for k in range(b, min(b + batch, len(order)))]
        L = max(len(prompts[i]) for i in group)
        ids = torch.full((len(group), L), eos_id, dtype=torch.long)
        mask = torch.zeros((len(group), L), dtype=torch.long)
        for r, i in enumerate(group):
            p = prompts[i]
            ids[r, L - len(p):] = torch.tensor(p)
            mask[r, L - len(p):] = 1
        with torch.no_grad():
            g = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device), max_new_tokens=max_new,
                               do_sample=False, eos_token_id=eos_id, pad_token_id=eos_id,
                               num_beams=1)
        for r, i in enumerate(group):
            new = g[r, L:].tolist()
            if eos_id in new:
                new = new[: new.index(eos_id)]
            outs[i] = new
    return outs


def first_line(tok, ids: list[int]) -> str:
    return tok.decode(ids, skip_special_tokens=True).split("\n", 1)[0]


def line_tasks(model, tok, docs, *, n: int, seed: int, device: str, fim_ids, batch: int = 64) -> dict:
    """Masked single-line FIM exact match and next-line exact match on the same n held-out lines."""
    samples = pick_lines(docs, n, seed)
    fim_prompts, nl_prompts = [], []
    for before, line, after in samples:
        p = tok.encode(before, add_special_tokens=False).ids[-PREFIX_TOKENS:]
        s = tok.encode(after, add_special_tokens=False).ids[:SUFFIX_TOKENS]
        fim_prompts.append([fim_ids.prefix] + p + [fim_ids.suffix] + s + [fim_ids.middle])
        nl_prompts.append(p if p else [fim_ids.eos])
    fim_out = greedy_batch(model, fim_prompts, max_new=MAX_NEW, eos_id=fim_ids.eos, device=device, batch=batch)
    nl_out = greedy_batch(model, nl_prompts, max_new=MAX_NEW, eos_id=fim_ids.eos, device=device, batch=batch)
    fim_hits = nl_hits = long_n = long_fim = 0
    examples = []
    for k, ((before, line, after), fo, no) in enumerate(zip(samples, fim_out, nl_out)):
        target = line.strip()
        f, nx = first_line(tok, fo).strip(), first_line(tok, no).strip()
        fim_hits += f == target
        nl_hits += nx == target
        if len(target.replace(" ", "")) >= 10:               # lines with some content, not ")" or "else:"
            long_n += 1
            long_fim += f == target
        if k < 12:
            examples.append({"target": target, "fim": f, "next_line": nx})
    m = max(1, len(samples))
    return {"samples": len(samples), "fim_line_exact_match": round(fim_hits / m, 4),
            "next_line_exact_match": round(nl_hits / m, 4),
            "fim_line_exact_match_10plus_chars": round(long_fim / max(1, long_n), 4), "lines_10plus_chars": long_n,
            "examples": examples}
