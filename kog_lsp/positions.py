"""Exact LSP position <-> string offset conversion for utf-8, utf-16 and utf-32 position encodings.

LSP line terminators are exactly "\r\n", "\r" and "\n" (str.splitlines also splits on \x0b, \x1c,
U+2028 ... which editors do not treat as line breaks, so it cannot be used here). Offsets are Python
string indices (code points). A `character` past the end of its line is clamped to the line end, as the
spec requires; a position inside a surrogate pair / UTF-8 sequence rounds down to the character start.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass

UTF8, UTF16, UTF32 = "utf-8", "utf-16", "utf-32"
LINE_BREAK = re.compile(r"\r\n|\r|\n")  # the LSP line terminators (textmap uses it too)


class PositionError(ValueError):
    """A position that does not exist in the document (line past the last line, negative values)."""


def units(s: str, encoding: str) -> int:
    """Length of `s` in code units of the position encoding."""
    if encoding == UTF32:
        return len(s)
    if encoding == UTF8:
        return len(s.encode("utf-8", "surrogatepass"))
    # UTF-16: one unit per BMP char, two per astral char.
    return len(s) + sum(1 for c in s if ord(c) > 0xFFFF)


def _char_index(line: str, col_units: int, encoding: str) -> int:
    """Code-point index in `line` (no terminator) for a column in code units; clamps to the line end."""
    if encoding == UTF32:
        return min(col_units, len(line))
    if encoding == UTF16 and line.isascii():
        return min(col_units, len(line))
    used = 0
    for i, c in enumerate(line):
        w = units(c, encoding)
        if used + w > col_units:
            return i  # inside a multi-unit char (or exactly at it): round down to its start
        used += w
    return len(line)


def line_starts(text: str) -> list[int]:
    """Offsets where each line begins; always at least [0]. A trailing newline opens an empty last line."""
    return [0] + [m.end() for m in LINE_BREAK.finditer(text)]


def update_line_starts(old_starts: list[int], new_text: str, a: int, b: int, inserted: int) -> list[int]:
    """Line starts of `new_text` = old text with [a, b) replaced by `inserted` characters, from the old
    text's starts in O(len(inserted) + lines after the edit) instead of rescanning the whole text.

    A start s depends only on the characters at s-1 and s ("\n", or "\r" not followed by "\n"), so starts
    before a-1 stay, starts past the edit shift by the length change, and only the window around the
    replaced text is rescanned (an edit can join or split a "\r\n" pair at its edges).
    """
    delta = inserted - (b - a)
    end_new = a + inserted  # end of the inserted text in new_text
    lo = max(1, bisect.bisect_right(old_starts, a - 1))  # old starts <= a-1 (and 0) are unchanged
    hi = max(lo, bisect.bisect_left(old_starts, b + 2))  # old starts >= b+2 only shift
    window = []
    n = len(new_text)
    for i in range(max(a - 1, 0), min(end_new + 1, n)):
        c = new_text[i]
        if c == "\n" or (c == "\r" and (i + 1 >= n or new_text[i + 1] != "\n")):
            s = i + 1
            if a <= s <= end_new + 1:
                window.append(s)
    return old_starts[:lo] + window + [s + delta for s in old_starts[hi:]]


def line_content_end(text: str, starts: list[int], line: int) -> int:
    """Offset of the end of `line`'s content (before its terminator)."""
    if line + 1 < len(starts):
        end = starts[line + 1]
        if text[end - 2 : end] == "\r\n":
            return end - 2
        return end - 1
    return len(text)


def offset_at(text: str, line: int, character: int, encoding: str, *, strict: bool = False,
              starts: list[int] | None = None) -> int:
    """String offset of an LSP position.

    strict=True raises PositionError for a line past the last line (requests); otherwise such a
    position clamps to the end of the text (what editors expect for didChange ranges).
    """
    if line < 0 or character < 0:
        raise PositionError(f"negative position ({line}, {character})")
    starts = starts if starts is not None else line_starts(text)
    if line >= len(starts):
        if strict:
            raise PositionError(f"line {line} is past the last line {len(starts) - 1}")
        return len(text)
    start = starts[line]
    end = line_content_end(text, starts, line)
    return start + _char_index(text[start:end], character, encoding)


def position_at(text: str, offset: int, encoding: str, starts: list[int] | None = None) -> tuple[int, int]:
    """LSP (line, character) of a string offset (clamped into [0, len(text)])."""
    offset = max(0, min(offset, len(text)))
    starts = starts if starts is not None else line_starts(text)
    lo, hi = 0, len(starts) - 1
    while lo < hi:  # last line start <= offset
        mid = (lo + hi + 1) // 2
        if starts[mid] <= offset:
            lo = mid
        else:
            hi = mid - 1
    return lo, units(text[starts[lo] : offset], encoding)


def change_span(text: str, start: tuple[int, int], end: tuple[int, int], encoding: str,
                starts: list[int] | None = None) -> tuple[int, int]:
    """String offsets [a, b) of a didChange range given in LSP positions (lines past the end clamp)."""
    starts = starts if starts is not None else line_starts(text)
    a = offset_at(text, start[0], start[1], encoding, starts=starts)
    b = offset_at(text, end[0], end[1], encoding, starts=starts)
    if b < a:  # reversed range from a sloppy client: treat it as the same span
        a, b = b, a
    return a, b


def apply_change(text: str, start: tuple[int, int], end: tuple[int, int], new_text: str, encoding: str) -> str:
    """Replace the range [start, end) given in LSP positions with new_text."""
    a, b = change_span(text, start, end, encoding)
    return text[:a] + new_text + text[b:]


@dataclass(frozen=True)
class Cursor:
    """A resolved cursor: offsets into the text plus the pieces of its line the features need."""

    offset: int
    line: int
    line_start: int  # offset of the first char of the cursor's line
    line_end: int  # offset of the end of the line's content

    @staticmethod
    def resolve(text: str, line: int, character: int, encoding: str, starts: list[int] | None = None) -> "Cursor":
        starts = starts if starts is not None else line_starts(text)
        off = offset_at(text, line, character, encoding, strict=True, starts=starts)
        return Cursor(off, line, starts[line], line_content_end(text, starts, line))
