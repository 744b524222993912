"""Training samples for the default model: fill-in-the-middle (PSM) mixed with plain left-to-right.

A FIM sample is  <|fim_prefix|>P<|fim_suffix|>S<|fim_middle|>M<|endoftext|>  with P, S, M tokenized
separately (character-level split, as an editor cursor can sit anywhere). Middles favour what an editor
asks for: one line (the rest of a line from a cursor inside it, or a whole line), or a small block;
some are random character spans. A share of samples get repository context in Qwen2.5-Coder's layout:
<|file_sep|>other/path.py\n<code>\n ... <|file_sep|>this/path.py\n  before the sample.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np


@dataclass
class FimIds:
    prefix: int
    suffix: int
    middle: int
    file_sep: int
    eos: int

    @classmethod
    def from_tokenizer(cls, tok) -> "FimIds":
        return cls(tok.token_to_id("<|fim_prefix|>"), tok.token_to_id("<|fim_suffix|>"),
                   tok.token_to_id("<|fim_middle|>"), tok.token_to_id("<|file_sep|>"),
                   tok.token_to_id("<|endoftext|>"))


def split_windows(text: str, max_chars: int) -> list[str]:
    """Cut a file into consecutive windows of whole lines, each <= max_chars (a longer line stays whole)."""
    out, cur, n = [], [], 0
    for line in text.splitlines(keepends=True):
        if cur and n + len(line) > max_chars:
            out.append("".join(cur))
            cur, n = [], 0
        cur.append(line)
        n += len(line)
    if cur:
        out.append("".join(cur))
    return out


def pretoken_snapper(tok):
    """-> snap(text, k): the largest pre-token start <= k (tok's pre-tokenizer run on a few lines around k: from
    the start of the line holding the last non-blank character before k -- a pre-token with a letter, digit or
    punctuation mark never starts on an earlier line, while newline runs can merge across blank lines -- to the
    end of k's line).

    A middle that starts on a pre-token boundary makes prefix tokens + middle tokens exactly the tokens of the
    whole text: the FIM sample reads like the plain text the model also learns from, and the cursor positions
    match what the engine's token healing serves (engine/healing.py cuts the prompt back to such a boundary and
    the first middle token re-spells the cut text)."""
    pre = tok.pre_tokenizer

    def snap(text: str, k: int) -> int:
        j = k - 1
        while j >= 0 and text[j].isspace():
            j -= 1
        ls = text.rfind("\n", 0, max(j, 0)) + 1 if j >= 0 else 0
        le = text.find("\n", k)
        le = len(text) if le < 0 else le + 1
        best = ls
        for _, (a, _) in pre.pre_tokenize_str(text[ls:le]):
            if ls + a > k:
                break
            best = ls + a
        return best

    return snap


def choose_fim_span(text: str, rng: random.Random, p_line: float = 0.45,
                    p_block: float = 0.25, snap=None) -> tuple[int, int]:
    """-> (start, end) character offsets of the middle: p_line one line, p_block a 2-8 line block,
    the rest a random span. Line spans start at the line start or at a random point after the
    indentation (cursor mid-line) and end at the line end, usually including the newline.
    snap: pretoken_snapper(tok) or None; moves the start back to a pre-token boundary."""
    lines = text.splitlines(keepends=True)
    starts = np.cumsum([0] + [len(l) for l in lines]).tolist()
    nonblank = [i for i, l in enumerate(lines) if l.strip()]
    kind = rng.random()
    if nonblank and kind < p_line + p_block:
        i = rng.choice(nonblank)
        j = i if kind < p_line else min(len(lines) - 1, i + rng.randint(1, 7))
        line = lines[i]
        indent = len(line) - len(line.lstrip(" \t"))
        content_end = len(line.rstrip("\r\n"))
        s = starts[i]
        if rng.random() < 0.5 and content_end > indent + 1:
            s += rng.randint(indent, content_end - 1)
        end_line = lines[j]
        e = starts[j] + len(end_line)
        if rng.random() < 0.25 and end_line.endswith("\n"):
            e -= 1
        if snap is not None:
            s = snap(text, s)
        return s, max(s, e)
    a, b = sorted(rng.randint(0, len(text)) for _ in range(2))
    if snap is not None:
        a = snap(text, a)
    return a, b


@dataclass
class SampleSpec:
    """One training sample before tokenization: a list of special ids (int) and text pieces (str)."""
    parts: list


def make_sample(text: str, path: str, rng: random.Random, ids: FimIds, fim_rate: float = 0.5,
                context: list[tuple[str, str]] | None = None, span_mix: tuple[float, float] = (0.45, 0.25),
                max_suffix_chars: int | None = None, snap=None, spm_rate: float = 0.0) -> SampleSpec:
    """text: one window of a file; context: (path, snippet) of other files of the same package or None.
    spm_rate: share of FIM samples in SPM order  <|fim_prefix|><|fim_suffix|>S<|fim_middle|>P M<|endoftext|>
    (the rest PSM).
    max_suffix_chars: when set, a FIM suffix is cut to a random length in [0, max_suffix_chars] at a line
    end, as the server sends only a short window after the cursor (suffixTokens=256); a short suffix
    also puts the prefix end close to <|fim_middle|>, which a small model finds much sooner."""
    parts: list = []
    if context:
        for cpath, snippet in context:
            parts += [ids.file_sep, f"{cpath}\n{snippet.rstrip()}\n"]
        parts += [ids.file_sep, f"{path}\n"]
    if rng.random() < fim_rate and len(text) > 10:
        s, e = choose_fim_span(text, rng, *span_mix, snap=snap)
        suffix = text[e:]
        if max_suffix_chars is not None and len(suffix) > max_suffix_chars:
            cut = suffix[: rng.randint(0, max_suffix_chars)]
            nl = cut.rfind("\n")
            suffix = cut[: nl + 1] if nl >= 0 else ""
        if spm_rate > 0 and rng.random() < spm_rate:   # no draw at 0: older phases keep their data
            # SPM order (StarCoder / the FIM paper): the prefix sits right before the middle, so "where am I"
            # is the previous token instead of a lookup across the whole suffix.
            parts += [ids.prefix, ids.suffix, suffix, ids.middle, text[:s], text[s:e], ids.eos]
        else:
            parts += [ids.prefix, text[:s], ids.suffix, suffix, ids.middle, text[s:e], ids.eos]
    else:
        parts += [text, ids.eos]
    return SampleSpec(parts)


def build_specs(docs, ids: FimIds, seed: int, window_chars: int, fim_rate: float = 0.5,
                context_rate: float = 0.15, min_window_chars: int | None = None,
                span_mix: tuple[float, float] = (0.45, 0.25),
                max_suffix_chars: int | None = None, snap=None, spm_rate: float = 0.0) -> list[SampleSpec]:
    """docs: iterable of corpus.Document. Deterministic for a given seed and document order.
    min_window_chars: when set, each file is cut into windows of a random size in
    [min_window_chars, window_chars], so short FIM samples (one cursor each) are more frequent.
    snap: pretoken_snapper(tok) to start every middle on a pre-token boundary."""
    rng = random.Random(seed)
    by_pkg: dict[str, list] = {}
    for d in docs:
        by_pkg.setdefault(d.package, []).append(d)
    specs = []
    for pkg in sorted(by_pkg):
        group = by_pkg[pkg]
        for d in group:
            wc = window_chars if min_window_chars is None else rng.randint(min_window_chars, window_chars)
            for w in split_windows(d.text, wc):
                ctx = None
                if len(group) > 1 and rng.random() < context_rate:
                    ctx = []
                    for o in rng.sample(group, min(len(group), rng.randint(1, 2))):
                        if o is not d:
                            snip = split_windows(o.text, window_chars // 4)[0]
                            ctx.append((o.path, snip))
                specs.append(make_sample(w, d.path, rng, ids, fim_rate, ctx or None, span_mix, max_suffix_chars,
                                         snap, spm_rate))
    rng.shuffle(specs)
    return specs


def encode_specs(specs: list[SampleSpec], tok, batch: int = 4096) -> list[np.ndarray]:
    """One int32 array per sample (text pieces batch-encoded, no special tokens added)."""
    out = []
    for b in range(0, len(specs), batch):
        group = specs[b:b + batch]
        texts = [p for s in group for p in s.parts if isinstance(p, str)]
        encs = iter(tok.encode_batch(texts, add_special_tokens=False))
        for s in group:
            pieces = [np.asarray(next(encs).ids, dtype=np.int32) if isinstance(p, str)
                      else np.asarray([p], dtype=np.int32) for p in s.parts]
            out.append(np.concatenate(pieces))
    return out


def tokenize_specs(specs: list[SampleSpec], tok, batch: int = 4096) -> np.ndarray:
    """Packs all samples into one int32 token stream (windows are cut from it regardless of samples)."""
    arrs = encode_specs(specs, tok, batch)
    return np.concatenate(arrs) if arrs else np.zeros(0, np.int32)


def pack_aligned(specs: list[SampleSpec], tok, seq_len: int, middle_id: int, eos_id: int):
    """-> (tokens int32 [n*seq_len], loss_mask bool [n*seq_len], dropped).

    Stream packing cuts windows anywhere, so a FIM sample often straddles two windows and the second
    one trains "guess the middle without the prefix" -- noise that teaches a small model to ignore
    the prefix. Here a FIM sample always lies whole inside one window; the gap left at a window's end
    is filled with plain-text tokens (which may be split freely), or masked padding when none remain.
    FIM samples longer than seq_len are dropped (counted)."""
    arrs = encode_specs(specs, tok)
    fim = [a for sp, a in zip(specs, arrs) if middle_id in sp.parts]
    plain_parts = [a for sp, a in zip(specs, arrs) if middle_id not in sp.parts]
    plain = np.concatenate(plain_parts) if plain_parts else np.zeros(0, np.int32)
    toks, mask = [], []
    cur: list[np.ndarray] = []
    cur_len, pos, dropped = 0, 0, 0

    def close():
        nonlocal cur, cur_len, pos
        gap = seq_len - cur_len
        take = plain[pos: pos + gap]
        pos += len(take)
        pad = np.full(gap - len(take), eos_id, np.int32)
        toks.append(np.concatenate(cur + [take, pad]))
        mask.append(np.concatenate([np.ones(cur_len + len(take), bool), np.zeros(len(pad), bool)]))
        cur, cur_len = [], 0

    for a in fim:
        if len(a) > seq_len:
            dropped += 1
            continue
        if cur_len + len(a) > seq_len:
            close()
        cur.append(a)
        cur_len += len(a)
    if cur:
        close()
    rest = plain[pos:]
    n_rest = len(rest) // seq_len
    if n_rest:
        toks.append(rest[: n_rest * seq_len])
        mask.append(np.ones(n_rest * seq_len, bool))
    if not toks:
        return np.zeros(0, np.int32), np.zeros(0, bool), dropped
    return np.concatenate(toks), np.concatenate(mask), dropped
