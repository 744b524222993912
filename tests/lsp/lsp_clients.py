"""Client capability sets and helpers for the end-to-end tests (pytest-lsp against the real server)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import time

from lsprotocol import types
from pytest_lsp import ClientServerConfig, LanguageClient

from lsp_testutil import server_command, server_env

# VS Code 1.9x-like: inline completion (LSP 3.18), utf-16 only, progress, pull + push diagnostics.
VSCODE = types.ClientCapabilities(
    general=types.GeneralClientCapabilities(position_encodings=[types.PositionEncodingKind.Utf16]),
    window=types.WindowClientCapabilities(work_done_progress=True,
                                          show_message=types.ShowMessageRequestClientCapabilities()),
    workspace=types.WorkspaceClientCapabilities(
        configuration=True, apply_edit=True, workspace_folders=True,
        did_change_configuration=types.DidChangeConfigurationClientCapabilities(dynamic_registration=True),
        execute_command=types.ExecuteCommandClientCapabilities(dynamic_registration=True)),
    text_document=types.TextDocumentClientCapabilities(
        synchronization=types.TextDocumentSyncClientCapabilities(did_save=True, will_save=True),
        inline_completion=types.InlineCompletionClientCapabilities(dynamic_registration=True),
        completion=types.CompletionClientCapabilities(
            completion_item=types.ClientCompletionItemOptions(snippet_support=True)),
        publish_diagnostics=types.PublishDiagnosticsClientCapabilities(related_information=True),
        diagnostic=types.DiagnosticClientCapabilities(dynamic_registration=True),
        code_action=types.CodeActionClientCapabilities(resolve_support=types.ClientCodeActionResolveOptions(
            properties=["edit"]))),
)

# Neovim 0.7.2-like: no inline completion, no positionEncodings (utf-16 implied), push diagnostics only.
NEOVIM_07 = types.ClientCapabilities(
    window=types.WindowClientCapabilities(work_done_progress=True),
    workspace=types.WorkspaceClientCapabilities(configuration=True, apply_edit=True, workspace_folders=True),
    text_document=types.TextDocumentClientCapabilities(
        synchronization=types.TextDocumentSyncClientCapabilities(did_save=True, will_save=True,
                                                                 will_save_wait_until=True),
        completion=types.CompletionClientCapabilities(
            completion_item=types.ClientCompletionItemOptions(snippet_support=False)),
        publish_diagnostics=types.PublishDiagnosticsClientCapabilities(related_information=True),
        code_action=types.CodeActionClientCapabilities()),
)


async def start_client(model: str, capabilities: types.ClientCapabilities, init_options=None,
                       encodings=None, extra_args=()) -> LanguageClient:
    """extra_args: more kog-lsp arguments (after --device cpu, so a later --device wins)."""
    client = await ClientServerConfig(server_command=server_command(model, *extra_args),
                                      server_env=server_env()).start()
    client.statuses = []
    client.feature("kog/status")(lambda params: client.statuses.append(params))
    # Review diagnostics share the engine worker; this room's tests measure completions alone
    # (tests/review covers review; the demo test runs with everything on).
    options = {"reviewEnable": False, **(init_options or {})}
    client.init_result = await client.initialize_session(types.InitializeParams(
        capabilities=capabilities, root_uri="file:///work", initialization_options=options))
    return client


def field(params, name):
    return params[name] if isinstance(params, dict) else getattr(params, name)


async def wait_status(client, states, timeout=60.0, after=0):
    """Wait for a kog/status notification in `states` (index >= after); returns it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for st in client.statuses[after:]:
            if field(st, "state") in states:
                return st
        await asyncio.sleep(0.01)
    raise TimeoutError(f"no kog/status in {states}; got {[field(s, 'state') for s in client.statuses]}")


def open_doc(client, uri: str, text: str, version: int = 1) -> None:
    client.text_document_did_open(types.DidOpenTextDocumentParams(
        text_document=types.TextDocumentItem(uri=uri, language_id="python", version=version, text=text)))


def inline_params(uri: str, line: int, ch: int, kind=types.InlineCompletionTriggerKind.Automatic, selected=None):
    return types.InlineCompletionParams(
        text_document=types.TextDocumentIdentifier(uri=uri), position=types.Position(line=line, character=ch),
        context=types.InlineCompletionContext(trigger_kind=kind, selected_completion_info=selected))


async def raw_request(client, msg_id, method: str, params) -> concurrent.futures.Future:
    """Send a request with hand-written JSON params (to send malformed ones) and await its answer."""
    fut: concurrent.futures.Future = concurrent.futures.Future()
    client.protocol._request_futures[msg_id] = fut  # pygls resolves answers by id from this table
    client.protocol._send_data({"jsonrpc": "2.0", "id": msg_id, "method": method, "params": params})
    return await asyncio.wait_for(asyncio.wrap_future(fut), 30)


def plain(obj):
    """pygls hands untyped results back as namedtuples; turn them into dicts/lists."""
    if hasattr(obj, "_asdict"):
        return {k: plain(v) for k, v in obj._asdict().items()}
    if isinstance(obj, dict):
        return {k: plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [plain(v) for v in obj]
    return obj


async def stats(client) -> dict:
    return plain(await asyncio.wait_for(client.protocol.send_request_async("kog/stats", {}), 30))


async def server_text(client, uri: str) -> dict:
    return plain(await asyncio.wait_for(client.protocol.send_request_async("kog/document", {"uri": uri}), 30))
