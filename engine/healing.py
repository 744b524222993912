"""Token healing: let the model re-choose the last token(s) of the text before the cursor.

A prompt is encoded from the text up to the cursor, so its last token is whatever the tokenizer made of a
text that *ends there*. When the user's text continues (the model's job), the tokenizer would often have
merged across the cursor: `os.path.` + `join` is `.path` `.join` in training text, not `.path` `.` `join`;
`sorted(` + `self` is `sorted` `(self`. A model conditioned on the standalone `.` has rarely seen what
follows it in training. Healing removes such a tail from the prompt and constrains the first generated
token(s) to *re-spell* the removed bytes (token bytes start with them, or are a proper head of them and the
next step continues the constraint), so the model picks the merged token itself. The removed text is
regenerated, not emitted: the caller's text still starts right after the cursor.

What is backed off: at most `max_back` (2) tokens right before the boundary, each only when some vocab token
is strictly longer than, and starts with, the bytes removed so far (the tail could have merged with what
follows). Special/added tokens and tokens ending in a newline (a line start is already a boundary) are never
removed. Only byte-level BPE tokenizers (Qwen, Llama 3, GPT-2 style, the default model) are healed; for others
HealVocab.ok is False and .reason says why.
"""
from __future__ import annotations

import bisect
import json
import logging
from dataclasses import dataclass

import torch

log = logging.getLogger("engine")

MAX_BACK = 2          # tokens backed off at most; more rarely pays and costs constrained Python steps
MAX_HEAL_BYTES = 32   # a longer tail (a huge token) is not worth regenerating


class HealVocab:
    """Byte spelling of every (non-special) token of one tokenizer, built once per tokenizer.

    `sorted_bytes` / `sorted_ids`: the spellings in byte order, so "tokens starting with B" is one bisect range.
    `exact`: spelling -> ids with exactly that spelling (a proper head of the removed bytes).
    `ok`: False when this tokenizer's pieces cannot be spelled exactly; `reason` says why.
    """

    def __init__(self, tokenizer):
        self.ok, self.reason = True, "ok"
        self.spelling: dict[int, bytes] = {}
        specials = set(getattr(tokenizer, "_added_ids", {}) or {})
        hf = tokenizer.tok
        kind = _decoder_kind(hf)
        n = tokenizer.vocab_size
        if kind == "bytelevel":
            for i in range(n):
                if i not in specials and hf.id_to_token(i) is not None:
                    self.spelling[i] = tokenizer.piece_bytes(i)
        else:
            # Sentencepiece decoders (Llama 2, CodeLlama) strip the space of a sequence's first piece, so the
            # generated text could not be cut exactly after the re-spelled part; other decoders have no byte
            # spelling per token at all.
            self.ok, self.reason = False, f"tokenizer decoder {kind!r} is not byte-level"
        self.spelling = {i: b for i, b in self.spelling.items() if b}
        pairs = sorted((b, i) for i, b in self.spelling.items())
        self.sorted_bytes = [b for b, _ in pairs]
        self.sorted_ids = [i for _, i in pairs]
        self.exact: dict[bytes, list[int]] = {}
        for b, i in pairs:
            self.exact.setdefault(b, []).append(i)
        self._masks: dict[tuple[bytes, str], torch.Tensor] = {}   # (rest, device) -> allowed ids, bounded

    def allowed_ids(self, rest: bytes, device) -> torch.Tensor:
        """allowed(rest) as a LongTensor on `device`, cached: a whitespace tail allows tens of thousands of
        tokens in a 150k vocab, and the same few tails come back on every keystroke."""
        key = (rest, str(device))
        t = self._masks.get(key)
        if t is None:
            if len(self._masks) >= 256:
                self._masks.clear()
            t = self._masks[key] = torch.tensor(self.allowed(rest), dtype=torch.long, device=device)
        return t

    def starting_with(self, head: bytes) -> range:
        """Positions in sorted_bytes of the spellings that start with `head` (a contiguous run)."""
        lo = bisect.bisect_left(self.sorted_bytes, head)
        upper = _next_prefix(head)
        hi = len(self.sorted_bytes) if upper is None else bisect.bisect_left(self.sorted_bytes, upper, lo)
        return range(lo, hi)

    def extensible(self, head: bytes) -> bool:
        """Some token is strictly longer than `head` and starts with it."""
        return len(self.starting_with(head)) > len(self.exact.get(head, ()))

    def allowed(self, rest: bytes) -> list[int]:
        """Ids whose spelling starts with `rest`, or is a proper non-empty head of it."""
        out = [self.sorted_ids[k] for k in self.starting_with(rest)]
        for j in range(1, len(rest)):
            out += self.exact.get(rest[:j], ())
        return out


def _next_prefix(head: bytes) -> bytes | None:
    """The smallest byte string greater than every string that starts with `head` (None: no such bound)."""
    h = head.rstrip(b"\xff")
    if not h:
        return None
    return h[:-1] + bytes([h[-1] + 1])


def _decoder_kind(hf) -> str:
    try:
        dec = json.loads(hf.to_str()).get("decoder") or {}
    except Exception:
        return "unknown"
    types = [dec.get("type")] + [d.get("type") for d in dec.get("decoders", []) or []]
    return "bytelevel" if "ByteLevel" in types else "/".join(str(t) for t in types if t)


def heal_vocab(tokenizer) -> HealVocab:
    """The HealVocab of `tokenizer` (engine.tokenizer.Tokenizer), computed on first use and kept on it."""
    v = getattr(tokenizer, "_heal_vocab", None)
    if v is None:
        v = tokenizer._heal_vocab = HealVocab(tokenizer)
        if not v.ok:
            log.info("token healing off for this tokenizer: %s", v.reason)
    return v


@dataclass
class HealPlan:
    ids: list[int]        # the prompt with the healed tail removed
    removed_ids: list[int]
    removed: bytes        # their bytes: the first generated token(s) must spell these first
    text: str             # the same as text (what the output must not repeat)


def default_boundary(ids: list[int], fim) -> int:
    """Where the text before the cursor ends in `ids` (`fim`: the tokenizer's FimTokens or None):
    - PSM  <fim_prefix> P <fim_suffix> S <fim_middle>    (ids end with <fim_middle>): right before the last
      <fim_suffix>;
    - SPM  <fim_prefix><fim_suffix> S <fim_middle> P     (tokens after the last <fim_middle>), or no FIM markers:
      the end of `ids`."""
    if fim is not None and fim.suffix is not None and ids and ids[-1] == fim.middle:
        for k in range(len(ids) - 1, -1, -1):
            if ids[k] == fim.suffix:
                return k
    return len(ids)


def plan(vocab: HealVocab, ids: list[int], boundary: int, max_back: int = MAX_BACK) -> HealPlan | None:
    """Which tokens right before `boundary` to remove; None when nothing is worth healing."""
    if not vocab.ok or boundary <= 0:
        return None
    removed = b""
    k = 0
    while k < max_back and boundary - k - 1 >= 0:
        tid = ids[boundary - k - 1]
        b = vocab.spelling.get(tid)
        if b is None:                      # special / added token (a FIM marker): never crossed
            break
        if b.endswith(b"\n"):
            # A line start is a pre-token boundary for Qwen2 / Llama 3 / GPT-4 style splits (the newline closes
            # the previous line's piece; indentation starts a new one); healing it only lets the model merge
            # blank lines in, and measured on the default model it then wrote an empty first line for most
            # masked-line FIM prompts (tools/eval_model.py, variant "line").
            break
        cand = b + removed
        if len(cand) > MAX_HEAL_BYTES or not vocab.extensible(cand):
            break
        removed, k = cand, k + 1
    if k == 0:
        return None
    try:
        text = removed.decode("utf-8")
    except UnicodeDecodeError:             # half a character: the output could not be cut by text length
        return None
    return HealPlan(ids[:boundary - k] + ids[boundary:], ids[boundary - k:boundary], removed, text)


class Constraint:
    """The per-step constraint while the removed bytes are being re-spelled."""

    def __init__(self, vocab: HealVocab, removed: bytes):
        self.vocab = vocab
        self.rest = removed

    @property
    def done(self) -> bool:
        return not self.rest

    def mask(self, logits: torch.Tensor) -> torch.Tensor:
        """logits: fp32 [V] -> a copy with every token that cannot continue the removed bytes at -inf."""
        allowed = self.vocab.allowed_ids(self.rest, logits.device)
        out = torch.full_like(logits, float("-inf"))
        out[allowed] = logits[allowed]
        return out

    def advance(self, token: int) -> None:
        b = self.vocab.spelling.get(token, b"")
        # A token outside the constraint (only possible if a caller sampled unmasked) ends it.
        self.rest = self.rest[len(b):] if b and self.rest.startswith(b) else b""


class SkipDecoder:
    """Wraps a StreamDecoder and drops the first len(text) characters of its output: the removed prompt text
    that the constrained tokens regenerate (their bytes start with it, so the decoded text does too)."""

    def __init__(self, inner, text: str):
        self.inner = inner
        self.skip = len(text)

    def _cut(self, s: str) -> str:
        if self.skip and s:
            n = min(self.skip, len(s))
            self.skip -= n
            s = s[n:]
        return s

    def push(self, token_id: int) -> str:
        return self._cut(self.inner.push(token_id))

    def flush(self) -> str:
        return self._cut(self.inner.flush())
