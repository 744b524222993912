"""textDocument/inlineCompletion, textDocument/completion (fallback) and the kog.accepted command.

Handlers are async so $/cancelRequest can stop them mid-generation (see completer.py); they only
translate between LSP types and kog_lsp.completer.
"""

from __future__ import annotations

import logging
import re
import time
import uuid
from dataclasses import dataclass

from lsprotocol import types
from pygls.exceptions import JsonRpcInvalidParams

from kog_lsp import positions
from kog_lsp.completer import AUTOMATIC, INVOKED, Candidate, Request

log = logging.getLogger(__name__)

ACCEPT_COMMAND = "kog.accepted"
INVOKED_EXTRA_SAMPLES = 2  # invoked inline completion: greedy + 2 sampled candidates for cycling
_WORD_TAIL = re.compile(r"[A-Za-z0-9_]*$")


@dataclass
class Located:
    """A request resolved against the server's document."""

    request: Request
    doc_text: str
    encoding: str
    replace_start: int  # doc offset where items start (cursor, or the selected completion's range start)
    replace_end: int  # doc offset the item range ends at for plain insertion
    line_end: int  # doc offset of the end of the cursor's line (for replace-to-end-of-line)
    prefix_text: str  # text every item must start with (the selected completion text), "" if none
    starts: list[int]  # line starts of doc_text (positions of a 10 MB file without rescanning it)


def locate(ls, uri: str, position: types.Position, trigger_kind: int,
           selected: types.SelectedCompletionInfo | None = None) -> Located:
    """Resolve uri + position (+ selectedCompletionInfo) or raise JsonRpcInvalidParams."""
    doc = ls.workspace.open_document(uri)
    if doc is None:
        raise JsonRpcInvalidParams(f"document not open: {uri}")
    text, enc, starts = doc.source, doc.encoding, doc.line_starts()
    try:
        cur = positions.Cursor.resolve(text, position.line, position.character, enc, starts)
    except positions.PositionError as exc:
        raise JsonRpcInvalidParams(f"bad position for {uri}: {exc}") from None
    if selected is None:
        req = Request(uri, text, cur.offset, cur.line_start, cur.line_end, trigger_kind, starts=starts)
        return Located(req, text, enc, cur.offset, cur.offset, cur.line_end, "", starts)
    # The editor shows a completion-menu item: complete as if it were inserted, and make every item
    # extend that text over the same range (LSP 3.18), else the editor hides our items.
    r = selected.range
    try:
        a = positions.offset_at(text, r.start.line, r.start.character, enc, strict=True, starts=starts)
        b = positions.offset_at(text, r.end.line, r.end.character, enc, strict=True, starts=starts)
    except positions.PositionError as exc:
        raise JsonRpcInvalidParams(f"bad selectedCompletionInfo range: {exc}") from None
    if not a <= cur.offset <= b or text.count("\n", a, b) or text.count("\r", a, b):
        raise JsonRpcInvalidParams("selectedCompletionInfo range must be on the cursor's line and contain it")
    virtual = text[:a] + selected.text + text[b:]
    shift = len(selected.text) - (b - a)
    req = Request(uri, virtual, a + len(selected.text), cur.line_start, cur.line_end + shift, trigger_kind,
                  use_cache=False)
    return Located(req, text, enc, a, b, cur.line_end, selected.text, starts)


def _pos(loc: Located, offset: int) -> types.Position:
    line, ch = positions.position_at(loc.doc_text, offset, loc.encoding, starts=loc.starts)
    return types.Position(line=line, character=ch)


def to_inline_items(loc: Located, cands: list[Candidate]) -> list[types.InlineCompletionItem]:
    items = []
    start = _pos(loc, loc.replace_start)
    for c in cands:
        end_off = loc.line_end if c.replace_to_eol else loc.replace_end
        items.append(types.InlineCompletionItem(
            insert_text=loc.prefix_text + c.text,
            range=types.Range(start=start, end=_pos(loc, end_off)),
            command=types.Command(title="kog: accepted", command=ACCEPT_COMMAND, arguments=[uuid.uuid4().hex[:12]]),
        ))
    return items


def to_completion_items(loc: Located, cands: list[Candidate]) -> list[types.CompletionItem]:
    """Completion-menu fallback: the item replaces the word being typed with word + suggestion (how
    completion items work; Neovim's omnifunc replaces the keyword before the cursor)."""
    text, cur = loc.doc_text, loc.replace_start
    line_start = loc.request.line_start
    word = _WORD_TAIL.search(text[line_start:cur]).group(0)
    out = []
    for c in cands[:1]:
        new_text = word + c.text
        end_off = loc.line_end if c.replace_to_eol else cur
        first = new_text.split("\n", 1)[0]
        out.append(types.CompletionItem(
            label=first if len(first) <= 60 else first[:57] + "...",
            kind=types.CompletionItemKind.Snippet if "\n" in new_text else types.CompletionItemKind.Text,
            detail="kog",
            insert_text=new_text,
            insert_text_format=types.InsertTextFormat.PlainText,
            filter_text=word + first,
            text_edit=types.TextEdit(range=types.Range(start=_pos(loc, cur - len(word)), end=_pos(loc, end_off)),
                                     new_text=new_text),
            sort_text="0",
            preselect=True,
            command=types.Command(title="kog: accepted", command=ACCEPT_COMMAND, arguments=[uuid.uuid4().hex[:12]]),
        ))
    return out


async def run_request(ls, loc: Located, extra_samples: int) -> list[Candidate]:
    """Run the completer; record latency/counters. CancelledError propagates (pygls answers -32800)."""
    t0 = time.perf_counter()
    loc.request.extra_samples = extra_samples
    cands = await ls.completer.complete(loc.request, ls.open_documents(), ls.workspace.root_uri)
    if cands:
        ls.stats.bump("completions")
        ls.stats.add_latency((time.perf_counter() - t0) * 1000.0)
    else:
        ls.stats.bump("empty")
    return cands


def register(ls) -> None:
    @ls.feature(types.TEXT_DOCUMENT_INLINE_COMPLETION, types.InlineCompletionOptions())
    async def inline_completion(ls, params: types.InlineCompletionParams):
        ctx = params.context
        kind = int(ctx.trigger_kind) if ctx is not None else AUTOMATIC
        loc = locate(ls, params.text_document.uri, params.position, kind,
                     ctx.selected_completion_info if ctx is not None else None)
        if kind == AUTOMATIC and not ls.settings.enable:
            return types.InlineCompletionList(items=[])
        cands = await run_request(ls, loc, extra_samples=INVOKED_EXTRA_SAMPLES if kind == INVOKED else 0)
        return types.InlineCompletionList(items=to_inline_items(loc, cands))

    @ls.feature(types.TEXT_DOCUMENT_COMPLETION, types.CompletionOptions(trigger_characters=[".", "("]))
    async def completion(ls, params: types.CompletionParams):
        # For clients without inline completion: one greedy suggestion in the completion menu. Clients
        # that show ghost text get nothing here (no duplicate suggestion, no second engine call).
        caps = ls.client_capabilities
        if caps and caps.text_document and caps.text_document.inline_completion is not None:
            return types.CompletionList(is_incomplete=False, items=[])
        loc = locate(ls, params.text_document.uri, params.position, INVOKED)
        cands = await run_request(ls, loc, extra_samples=0)
        return types.CompletionList(is_incomplete=True, items=to_completion_items(loc, cands))

    @ls.command(ACCEPT_COMMAND)
    def accepted(ls, *args):
        ls.stats.bump("accepted")
        log.debug("suggestion accepted: %s", args)
        return None
