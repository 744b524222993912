"""Incremental prompt encoding: re-tokenize only the lines near the cursor on each keystroke.

build_prompt encodes a ~4k-character prefix window and a suffix window on every keystroke (about 1.3 ms
on the host for a typical file). Most of that text is unchanged from the previous keystroke, so it is
cut at *safe line boundaries* and each piece's ids are cached by the piece's text.

Why concatenating the pieces' ids is exact (the ids equal one encode() of the whole text):
The tokenizer must be byte-level BPE whose pre-tokenizer is exactly Split(<Qwen2 or Llama-3 regex>,
Isolated) + ByteLevel(no regex, no prefix space), with no normalizer or NFC, and no added token that
contains a line break or strips / matches whole words. BPE merges never cross pre-token boundaries, so
encode(a + b) == encode(a) + encode(b) whenever len(a) is a pre-token boundary of a + b that both a
and b alone also split the same way. We cut at position i when text[i-1] == "\\n" and the rest of
line i (up to the next \\r or \\n) holds a printable ASCII character. Then:
- the whitespace run that ends with that "\\n" (possibly continuing as the indentation of line i) holds
  no later \\r/\\n, so the regex alternative `\\s*[\\r\\n]+` (tried before `\\s+(?!\\S)`; the earlier
  alternatives need a letter, digit or punctuation right after a non-newline character) ends exactly at
  i in a + b and in a alone; a punctuation pre-token's `[\\r\\n]*` tail also ends at i. No alternative
  can match "\\n" followed by more text on the next line, and the regex has no look-behind, so b's
  pre-tokens are the same alone or after a;
- NFC cannot compose anything with "\\n", so normalizing the pieces separately changes nothing;
- added tokens (matched before pre-tokenization) cannot straddle the cut: none contains a line break.
This is checked structurally from tokenizer.json AND by a self-check that encodes tricky texts both
ways (blank lines with spaces, CRLF, tabs, form feeds, U+2028, combining marks, special-token
literals). Any other tokenizer (SentencePiece, GPT-2's regex, whose `\\s+(?!\\S)` splits "  \\n" from
the next line differently) keeps the uncached path; the reason is logged once and kept in stats().

While typing on one line, the text before the window's last cut (the "head") is unchanged, so it is
looked up whole (one dict lookup instead of one per line); the text after it is encoded afresh.

Memory: entries are kept per document (LRU over documents), each document's entries are LRUs bounded
in count and characters, and a closed document's entries are dropped (Completer.forget).
"""

from __future__ import annotations

import json
import logging
import re
import threading
import weakref
from collections import OrderedDict

log = logging.getLogger(__name__)

# Pre-tokenizer regexes for which the boundary argument above was checked by hand.
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")
PROVEN_PATTERNS = frozenset({QWEN2_PATTERN, LLAMA3_PATTERN})

# Per document: how many texts after a window's last cut (the cursor's line) are remembered, and how long.
MAX_TAILS, MAX_TAIL_CHARS = 4, 4096

# A cut at m.start() + 1: after a "\n" whose next line has a printable ASCII character (never regex
# whitespace) before any further \r or \n. Indented lines qualify too (see the module docstring).
_CUT = re.compile(r"\n[^\r\n!-~]*[!-~]")

# Texts for the self-check: each is encoded whole and as pieces cut at every cut position.
_SELF_CHECK_TEXTS = (
    "import os\n\n\ndef main(argv):\n    x = 1  \n    \n  \n\ty = 2\n    return x\n",
    "a = 1\r\n\r\n  b = 2\r\n\t\r\n    c = 3\r\n",
    "foo  \nbar\n   \n   baz\n\n\n)\n:\n  ,\n",
    "s = 'é'\n ü = 1\n中文 = 2\n  😀 = 3\n\u0301x\n\u1161y\n",
    "<|fim_prefix|>\n<|fim_suffix|>x\n  <|file_sep|>\n<|fim_middle|>y\n  <|endoftext|>  \n",
    "x\x0c\n\x0cy\n\u2028z\n\u00a0w\n\x85v\n \x0b\nu\n",
    "it's\n't\n'll\n123\n4567\n  89\n",
    "x\n   ",
    "def f():\n    pass\n\r\n\r  \n\rq\n",
)


def cut_points(text: str) -> list[int]:
    """Offsets where `text` may be cut without changing its encoding (for a proven tokenizer)."""
    return [m.start() + 1 for m in _CUT.finditer(text)]


def _structure_reason(tokenizer) -> str | None:
    """None when tokenizer.json has the shape the boundary argument needs, else why not."""
    hf = getattr(tokenizer, "tok", None)
    if hf is None or not hasattr(hf, "to_str"):
        return "not a tokenizers-backed tokenizer"
    try:
        spec = json.loads(hf.to_str())
    except Exception as e:  # a tokenizer that cannot serialize itself: do not guess
        return f"cannot read the tokenizer's configuration ({e})"
    if (spec.get("model") or {}).get("type") != "BPE":
        return f"model is {(spec.get('model') or {}).get('type')}, not BPE"
    norm = spec.get("normalizer")
    if norm is not None and norm.get("type") != "NFC":
        return f"normalizer {norm.get('type')} (only none or NFC is proven)"
    if spec.get("truncation") is not None or spec.get("padding") is not None:
        return "truncation or padding is enabled"
    pre = spec.get("pre_tokenizer") or {}
    steps = pre.get("pretokenizers") if pre.get("type") == "Sequence" else [pre]
    if len(steps) == 1 and pre.get("type") == "ByteLevel" and pre.get("use_regex"):
        return "pre-tokenizer is ByteLevel with GPT-2's regex (its \\s+(?!\\S) splits '  \\n' + next line)"
    if len(steps) != 2:
        return f"pre-tokenizer is not Split + ByteLevel ({pre.get('type')})"
    split, byte_level = steps
    pattern = (split.get("pattern") or {}).get("Regex")
    if split.get("type") != "Split" or split.get("behavior") != "Isolated" or split.get("invert"):
        return f"pre-tokenizer starts with {split.get('type')}, not an isolating regex Split"
    if pattern not in PROVEN_PATTERNS:
        return "pre-tokenizer regex is not the Qwen2 / Llama-3 one the line-boundary argument covers"
    if (byte_level.get("type") != "ByteLevel" or byte_level.get("use_regex")
            or byte_level.get("add_prefix_space")):
        return "second pre-tokenizer step is not a plain ByteLevel (no regex, no prefix space)"
    for tok in spec.get("added_tokens") or ():
        content = tok.get("content", "")
        if "\n" in content or "\r" in content or tok.get("lstrip") or tok.get("rstrip") or tok.get("single_word"):
            return f"added token {content!r} contains a line break or strips / matches whole words"
    return None


def self_check(encode) -> str | None:
    """None when cutting at cut_points() reproduces encode() on the tricky texts, else the first failure."""
    for text in _SELF_CHECK_TEXTS:
        whole = encode(text)
        cuts = cut_points(text)
        for c in cuts:
            if encode(text[:c]) + encode(text[c:]) != whole:
                return f"encode(a + b) != encode(a) + encode(b) for a cut at {c} of {text!r}"
        bounds = [0] + cuts + [len(text)]
        pieces = [i for a, b in zip(bounds, bounds[1:]) for i in encode(text[a:b])]
        if pieces != whole:
            return f"line pieces do not reproduce the encoding of {text!r}"
    return None


_QUALIFIED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_QUALIFIED_LOCK = threading.Lock()


def qualify(tokenizer, encode) -> str | None:
    """Once per tokenizer: None when line pieces can be cached exactly, else the reason (logged once)."""
    try:
        with _QUALIFIED_LOCK:
            if tokenizer in _QUALIFIED:
                return _QUALIFIED[tokenizer]
    except TypeError:  # not weak-referenceable: decide again each time (test doubles only)
        pass
    reason = _structure_reason(tokenizer)
    if reason is None:
        reason = self_check(encode)
    if reason is None:
        log.info("prompt token cache: on (line pieces re-encoded only when they change)")
    else:
        log.info("prompt token cache: off, every keystroke encodes its prompt windows whole: %s", reason)
    try:
        with _QUALIFIED_LOCK:
            _QUALIFIED[tokenizer] = reason
    except TypeError:
        pass
    return reason


class DocumentPieces:
    """One document's cache: text -> encode(text) for line pieces (LRU, bounded in entries and in characters),
    for a few whole window heads (everything up to the window's last cut; LRU of `max_heads`, bounded in
    characters too) and for the last MAX_TAILS texts after a last cut. Not thread-safe: the server builds
    prompts on its event loop."""

    def __init__(self, encode, counters: dict, max_entries: int, max_chars: int, max_heads: int = 8):
        self._encode = encode
        self._counters = counters
        self._entries: OrderedDict[str, list[int]] = OrderedDict()
        self._heads: OrderedDict[str, list[int]] = OrderedDict()
        # The last few texts after a last cut (the cursor's line): prefix_window often encodes two candidate
        # windows ending in the same line, and the suffix window's tail repeats while typing.
        self._tails: OrderedDict[str, list[int]] = OrderedDict()
        self._chars = self._head_chars = 0
        self.max_entries, self.max_chars, self.max_heads = max_entries, max_chars, max_heads

    def __len__(self) -> int:
        return len(self._entries) + len(self._heads) + len(self._tails)

    @property
    def chars(self) -> int:
        return self._chars + self._head_chars + sum(len(t) for t in self._tails)

    def _piece(self, piece: str, keep: bool) -> list[int]:
        ids = self._entries.get(piece)
        if ids is not None:
            self._entries.move_to_end(piece)
            self._counters["hits"] += 1
            self._counters["reused_chars"] += len(piece)
            return ids
        ids = self._fresh(piece)
        if keep and len(piece) <= self.max_chars:
            self._entries[piece] = ids
            self._chars += len(piece)
            while len(self._entries) > self.max_entries or self._chars > self.max_chars:
                old, _ = self._entries.popitem(last=False)
                self._chars -= len(old)
        return ids

    def _from_pieces(self, text: str, keep_first: bool) -> list[int]:
        out: list[int] = []
        a = 0
        for i, b in enumerate(cut_points(text)):
            out += self._piece(text[a:b], keep_first or i > 0)
            a = b
        out += self._piece(text[a:], keep_first or a > 0)
        return out

    def encode(self, text: str, keep_first: bool = True) -> list[int]:
        """encode(text), from cached encodings. The text after its last cut (it ends at the cursor or at a
        window edge that moves with it) is always encoded afresh and not stored. The head before it is
        looked up whole first (unchanged while typing on one line: one lookup instead of one per line),
        then line by line. keep_first=False: the first line piece is not stored (the suffix window's
        starts at the cursor)."""
        last = _last_cut(text)
        if last is None:
            return self._fresh(text)
        head = text[:last]
        ids = self._heads.get(head)
        if ids is not None:
            self._heads.move_to_end(head)
            self._counters["hits"] += 1
            self._counters["reused_chars"] += len(head)
        else:
            ids = self._from_pieces(head, keep_first)
            if len(head) <= self.max_chars:
                self._heads[head] = ids
                self._head_chars += len(head)
                while len(self._heads) > self.max_heads or self._head_chars > self.max_chars:
                    old, _ = self._heads.popitem(last=False)
                    self._head_chars -= len(old)
        return ids + self._tail(text[last:])

    def _tail(self, tail: str) -> list[int]:
        ids = self._tails.get(tail)
        if ids is not None:
            self._counters["hits"] += 1
            self._counters["reused_chars"] += len(tail)
            return ids
        ids = self._fresh(tail)
        if len(tail) <= MAX_TAIL_CHARS:
            self._tails[tail] = ids
            if len(self._tails) > MAX_TAILS:
                self._tails.popitem(last=False)
        return ids

    def _fresh(self, text: str) -> list[int]:
        self._counters["misses"] += 1
        self._counters["encoded_chars"] += len(text)
        return self._encode(text)


def _last_cut(text: str) -> int | None:
    """The last of cut_points(text), found from the end (the cursor's line is usually the last line)."""
    pos = text.rfind("\n")
    for _ in range(64):
        if pos < 0:
            return None
        if _CUT.match(text, pos):
            return pos + 1
        pos = text.rfind("\n", 0, pos)
    cuts = cut_points(text)  # a long run of blank lines: one forward scan instead
    return cuts[-1] if cuts else None


class PromptTokenCache:
    """Per-document caches of line-piece encodings for one tokenizer at a time (the runtime's)."""

    def __init__(self, max_docs: int = 8, max_entries: int = 2048, max_chars: int = 256 * 1024):
        self.max_docs, self.max_entries, self.max_chars = max_docs, max_entries, max_chars
        self._docs: OrderedDict[object, DocumentPieces] = OrderedDict()
        self._tokenizer_ref = None
        self._reason: str | None = "no tokenizer seen yet"
        # hits / misses: lookups answered from the cache / texts handed to the tokenizer (the text after the
        # last cut always is); reused_chars / encoded_chars: how much text each side covered.
        self.counters = {"hits": 0, "misses": 0, "reused_chars": 0, "encoded_chars": 0, "fallbacks": 0}

    def _bind(self, tokenizer, encode) -> None:
        current = self._tokenizer_ref() if self._tokenizer_ref is not None else None
        if current is tokenizer:
            return
        self._docs.clear()  # a new model: old ids mean nothing
        self._reason = qualify(tokenizer, encode)
        try:
            self._tokenizer_ref = weakref.ref(tokenizer)
        except TypeError:
            self._tokenizer_ref = lambda t=tokenizer: t

    def pieces(self, tokenizer, encode, doc) -> DocumentPieces | None:
        """The cache of document `doc` (None: one shared anonymous slot), or None when this tokenizer
        cannot be cached exactly (counted in stats()['fallbacks'])."""
        self._bind(tokenizer, encode)
        if self._reason is not None:
            self.counters["fallbacks"] += 1
            return None
        d = self._docs.get(doc)
        if d is None:
            d = self._docs[doc] = DocumentPieces(encode, self.counters, self.max_entries, self.max_chars)
            while len(self._docs) > self.max_docs:
                self._docs.popitem(last=False)
        else:
            self._docs.move_to_end(doc)
        return d

    def forget(self, doc) -> None:
        """The document closed: drop its entries."""
        self._docs.pop(doc, None)

    def stats(self) -> dict:
        return {"enabled": self._reason is None, "reason": self._reason, **self.counters,
                "documents": len(self._docs), "entries": sum(len(d) for d in self._docs.values()),
                "chars": sum(d.chars for d in self._docs.values())}
