"""Refactor code actions: "Rewrite selection" / "Rewrite this block" (regenerate a region by FIM with the code
around it, several candidates) and "Complete this block" (generate at the cursor until the block closes).

Listing is instant (`list_actions` only computes offsets); the generation happens on codeAction/resolve
(`run_refactor`, on the engine worker thread) and the resulting WorkspaceEdit is pinned to the document
version the action was listed for. Plain logic: no pygls here.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import asdict, dataclass

from lsprotocol import types

from kog_lsp import positions
from kog_lsp.fim import build_prompt, stop_ids_for
from kog_lsp.review import lsp_range, versioned_edit

log = logging.getLogger(__name__)

DATA_TAG = "kog.refactor"
REWRITE, COMPLETE = "rewrite", "complete"
CANDIDATES = 3  # rewrite alternatives listed: 1 greedy + 2 sampled
CANDIDATE_TEMPERATURE = 0.8
CANDIDATE_TOP_P = 0.95
MAX_NEW_TOKENS = 512


class RefactorFailed(Exception):
    """The generation ran but produced nothing usable (message says why)."""


@dataclass(frozen=True)
class RefactorRequest:
    op: str  # REWRITE | COMPLETE
    uri: str
    version: int | None
    start: int  # character offsets into the document at `version`; start == end for COMPLETE
    end: int
    candidate: int = 0

    def to_data(self) -> dict:
        return {"tag": DATA_TAG, **asdict(self)}

    @classmethod
    def from_data(cls, data) -> "RefactorRequest | None":
        if not isinstance(data, dict) or data.get("tag") != DATA_TAG:
            return None
        try:
            return cls(op=str(data["op"]), uri=str(data["uri"]), version=data["version"], start=int(data["start"]),
                       end=int(data["end"]), candidate=int(data.get("candidate", 0)))
        except (KeyError, TypeError, ValueError):
            return None


# ---------------------------------------------------------------- blocks by indentation


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" \t"))


class _Lines:
    """Line k's content (no terminator), cut out when first asked: codeAction comes on every cursor move and the
    block walks read the lines around the cursor, not all lines of a possibly huge document (10 MB of ordinary
    code: 0.1 ms instead of 0.7 s; a file that is one long paragraph is walked whole either way)."""

    def __init__(self, text: str, starts: list[int]):
        self.text, self.starts = text, starts
        self._memo: dict[int, str] = {}  # the walks read most lines two or three times

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, k: int) -> str:
        line = self._memo.get(k)
        if line is None:
            if not 0 <= k < len(self.starts):
                raise IndexError(k)
            end = self.starts[k + 1] if k + 1 < len(self.starts) else len(self.text)
            # A line holds no "\r" or "\n" but its terminator ("\r\n", "\r" or "\n"), so rstrip cuts exactly that.
            line = self._memo[k] = self.text[self.starts[k]:end].rstrip("\r\n")
        return line


def _lines(text: str, starts: list[int] | None = None) -> tuple[list[int], _Lines]:
    starts = starts if starts is not None else positions.line_starts(text)
    return starts, _Lines(text, starts)


def _is_header(line: str) -> bool:
    s = line.split("#", 1)[0].rstrip() if line.lstrip()[:1] != "#" else ""
    return s.endswith(":") or s.endswith("{")


def current_block(text: str, offset: int, starts: list[int] | None = None) -> tuple[int, int] | None:
    """[start, end) of the body of the innermost block around `offset` (whole lines, end after the last
    non-blank line's break). On a header line (ending in ':' or '{') it is that header's body; at top level
    it is the paragraph (run of non-blank lines) around the cursor. None when there is nothing to take.
    `starts`: line starts of `text` when the caller has them."""
    starts, lines = _lines(text, starts)
    cur = positions.position_at(text, offset, "utf-32", starts)[0]
    n = len(lines)

    def blank(k: int) -> bool:
        return not lines[k].strip()

    k = cur
    while k >= 0 and blank(k):
        k -= 1
    if k < 0:
        return None
    if _is_header(lines[k]):
        base = _indent(lines[k])
        first = k + 1
        while first < n and blank(first):
            first += 1
        if first >= n or _indent(lines[first]) <= base:
            return None  # header without a body yet: nothing to rewrite ("complete" is the action for it)
        level = _indent(lines[first])
        top = first
    else:
        level = _indent(lines[k])
        top = k
        while top - 1 >= 0 and (blank(top - 1) or _indent(lines[top - 1]) >= level):
            if level == 0 and blank(top - 1):
                break  # top level: stop at a blank line (one paragraph)
            top -= 1
        while top < k and blank(top):
            top += 1
    bottom = top
    j = top
    while j + 1 < n and (blank(j + 1) or _indent(lines[j + 1]) >= level):
        if level == 0 and blank(j + 1):
            break
        j += 1
        if not blank(j):
            bottom = j
    end = starts[bottom + 1] if bottom + 1 < n else len(text)
    return starts[top], end


def block_indent_at(text: str, offset: int) -> int:
    """Smallest indentation a generated line may have and still belong to the block being completed:
    the cursor line's indentation, or one more than it when the line (up to the cursor) opens a block."""
    starts, lines = _lines(text)
    cur = positions.position_at(text, offset, "utf-32", starts)[0]
    k = cur
    while k >= 0 and not lines[k].strip():
        k -= 1
    if k < 0:
        return 0
    line = lines[k][: offset - starts[k]] if k == cur else lines[k]
    if not line.strip():
        line = lines[k]
    return _indent(line) + 1 if _is_header(line) else _indent(line)


# ---------------------------------------------------------------- listing


def kind_allowed(kind: str, only) -> bool:
    if not only:
        return True
    return any(kind == o or kind.startswith(str(o) + ".") for o in (getattr(x, "value", x) for x in only))


def list_actions(uri: str, version: int | None, text: str, start: int, end: int, only=None,
                 candidates: int = CANDIDATES, starts: list[int] | None = None) -> list[types.CodeAction]:
    """Unresolved refactor actions for a selection [start, end) (or the cursor when start == end). `starts`: line
    starts of `text` when the caller has them (the document's cached ones)."""
    out: list[types.CodeAction] = []
    rewrite_kind = types.CodeActionKind.RefactorRewrite.value
    if start > end:
        start, end = end, start
    if start != end and text[start:end].strip():
        region, what = (start, end), "selection"
    else:
        region, what = current_block(text, start, starts), "this block"
    if region is not None and kind_allowed(rewrite_kind, only):
        for c in range(candidates):
            title = f"Kog: rewrite {what}" + (f" (alternative {c + 1})" if c else "")
            req = RefactorRequest(REWRITE, uri, version, region[0], region[1], c)
            out.append(types.CodeAction(title=title, kind=rewrite_kind, data=req.to_data()))
    if kind_allowed(types.CodeActionKind.Refactor.value, only):
        req = RefactorRequest(COMPLETE, uri, version, end, end, 0)
        out.append(types.CodeAction(title="Kog: complete this block", kind=types.CodeActionKind.Refactor.value,
                                    data=req.to_data()))
    return out


# ---------------------------------------------------------------- generation (worker thread)


def trim_at_suffix(generated: str, suffix: str) -> str:
    """Cut the generation where it starts repeating the code after the region (its first non-blank line)."""
    first = next((ln.strip() for ln in suffix.splitlines() if ln.strip()), "")
    if len(first) < 2:
        return generated
    pos = 0
    for ln in generated.splitlines(keepends=True):
        if ln.strip() == first and pos > 0:
            return generated[:pos]
        pos += len(ln)
    return generated


def trim_to_block(generated: str, min_indent: int) -> str:
    """Keep the generation up to the first complete line that dedents out of the block."""
    pos = 0
    lines = generated.splitlines(keepends=True)
    for k, ln in enumerate(lines):
        if k > 0 and ln.strip() and _indent(ln) < min_indent:
            return generated[:pos]
        pos += len(ln)
    return generated


def sampling_for(candidate: int) -> dict:
    """Candidate 0 is greedy (the model's best guess); the others are seeded samples (reproducible)."""
    if candidate <= 0:
        return {"temperature": 0.0, "top_p": 1.0, "seed": None}
    return {"temperature": CANDIDATE_TEMPERATURE, "top_p": CANDIDATE_TOP_P, "seed": 1000 + candidate}


def run_refactor(engine, cancel: threading.Event | None, req: RefactorRequest, text: str, *,
                 prefix_tokens: int = 1024, suffix_tokens: int = 256) -> str:
    """Generate the new text of [req.start, req.end) for the document `text` at req.version. Worker thread."""
    from engine import SamplingParams  # the surface of the engine room; imported where the engine runs

    tok = engine.tokenizer
    a, b = req.start, req.end
    if not 0 <= a <= b <= len(text):
        raise RefactorFailed(f"region {a}..{b} outside the document ({len(text)} chars)")
    before, after = text[:a], text[b:]
    prompt = build_prompt(tok, before + after, a, prefix_tokens=prefix_tokens, suffix_tokens=suffix_tokens)
    room = getattr(engine, "max_seq_len", 4096) - len(prompt.ids) - 1
    if req.op == REWRITE:
        old_tokens = len(tok.encode(text[a:b]))
        budget = min(MAX_NEW_TOKENS, 2 * old_tokens + 32, room)
        min_indent = None
    else:
        budget = min(MAX_NEW_TOKENS // 2, room)
        min_indent = block_indent_at(text, a)
    if budget <= 0:
        raise RefactorFailed("no room left in the model's context for a generation")

    def stop_fn(so_far: str) -> bool:
        if req.op == REWRITE:
            return trim_at_suffix(so_far, after) != so_far
        return trim_to_block(so_far, min_indent) != so_far

    res = engine.complete(prompt.ids, max_new_tokens=budget, sampling=SamplingParams(**sampling_for(req.candidate)),
                          stop_ids=stop_ids_for(tok), stop_fn=stop_fn, cancel=cancel)
    if res.finish_reason == "cancelled":
        raise RefactorCancelled()
    out = trim_at_suffix(res.text, after) if req.op == REWRITE else trim_to_block(res.text, min_indent)
    if req.op == REWRITE:
        # Keep the region's line structure: a region of whole lines stays whole lines.
        old = text[a:b]
        if old.endswith("\n") and out and not out.endswith("\n"):
            out += "\n"
    else:
        out = out.rstrip()
    if not out.strip():
        raise RefactorFailed("the model produced no code here")
    if out == text[a:b]:
        raise RefactorFailed("the model reproduced the same code")
    return out


class RefactorCancelled(Exception):
    """The generation was cancelled (client cancelled the resolve, or a newer job replaced it)."""


def edit_for(req: RefactorRequest, text: str, new_text: str, encoding: str) -> types.WorkspaceEdit:
    rng = lsp_range(text, req.start, req.end, encoding)
    return versioned_edit(req.uri, req.version, [types.TextEdit(range=rng, new_text=new_text)])
