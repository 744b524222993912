"""Plain text geometry for review and refactor: token -> character spans, and which characters sit inside
strings or comments. (Character offsets -> LSP positions: kog_lsp.positions.)
"""

from __future__ import annotations

import bisect
import io
import logging
import re
import tokenize
from typing import Iterable, Sequence

from kog_lsp.positions import LINE_BREAK

log = logging.getLogger(__name__)


# ---------------------------------------------------------------- tokens -> characters


def token_char_spans(tokenizer, ids: Sequence[int]) -> list[tuple[int, int]]:
    """Character span [start, end) of every token in the text that decoding `ids` yields.

    Cumulative stream decode: each push returns the newly completed characters, so a token that only holds
    the first bytes of a multi-byte character gets an empty span and the token completing it owns the
    character. Callers check the concatenation against the document (see `spans_match`).
    """
    dec = tokenizer.stream_decoder()
    spans: list[tuple[int, int]] = []
    pos = 0
    for i in ids:
        n = len(dec.push(int(i)))
        spans.append((pos, pos + n))
        pos += n
    tail = len(dec.flush())
    if tail and spans:
        s, e = spans[-1]
        spans[-1] = (s, e + tail)
    return spans


def spans_match(spans: Sequence[tuple[int, int]], text: str) -> bool:
    """True when the spans tile `text` exactly (decode(encode(text)) == text for this tokenizer)."""
    return (spans[-1][1] if spans else 0) == len(text)


# ---------------------------------------------------------------- strings and comments

# Per language family: line-comment markers, block-comment pairs, string quotes (triple quotes first).
_PY = (("#",), (), ('"""', "'''", '"', "'"))
_C = (("//",), (("/*", "*/"),), ('"', "'", "`"))
_HASH = (("#",), (), ('"', "'"))
_DASH = (("--",), (), ('"', "'"))
_GENERIC = (("//", "#"), (("/*", "*/"),), ('"', "'"))
_LANG = {
    "python": _PY,
    **{k: _C for k in ("c", "cpp", "java", "javascript", "typescript", "javascriptreact", "typescriptreact",
                       "go", "rust", "csharp", "kotlin", "swift", "scala", "php", "dart", "zig")},
    **{k: _HASH for k in ("shellscript", "sh", "bash", "ruby", "perl", "r", "yaml", "toml", "makefile",
                          "dockerfile", "cmake", "elixir", "julia")},
    **{k: _DASH for k in ("lua", "sql", "haskell", "elm", "ada")},
}
_EXT_LANG = {".py": "python", ".pyi": "python", ".c": "c", ".h": "c", ".cc": "cpp", ".cpp": "cpp", ".hpp": "cpp",
             ".cu": "cpp", ".cuh": "cpp", ".java": "java", ".js": "javascript", ".mjs": "javascript",
             ".ts": "typescript", ".tsx": "typescriptreact", ".jsx": "javascriptreact", ".go": "go", ".rs": "rust",
             ".sh": "sh", ".rb": "ruby", ".lua": "lua", ".sql": "sql", ".hs": "haskell", ".yaml": "yaml",
             ".yml": "yaml", ".toml": "toml", ".kt": "kotlin", ".swift": "swift", ".cs": "csharp", ".php": "php"}


# Prose and data rather than code: review (the model's surprise at a token) flags wording and values there, not bugs, so
# it skips these languages; completions still run in them.
PROSE_LANGUAGES = frozenset({"markdown", "plaintext", "text", "restructuredtext", "asciidoc", "latex", "tex", "bibtex",
                             "git-commit", "git-rebase", "log", "csv", "tsv", "json", "jsonc", "jsonl"})


def language_of(uri: str, language_id: str | None = None) -> str:
    """Language id from the client (didOpen) or, failing that, from the file extension."""
    if language_id:
        return language_id.lower()
    path = uri.split("?", 1)[0].split("#", 1)[0]
    dot = path.rfind(".")
    return _EXT_LANG.get(path[dot:].lower(), "") if dot >= 0 else ""


def scan_strings_and_comments(text: str, language: str, start: int = 0) -> list[tuple[int, int]]:
    """Heuristic scanner: [start, end) spans of comments and string literals from `start` on.

    Unterminated single-line strings end at the line break; an unterminated triple-quoted string, template
    string or block comment runs to the end of the text (that is how the half-typed code reads).
    """
    line_comments, blocks, quotes = _LANG.get(language, _GENERIC)
    spans: list[tuple[int, int]] = []
    i, n = start, len(text)
    while i < n:
        c = text[i]
        if c in "\r\n \t":
            i += 1
            continue
        hit = False
        for marker in line_comments:
            if text.startswith(marker, i):
                m = LINE_BREAK.search(text, i)
                end = m.start() if m else n
                spans.append((i, end))
                i, hit = end, True
                break
        if hit:
            continue
        for open_, close in blocks:
            if text.startswith(open_, i):
                end = text.find(close, i + len(open_))
                end = n if end < 0 else end + len(close)
                spans.append((i, end))
                i, hit = end, True
                break
        if hit:
            continue
        for q in quotes:
            if text.startswith(q, i):
                end = _string_end(text, i + len(q), q)
                spans.append((i, end))
                i, hit = end, True
                break
        if not hit:
            i += 1
    return spans


def _string_end(text: str, j: int, quote: str) -> int:
    multiline = len(quote) == 3 or quote == "`"
    n = len(text)
    while j < n:
        c = text[j]
        if c == "\\":
            j += 2
            continue
        if text.startswith(quote, j):
            return j + len(quote)
        if not multiline and c in "\r\n":
            return j
        j += 1
    return n


_PY_STRINGISH = {tokenize.STRING, tokenize.COMMENT}
for _name in ("FSTRING_START", "FSTRING_MIDDLE", "FSTRING_END"):  # Python >= 3.12 splits f-strings
    if hasattr(tokenize, _name):
        _PY_STRINGISH.add(getattr(tokenize, _name))


def tokenize_line_starts(text: str) -> list[int]:
    """Offsets where the rows of Python's tokenize begin: it reads lines split on "\n" only (not the LSP
    terminators of kog_lsp.positions), and its columns are characters within those rows."""
    return [0] + [m.end() for m in re.finditer("\n", text)]


def _python_spans(text: str) -> tuple[list[tuple[int, int]], str | None]:
    """Python's own tokenizer; on incomplete code it keeps what it read and the scanner does the rest."""
    starts = tokenize_line_starts(text)
    spans: list[tuple[int, int]] = []
    last_end = 0
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            (sr, sc), (er, ec) = tok.start, tok.end
            if sr - 1 >= len(starts) or er - 1 >= len(starts):
                break
            s, e = starts[sr - 1] + sc, starts[er - 1] + ec
            if tok.type in _PY_STRINGISH and e > s:
                spans.append((s, e))
            if tok.type != tokenize.ENDMARKER:
                last_end = max(last_end, e)
        return spans, None
    except (tokenize.TokenError, SyntaxError) as exc:  # IndentationError is a SyntaxError
        reason = f"{type(exc).__name__}: {exc}"
    return spans + scan_strings_and_comments(text, "python", last_end), reason


def strings_and_comments(text: str, language: str) -> list[tuple[int, int]]:
    """Sorted, non-overlapping [start, end) spans of string literals and comments."""
    if language == "python":
        spans, reason = _python_spans(text)
        if reason:
            log.debug("python tokenize stopped (%s); scanner covers the rest", reason)
    else:
        spans = scan_strings_and_comments(text, language)
    return merge_spans(spans)


def merge_spans(spans: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """Sorted, non-overlapping union of [start, end) spans."""
    merged: list[tuple[int, int]] = []
    for s, e in sorted(spans):
        if merged and s < merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], e))
        else:
            merged.append((s, e))
    return merged


_IMPORT_LINE = re.compile(r"^[ \t]*(import\b|from\b|use\b|using\b|#\s*include\b|package\b|require\b).*$", re.M)


def declaration_spans(text: str, language: str) -> list[tuple[int, int]]:
    """What review leaves alone besides strings/comments: imports and (Python) names being bound."""
    if language == "python":
        return python_binding_spans(text)
    return [(m.start(), m.end()) for m in _IMPORT_LINE.finditer(text)]


class SpanSet:
    """Membership test for sorted non-overlapping spans."""

    def __init__(self, spans: Iterable[tuple[int, int]]):
        self.spans = list(spans)
        self.starts = [s for s, _ in self.spans]

    def __contains__(self, offset: int) -> bool:
        k = bisect.bisect_right(self.starts, offset) - 1
        return k >= 0 and offset < self.spans[k][1]


# ---------------------------------------------------------------- Python names that are bound, not used

_SKIP_TYPES = {tokenize.NL, tokenize.COMMENT, tokenize.INDENT, tokenize.DEDENT, tokenize.ENCODING}
_OPEN, _CLOSE = "([{", ")]}"


def _logical_lines(text: str):
    """Python tokens grouped by logical line as (type, string, start_offset, end_offset); stops quietly where
    tokenize gives up on incomplete code."""
    starts = tokenize_line_starts(text)
    line: list[tuple[int, str, int, int]] = []
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type in _SKIP_TYPES:
                continue
            if tok.type in (tokenize.NEWLINE, tokenize.ENDMARKER):
                if line:
                    yield line
                line = []
                continue
            (sr, sc), (er, ec) = tok.start, tok.end
            line.append((tok.type, tok.string, starts[sr - 1] + sc, starts[er - 1] + ec))
    except (tokenize.TokenError, SyntaxError, IndexError):
        pass
    if line:
        yield line


def python_binding_spans(text: str) -> list[tuple[int, int]]:
    """Spans review leaves alone in Python: import statements, and names being bound (def/class names,
    parameters, assignment / for / with-as / except-as / global targets, walrus). A new name is a free choice
    the model cannot predict; a *use* of a name is what review checks."""
    spans: list[tuple[int, int]] = []
    for line in _logical_lines(text):
        first = line[0][1]
        if first in ("import", "from") or (first == "@"):
            if first != "@":
                spans.append((line[0][2], line[-1][3]))
            continue
        depth = 0
        eq_at = None  # index of the first top-level "=" (an assignment statement)
        for k, (ty, s, a, b) in enumerate(line):
            if s in _OPEN and ty == tokenize.OP:
                depth += 1
            elif s in _CLOSE and ty == tokenize.OP:
                depth -= 1
            elif s == "=" and depth == 0 and eq_at is None:
                eq_at = k
        if eq_at is not None:
            _bind_targets(line[:eq_at], spans)
        elif len(line) > 1 and line[0][0] == tokenize.NAME and line[1][1] == ":" and first not in _KEYWORD_HEADS:
            spans.append((line[0][2], line[0][3]))  # annotated declaration `name: type`
        elif len(line) > 3 and line[0][1] == "self" and line[1][1] == "." and line[3][1] == ":":
            spans.append((line[2][2], line[2][3]))  # `self.name: type`
        _bind_keywords(line, spans)
    return spans


_KEYWORD_HEADS = {"else", "try", "finally", "elif", "if", "while", "for", "with", "except", "def", "class",
                  "lambda", "match", "case", "async", "return"}


def _bind_targets(target: list, spans: list) -> None:
    depth = 0
    for k, (ty, s, a, b) in enumerate(target):
        if s == ":" and depth == 0:
            return  # `name: annotation = value`: the annotation is a use
        if ty == tokenize.OP and s in _OPEN:
            depth += 1
        elif ty == tokenize.OP and s in _CLOSE:
            depth -= 1
        elif ty == tokenize.NAME and (depth == 0 or (k and target[k - 1][1] in "([,")):
            nxt = target[k + 1][1] if k + 1 < len(target) else ""
            if nxt in ("", ",", ":", ")", "]", "=") or (k and target[k - 1][1] == "."):
                if nxt != "." and (k == 0 or target[k - 1][1] != "["):
                    spans.append((a, b))


def _bind_keywords(line: list, spans: list) -> None:
    n = len(line)
    for k, (ty, s, a, b) in enumerate(line):
        if ty != tokenize.NAME:
            if s == ":=" and k and line[k - 1][0] == tokenize.NAME:
                spans.append((line[k - 1][2], line[k - 1][3]))
            continue
        nxt = line[k + 1] if k + 1 < n else None
        if s in ("def", "class", "as") and nxt is not None and nxt[0] == tokenize.NAME:
            spans.append((nxt[2], nxt[3]))
        if s == "def":
            _bind_params(line, k + 2, spans)
        elif s == "lambda":
            _bind_params(line, k + 1, spans, until=":")
        elif s in ("global", "nonlocal"):
            spans.extend((t[2], t[3]) for t in line[k + 1:] if t[0] == tokenize.NAME)
        elif s == "for":
            depth = 0
            for t in line[k + 1:]:
                if t[1] == "in" and depth == 0:
                    break
                depth += t[1] in _OPEN
                depth -= t[1] in _CLOSE
                if t[0] == tokenize.NAME:
                    spans.append((t[2], t[3]))


def _bind_params(line: list, k: int, spans: list, until: str | None = None) -> None:
    """Parameter names: for a def, line[k] is the "(" after its name and the list ends at the matching ")";
    for a lambda, line[k] is the first token after `lambda` and the list ends at the ":" at depth 0."""
    if until is None:
        if k >= len(line) or line[k][1] != "(":
            return
        k += 1
    depth, prev = 0, ","
    for ty, s, a, b in line[k:]:
        if ty == tokenize.OP and s in _OPEN:
            depth += 1
        elif ty == tokenize.OP and s in _CLOSE:
            if depth == 0:
                return
            depth -= 1
        elif until is not None and s == until and depth == 0:
            return
        elif ty == tokenize.NAME and depth == 0 and prev in (",", "*", "**", "/"):
            spans.append((a, b))
        prev = s
