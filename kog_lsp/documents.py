"""pygls document store with exact LSP semantics.

pygls 2.1's TextDocument converts positions through `str.splitlines` (which splits on form feeds,
U+2028 ...) and clamps an over-long `character` to len-1; both corrupt text on some edits. Features
read documents through `ls.workspace.get_text_document(uri)`, so instead of a second store we swap in
a Workspace whose documents apply changes with kog_lsp.positions.
"""

from __future__ import annotations

from typing import Optional, Sequence
from urllib.parse import unquote

from lsprotocol import types
from pygls.workspace import TextDocument, Workspace

from kog_lsp import positions


def _encoding_name(enc) -> str:
    value = getattr(enc, "value", enc)
    return value if value in (positions.UTF8, positions.UTF16, positions.UTF32) else positions.UTF16


class KogTextDocument(TextDocument):
    # Line starts of the current source, kept up to date across incremental edits: on a 10 MB file a
    # full rescan per keystroke costs tens of ms, the incremental update a few (see positions.py).
    _starts: list[int] | None = None
    _starts_of: str | None = None  # the source string `_starts` belongs to (identity check)

    @property
    def encoding(self) -> str:
        return _encoding_name(self.position_codec.encoding)

    def line_starts(self) -> list[int]:
        src = self.source
        if self._starts is None or self._starts_of is not src:
            self._starts, self._starts_of = positions.line_starts(src), src
        return self._starts

    def _apply_incremental_change(self, change: types.TextDocumentContentChangePartial) -> None:
        r, src = change.range, self.source
        starts = self.line_starts()
        a, b = positions.change_span(src, (r.start.line, r.start.character), (r.end.line, r.end.character),
                                     self.encoding, starts)
        new = "".join((src[:a], change.text, src[b:]))  # one copy fewer than a + b + c on big files
        self._starts = positions.update_line_starts(starts, new, a, b, len(change.text))
        self._source = self._starts_of = new

    @property
    def lines(self) -> Sequence[str]:
        # Same shape as pygls (lines with their terminators, no empty entry after a final newline),
        # but split on LSP terminators only.
        src = self.source
        starts = self.line_starts()
        out = [src[a:b] for a, b in zip(starts, starts[1:] + [len(src)])]
        if out and out[-1] == "" and len(out) > 1:
            out.pop()
        return tuple(out) if src else ()

    def offset_at_position(self, client_position: types.Position) -> int:
        return positions.offset_at(self.source, client_position.line, client_position.character, self.encoding,
                                   starts=self.line_starts())

    def client_position_at_offset(self, offset: int) -> types.Position:
        line, ch = positions.position_at(self.source, offset, self.encoding, starts=self.line_starts())
        return types.Position(line=line, character=ch)


class KogWorkspace(Workspace):
    def _create_text_document(
        self,
        doc_uri: str,
        source: Optional[str] = None,
        version: Optional[int] = None,
        language_id: Optional[str] = None,
    ) -> TextDocument:
        return KogTextDocument(
            doc_uri,
            source=source,
            version=version,
            language_id=language_id,
            sync_kind=self._sync_kind,
            position_codec=self._position_codec,
        )

    def open_document(self, uri: str) -> KogTextDocument | None:
        """The document the client opened, or None (pygls's get_text_document would read the disk)."""
        return self._text_documents.get(unquote(uri))

    def has_document(self, uri: str) -> bool:
        return unquote(uri) in self._text_documents


def replace_workspace(old: Workspace) -> KogWorkspace:
    """A KogWorkspace with the settings pygls negotiated in initialize (encoding, folders)."""
    return KogWorkspace(old.root_uri, old._sync_kind, list(old.folders.values()), old.position_encoding)
