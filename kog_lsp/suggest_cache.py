"""Suggestion cache: the user typing into ghost text gets the rest of it with no engine call.

An entry remembers the document around the cursor when the suggestion was made. A later request hits
when the text after its cursor is unchanged and the text before it is the old text plus a prefix of the
suggestion (what the user typed so far); the answer is the rest of the suggestion.

Entries keep only a window around the cursor (plus the lengths of both sides), so a large file costs
a few KiB per entry, not two copies of the file. An edit far from the cursor that keeps both lengths
and both windows identical could reuse a suggestion made before it; the answer is still a plausible
suggestion, and the next real edit near the cursor misses the cache.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

WINDOW = 4096  # characters kept on each side of the cursor


@dataclass(frozen=True)
class CacheEntry:
    uri: str
    before_len: int
    before_tail: str  # before[-WINDOW:]
    after_len: int
    after_head: str  # after[:WINDOW]
    text: str
    replace_to_eol: bool


class SuggestionCache:
    def __init__(self, max_entries: int = 128):
        self._entries: OrderedDict[int, CacheEntry] = OrderedDict()
        self._next = 0
        self.max_entries = max_entries

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, uri: str, before: str, after: str, text: str, replace_to_eol: bool) -> None:
        entry = CacheEntry(uri, len(before), before[-WINDOW:], len(after), after[:WINDOW], text, replace_to_eol)
        # One entry per cursor state: a newer suggestion at the same spot replaces the old one.
        for k, e in list(self._entries.items()):
            if (e.uri, e.before_len, e.before_tail, e.after_len, e.after_head) == (
                    uri, entry.before_len, entry.before_tail, entry.after_len, entry.after_head):
                del self._entries[k]
        self._entries[self._next] = entry
        self._next += 1
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)

    def lookup(self, uri: str, before: str, after: str) -> tuple[str, bool] | None:
        """(rest of the suggestion, replace_to_eol) or None. Most recent entries are tried first."""
        for k in reversed(list(self._entries)):
            e = self._entries[k]
            if e.uri != uri or e.after_len != len(after) or len(before) < e.before_len:
                continue
            typed_len = len(before) - e.before_len
            if typed_len >= len(e.text) or not e.text.startswith(before[e.before_len:]):
                continue
            if after[:WINDOW] != e.after_head:
                continue
            if before[max(0, e.before_len - WINDOW) : e.before_len] != e.before_tail:
                continue
            rest = e.text[typed_len:]
            if not rest.strip():
                continue
            self._entries.move_to_end(k)
            return rest, e.replace_to_eol
        return None

    def forget(self, uri: str) -> None:
        for k, e in list(self._entries.items()):
            if e.uri == uri:
                del self._entries[k]
