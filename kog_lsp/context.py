"""Chunks of the other open documents, placed before the FIM part of the prompt.

Order and truncation are deterministic (documents sorted by URI, each truncated to its first tokens),
so consecutive prompts share the chunk tokens and the engine's prefix cache keeps hitting. Encoded
chunks are memoised per (uri, version, budget) because the same documents recur on every keystroke.
"""

from __future__ import annotations

from collections import OrderedDict
from urllib.parse import unquote, urlparse

from kog_lsp.fim import safe_encode


def display_path(uri: str, root_uri: str | None) -> str:
    """Path shown after <file_sep>: relative to the workspace root when inside it."""
    path = unquote(urlparse(uri).path) if "://" in uri else uri
    if root_uri:
        root = unquote(urlparse(root_uri).path).rstrip("/") + "/"
        if path.startswith(root):
            return path[len(root):]
    return path.lstrip("/") or uri


class ContextBuilder:
    def __init__(self, max_entries: int = 64):
        self._memo: OrderedDict[tuple, list[int]] = OrderedDict()
        self._max = max_entries

    def _chunk(self, tokenizer, file_sep: int, uri: str, version, text: str, path: str, budget: int) -> list[int]:
        key = (uri, version, len(text), budget, path)
        hit = self._memo.get(key)
        if hit is not None:
            self._memo.move_to_end(key)
            return hit
        # Encode a bounded head of the text (never more than ~8 chars per token of budget).
        encode = safe_encode(tokenizer)
        head_ids = encode(path + "\n")
        body = encode(text[: budget * 8])
        room = budget - 1 - len(head_ids)
        chunk = [file_sep] + head_ids + body[: max(0, room)] if room > 0 else []
        if chunk and not text.endswith("\n") and len(body) <= room:
            chunk += encode("\n")
        self._memo[key] = chunk
        if len(self._memo) > self._max:
            self._memo.popitem(last=False)
        return chunk

    def build(self, tokenizer, documents, current_uri: str, budget: int, root_uri: str | None = None) -> list[int]:
        """documents: iterable of (uri, version, text). Returns the concatenated chunk ids (<= budget)."""
        fim = tokenizer.fim
        if budget <= 0 or fim is None or fim.file_sep is None:
            return []
        current = unquote(current_uri)  # clients may quote the same URI differently across messages
        # `text and not text.isspace()` == `bool(text.strip())` without copying every open document on every
        # keystroke (isspace stops at the first non-blank character).
        others = sorted((d for d in documents if unquote(d[0]) != current and d[2] and not d[2].isspace()),
                        key=lambda d: d[0])
        if not others:
            return []
        out: list[int] = []
        # Each document may take an equal share, so one huge file cannot starve the rest.
        share = max(16, budget // len(others))
        for uri, version, text in others:
            room = min(share, budget - len(out))
            if room < 16:
                break
            out += self._chunk(tokenizer, fim.file_sep, uri, version, text, display_path(uri, root_uri), room)
        return out
