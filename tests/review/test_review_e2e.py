"""End to end through the real server (subprocess, stdio) with pytest-lsp: review diagnostics for an injected bug
(push and pull), the quick fix, a rewrite action resolved to a versioned edit, stale versions refused.

The model is the bigram oracle of tests/review/review_bigram_model.py: deterministic, and it knows the clean code, so a
swapped token is exactly what it flags.
"""

from __future__ import annotations

import asyncio
import sys
import time
import typing

import pytest
import pytest_asyncio
from lsprotocol import types
from pytest_lsp import ClientServerConfig

from kog_lsp import positions

from review_bigram_model import make_bigram_checkpoint

CLEAN = (
    "def area(width, height):\n"
    "    return width * height\n"
    "\n"
    "\n"
    "def total(items):\n"
    "    count = 0\n"
    "    for item in items:\n"
    "        count += item.size\n"
    "    return count\n"
)
BUGGY = CLEAN.replace("item.size", "item.width")  # wrong attribute name, line 7
BUG_LINE = 7
# The oracle also learns what follows the FIM markers, so a rewrite has something to say.
ORACLE_TEXT = CLEAN + "<|fim_prefix|>def area(width, height):\n<|fim_suffix|>\n<|fim_middle|>    return width * height\n"
URI = "file:///work/example.py"
FAST = {"reviewDebounceMs": 0}


@pytest.fixture(scope="module")
def oracle_dir(tmp_path_factory):
    return make_bigram_checkpoint(tmp_path_factory.mktemp("oracle"), ORACLE_TEXT)


def _caps(pull: bool, resolve: bool = True) -> types.ClientCapabilities:
    td = types.TextDocumentClientCapabilities(
        synchronization=types.TextDocumentSyncClientCapabilities(),
        publish_diagnostics=types.PublishDiagnosticsClientCapabilities(version_support=True, data_support=True),
        code_action=types.CodeActionClientCapabilities(
            data_support=True, is_preferred_support=True,
            resolve_support=types.ClientCodeActionResolveOptions(properties=["edit"]) if resolve else None,
            code_action_literal_support=types.ClientCodeActionLiteralOptions(
                code_action_kind=types.ClientCodeActionKindOptions(value_set=[
                    types.CodeActionKind.QuickFix, types.CodeActionKind.Refactor,
                    types.CodeActionKind.RefactorRewrite]))),
        diagnostic=types.DiagnosticClientCapabilities(data_support=True) if pull else None,
    )
    return types.ClientCapabilities(
        general=types.GeneralClientCapabilities(position_encodings=[types.PositionEncodingKind.Utf16]),
        text_document=td,
        workspace=types.WorkspaceClientCapabilities(
            workspace_edit=types.WorkspaceEditClientCapabilities(document_changes=True),
            diagnostics=types.DiagnosticWorkspaceClientCapabilities(refresh_support=True) if pull else None),
    )


async def _start(oracle_dir, pull=False, options=None, resolve=True):
    config = ClientServerConfig(server_command=[sys.executable, "-m", "kog_lsp", "--model", str(oracle_dir),
                                                "--device", "cpu", "--backend", "reference"])
    client = await config.start()
    await client.initialize_session(types.InitializeParams(
        capabilities=_caps(pull, resolve), initialization_options={**FAST, **(options or {})}))
    return client


@pytest_asyncio.fixture
async def client(oracle_dir):
    c = await _start(oracle_dir)
    yield c
    await c.shutdown_session()
    await c.stop()


@pytest_asyncio.fixture
async def pull_client(oracle_dir):
    c = await _start(oracle_dir, pull=True)
    yield c
    await c.shutdown_session()
    await c.stop()


def _open(client, text, version=1, uri=URI, language_id="python"):
    client.text_document_did_open(types.DidOpenTextDocumentParams(text_document=types.TextDocumentItem(
        uri=uri, language_id=language_id, version=version, text=text)))


def _change(client, text, version, uri=URI):
    client.text_document_did_change(types.DidChangeTextDocumentParams(
        text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=version),
        content_changes=[types.TextDocumentContentChangeWholeDocument(text=text)]))


async def _diagnostics(client, uri, predicate, timeout=60.0):
    """Poll what the client received until predicate(diagnostics) holds (model load + review on a busy CPU)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        d = client.diagnostics.get(uri)
        if d is not None and predicate(d):
            return d
        await asyncio.sleep(0.05)
    raise AssertionError(f"diagnostics for {uri} never matched; last: {client.diagnostics.get(uri)}")


def _apply(text, edit: types.WorkspaceEdit, version):
    [tde] = edit.document_changes
    assert tde.text_document.version == version
    for e in sorted(tde.edits, key=lambda e: (e.range.start.line, e.range.start.character), reverse=True):
        text = positions.apply_change(text, (e.range.start.line, e.range.start.character),
                                      (e.range.end.line, e.range.end.character), e.new_text, "utf-16")
    return text


async def test_push_diagnostic_for_injected_bug_and_quick_fix(client):
    _open(client, BUGGY)
    diags = await _diagnostics(client, URI, lambda d: len(d) > 0)
    [d] = diags
    assert d.range.start.line == BUG_LINE and d.source == "kog"
    assert d.severity == types.DiagnosticSeverity.Information
    assert "`w" in d.message and "`s" in d.message and "%" in d.message  # unexpected token, expected one, its p
    stats = await client.protocol.send_request_async("kog/stats", {})
    # (pygls hands untyped results back as namedtuples)
    assert stats.review.reviews >= 1 and stats.review.findings >= 1 and stats.queue >= 0

    actions = await client.text_document_code_action_async(types.CodeActionParams(
        text_document=types.TextDocumentIdentifier(uri=URI), range=d.range,
        context=types.CodeActionContext(diagnostics=[d])))
    fixes = [a for a in actions if a.kind == types.CodeActionKind.QuickFix]
    assert len(fixes) == 1 and fixes[0].edit is not None
    fixed = _apply(BUGGY, fixes[0].edit, 1)
    assert fixed.splitlines()[BUG_LINE].startswith("        count += item.s")

    # The fixed single token makes the line read like the clean code; after the edit review rescored.
    _change(client, CLEAN, 2)
    await _diagnostics(client, URI, lambda d: len(d) == 0)


async def test_prose_and_data_documents_are_not_reviewed(client):
    # The same buggy text as a Markdown document: review skips it (prose), while the Python copy is flagged.
    md = "file:///work/notes.md"
    _open(client, BUGGY, uri=md, language_id="markdown")
    _open(client, BUGGY)
    await _diagnostics(client, URI, lambda d: len(d) > 0)
    deadline = time.monotonic() + 10.0
    while (await client.protocol.send_request_async("kog/stats", {})).review.skipped_prose < 1:
        assert time.monotonic() < deadline, "the Markdown document was never skipped"
        await asyncio.sleep(0.05)
    assert not client.diagnostics.get(md)


async def test_findings_are_withdrawn_when_a_version_is_not_reviewed(client):
    # Flagged, then edited past the size review takes: the new version is skipped, and the old findings must not stay.
    from kog_lsp.features.review import REVIEW_MAX_CHARS
    _open(client, BUGGY)
    await _diagnostics(client, URI, lambda d: len(d) > 0)
    _change(client, BUGGY + "#" * REVIEW_MAX_CHARS + "\n", 2)
    await _diagnostics(client, URI, lambda d: len(d) == 0, timeout=20.0)
    stats = await client.protocol.send_request_async("kog/stats", {})
    assert stats.review.skipped_large == 1


async def test_closing_a_document_withdraws_its_findings(client):
    other = "file:///work/closed.py"
    _open(client, BUGGY, uri=other)
    await _diagnostics(client, other, lambda d: len(d) > 0)
    client.text_document_did_close(types.DidCloseTextDocumentParams(
        text_document=types.TextDocumentIdentifier(uri=other)))
    await _diagnostics(client, other, lambda d: len(d) == 0, timeout=10.0)


async def test_clean_code_has_no_findings_and_review_can_be_disabled(oracle_dir):
    c = await _start(oracle_dir, options={"reviewSeverity": "warning"})
    try:
        _open(c, CLEAN)
        await _diagnostics(c, URI, lambda d: len(d) == 0)
        other = "file:///work/other.py"
        _open(c, BUGGY, uri=other)
        [d] = await _diagnostics(c, other, lambda d: len(d) > 0)
        assert d.severity == types.DiagnosticSeverity.Warning
        # Turning review off withdraws the findings at the next edit.
        c.workspace_did_change_configuration(types.DidChangeConfigurationParams(
            settings={"kog": {"reviewEnable": False}}))
        _change(c, BUGGY + "\n", 2, uri=other)
        await _diagnostics(c, other, lambda d: len(d) == 0)
    finally:
        await c.shutdown_session()
        await c.stop()


async def test_pull_diagnostics(pull_client):
    _open(pull_client, BUGGY)
    report = await pull_client.text_document_diagnostic_async(types.DocumentDiagnosticParams(
        text_document=types.TextDocumentIdentifier(uri=URI)))
    assert report.kind == "full"
    assert [d.range.start.line for d in report.items] == [BUG_LINE]
    again = await pull_client.text_document_diagnostic_async(types.DocumentDiagnosticParams(
        text_document=types.TextDocumentIdentifier(uri=URI), previous_result_id=report.result_id))
    assert again.kind == "unchanged"
    assert not pull_client.diagnostics.get(URI)  # a pull client gets no duplicate pushed copy


async def test_rewrite_resolves_to_versioned_edit_and_stale_is_refused(client):
    _open(client, CLEAN)
    await _diagnostics(client, URI, lambda d: len(d) == 0)  # model loaded, document reviewed
    sel = types.Range(start=types.Position(line=1, character=0), end=types.Position(line=2, character=0))
    actions = await client.text_document_code_action_async(types.CodeActionParams(
        text_document=types.TextDocumentIdentifier(uri=URI), range=sel, context=types.CodeActionContext(diagnostics=[])))
    titles = [a.title for a in actions]
    assert "Kog: rewrite selection" in titles and "Kog: complete this block" in titles
    rewrite = next(a for a in actions if a.title == "Kog: rewrite selection")
    assert rewrite.edit is None and rewrite.data is not None  # listing is instant: no generation yet

    resolved = await client.code_action_resolve_async(rewrite)
    [tde] = resolved.edit.document_changes
    assert tde.text_document.version == 1
    [e] = tde.edits
    assert e.range == sel and e.new_text.strip()
    new = _apply(CLEAN, resolved.edit, 1)
    assert new.startswith("def area(width, height):\n") and new.endswith("def total(items):\n" + CLEAN.split(
        "def total(items):\n", 1)[1])

    # The document moves on: resolving the action listed for version 1 is refused, with a message.
    _change(client, CLEAN + "\n", 2)
    with pytest.raises(Exception) as err:
        await client.code_action_resolve_async(rewrite)
    assert "changed" in str(err.value) and "-32801" in repr(err.value) + str(getattr(err.value, "code", ""))


async def test_refactor_command_for_clients_without_resolve(oracle_dir):
    c = await _start(oracle_dir, resolve=False)
    applied = []

    @c.feature(types.WORKSPACE_APPLY_EDIT)
    def apply_edit(params: types.ApplyWorkspaceEditParams):
        applied.append(params.edit)
        return types.ApplyWorkspaceEditResult(applied=True)

    # lsprotocol's client-side hook structures any code action that has a `command` as a bare Command (it only
    # checks that the key exists); VS Code and Neovim read the JSON correctly. Fix it for this test client.
    conv = c.protocol._converter

    def command_or_action(obj, _):
        if isinstance(obj.get("command"), str):
            return conv.structure(obj, types.Command)
        return conv.structure(obj, types.CodeAction)

    conv.register_structure_hook(typing.Union[types.Command, types.CodeAction], command_or_action)
    try:
        _open(c, CLEAN)
        await _diagnostics(c, URI, lambda d: len(d) == 0)
        sel = types.Range(start=types.Position(line=1, character=0), end=types.Position(line=2, character=0))
        actions = await c.text_document_code_action_async(types.CodeActionParams(
            text_document=types.TextDocumentIdentifier(uri=URI), range=sel,
            context=types.CodeActionContext(diagnostics=[])))
        rewrite = next(a for a in actions if a.title == "Kog: rewrite selection")
        assert rewrite.command is not None and rewrite.command.command == "kog.refactor"
        await c.workspace_execute_command_async(types.ExecuteCommandParams(
            command=rewrite.command.command, arguments=rewrite.command.arguments))
        [edit] = applied
        new = _apply(CLEAN, edit, 1)
        assert new.startswith("def area(width, height):\n") and "def total(items):" in new
    finally:
        await c.shutdown_session()
        await c.stop()
