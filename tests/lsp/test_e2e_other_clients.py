"""End to end: a Neovim 0.7-like client (completion-menu fallback), a utf-8 client, and a server whose
model fails to load (it keeps running)."""

from __future__ import annotations

import pytest
from lsprotocol import types
from pygls.exceptions import JsonRpcException

from lsp_clients import NEOVIM_07, field, inline_params, open_doc, server_text, start_client, stats, wait_status

SRC = "import os\n\n\ndef main():\n    x = \n    return x\n"


async def test_neovim_07_completion_fallback(tiny_model):
    c = await start_client(tiny_model, NEOVIM_07, {"debounceMs": 0, "maxTokens": 16})
    try:
        assert c.init_result.capabilities.position_encoding == "utf-16"  # implied for old clients
        uri = "file:///work/nvim.py"
        open_doc(c, uri, SRC.replace("x = \n", "x = ma\n"))
        # initialize answered at once; while the model loads (importing torch alone takes seconds)
        # requests answer empty instead of failing or waiting.
        early = await c.text_document_inline_completion_async(inline_params(uri, 4, 10))
        s = await stats(c)
        assert list(early.items) == [] and s["state"] == "loading" and s["emptyResults"] == 1
        await wait_status(c, {"ready"})
        res = await c.text_document_completion_async(types.CompletionParams(
            text_document=types.TextDocumentIdentifier(uri=uri), position=types.Position(4, 10)))
        assert len(res.items) == 1
        item = res.items[0]
        # The item replaces the word being typed ("ma") with word + suggestion, from the word start.
        assert item.insert_text.startswith("ma") and len(item.insert_text) > 2
        assert item.text_edit.range.start == types.Position(4, 8) and item.text_edit.new_text == item.insert_text
        assert item.insert_text_format == types.InsertTextFormat.PlainText
        s = await stats(c)
        assert s["generations"] == 1 and s["completions"] == 1
    finally:
        await c.shutdown_session()
        await c.stop()


async def test_utf8_client_positions(tiny_model):
    caps = types.ClientCapabilities(general=types.GeneralClientCapabilities(
        position_encodings=[types.PositionEncodingKind.Utf8, types.PositionEncodingKind.Utf16]))
    c = await start_client(tiny_model, caps, {"debounceMs": 0, "maxTokens": 8})
    try:
        assert c.init_result.capabilities.position_encoding == "utf-8"
        uri = "file:///work/u8.py"
        open_doc(c, uri, "s = '😀é'\n")
        # utf-8 columns: the emoji is 4 units, é is 2: insert "X" right after é (column 11).
        c.text_document_did_change(types.DidChangeTextDocumentParams(
            text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=2),
            content_changes=[types.TextDocumentContentChangePartial(
                range=types.Range(types.Position(0, 11), types.Position(0, 11)), text="X")]))
        assert (await server_text(c, uri))["text"] == "s = '😀éX'\n"
        await wait_status(c, {"ready"})
        res = await c.text_document_inline_completion_async(inline_params(uri, 0, 12))
        for it in res.items:
            assert it.range.start == types.Position(0, 12)
    finally:
        await c.shutdown_session()
        await c.stop()


async def test_model_load_failure_keeps_server_running(tmp_path):
    c = await start_client(str(tmp_path / "no-such-model"), NEOVIM_07)
    try:
        st = await wait_status(c, {"error", "ready"})
        assert field(st, "state") == "error" and "no-such-model" in (field(st, "message") or "")
        errors = [m for m in c.messages if m.type == types.MessageType.Error]
        assert errors and "could not load model" in errors[0].message
        uri = "file:///work/x.py"
        open_doc(c, uri, "abc\n")
        c.text_document_did_change(types.DidChangeTextDocumentParams(
            text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=2),
            content_changes=[types.TextDocumentContentChangePartial(
                range=types.Range(types.Position(0, 3), types.Position(0, 3)), text="d")]))
        assert (await server_text(c, uri))["text"] == "abcd\n"
        res = await c.text_document_inline_completion_async(inline_params(uri, 0, 4))
        assert list(res.items) == []
        with pytest.raises(JsonRpcException):
            await c.text_document_inline_completion_async(inline_params("file:///work/unknown.py", 0, 0))
        assert (await stats(c))["state"] == "error"
    finally:
        await c.shutdown_session()
        await c.stop()
