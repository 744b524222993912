"""Code actions: quick fixes for review diagnostics and the refactor actions (rewrite / complete block).

textDocument/codeAction is instant: quick fixes carry their edit (a one-token replacement known from the
diagnostic), refactor actions carry only `data`. codeAction/resolve runs the generation (async handler, so
$/cancelRequest stops it; REFACTOR job on the engine worker) and returns a WorkspaceEdit pinned to the
document version the action was listed for; a resolve for a version that is no longer current is refused
with ContentModified (-32801) and a message. Clients without resolve support get the same actions with a
`kog.refactor` command instead, which generates and sends workspace/applyEdit (same versioned edit).
"""

from __future__ import annotations

import asyncio
import logging

from lsprotocol import types
from pygls.exceptions import JsonRpcContentModified, JsonRpcException, JsonRpcRequestCancelled

from kog_lsp import positions
from kog_lsp.refactor import (RefactorCancelled, RefactorFailed, RefactorRequest, kind_allowed, edit_for,
                              list_actions, run_refactor)
from kog_lsp.review import quick_fix

log = logging.getLogger(__name__)

REFACTOR_COMMAND = "kog.refactor"
ACTION_KINDS = [types.CodeActionKind.QuickFix, types.CodeActionKind.Refactor, types.CodeActionKind.RefactorRewrite]


def code_actions(ls, params: types.CodeActionParams) -> list[types.CodeAction]:
    uri = params.text_document.uri
    doc = ls.workspace.open_document(uri)
    if doc is None:
        return []
    text, enc, version = doc.source, doc.encoding, doc.version
    starts = doc.line_starts()  # cached across edits: codeAction comes on every cursor move
    only = params.context.only if params.context else None
    out: list[types.CodeAction] = []
    if kind_allowed(types.CodeActionKind.QuickFix.value, only):
        for d in (params.context.diagnostics if params.context else []) or []:
            fix = quick_fix(d, uri, text, version, enc, starts)
            if fix is not None:
                out.append(fix)
    if ls.runtime.ready:  # refactors need the model; do not offer what cannot run
        r = params.range
        a = positions.offset_at(text, r.start.line, r.start.character, enc, starts=starts)
        b = positions.offset_at(text, r.end.line, r.end.character, enc, starts=starts)
        refactors = list_actions(uri, version, text, a, b, only, starts=starts)
        if not _resolve_supported(ls):
            # No lazy resolve: the action runs a command that generates and applies the edit itself.
            for act in refactors:
                act.command = types.Command(title=act.title, command=REFACTOR_COMMAND, arguments=[act.data])
        out.extend(refactors)
    return out


def _resolve_supported(ls) -> bool:
    """Whether the client resolves code actions lazily (codeAction/resolve filling in `edit`)."""
    caps = ls.client_capabilities
    ca = caps.text_document.code_action if caps and caps.text_document else None
    rs = ca.resolve_support if ca else None
    return bool(rs and "edit" in (rs.properties or []))


def _stale(req: RefactorRequest, doc) -> JsonRpcContentModified | None:
    if doc is None:
        return JsonRpcContentModified(f"kog: {req.uri} is no longer open; action dropped")
    if doc.version != req.version:
        return JsonRpcContentModified(f"kog: the document changed (version {req.version} -> {doc.version}) "
                                      "since this action was listed; request the action again")
    return None


async def generate_edit(ls, req: RefactorRequest) -> types.WorkspaceEdit:
    """Run the refactor generation for `req` and return its versioned edit; raises JsonRpc errors with a message
    (stale document, model not ready, nothing generated, superseded). CancelledError stops the job."""
    err = _stale(req, ls.workspace.open_document(req.uri))
    if err is not None:
        raise err
    doc = ls.workspace.open_document(req.uri)
    rt = ls.runtime
    if not rt.ready or rt.worker is None:
        raise JsonRpcException(message=f"kog: model not ready ({rt.error or rt.state})")
    from engine import JobCancelled, Priority  # loaded by now (runtime is ready)

    text = doc.source
    s = ls.settings

    def work(engine, cancel):
        return run_refactor(engine, cancel, req, text, prefix_tokens=s.prefix_tokens, suffix_tokens=s.suffix_tokens)

    job = rt.worker.submit(work, priority=Priority.REFACTOR, key=f"refactor:{req.uri}", preemptible=True)
    rt.set_busy(True)
    try:
        new_text = await job
    except asyncio.CancelledError:
        job.cancel()
        raise
    except (JobCancelled, RefactorCancelled):
        raise JsonRpcRequestCancelled("kog: superseded by a newer refactor request") from None
    except RefactorFailed as exc:
        raise JsonRpcException(message=f"kog: {exc}") from None
    finally:
        rt.set_busy(False)
    err = _stale(req, ls.workspace.open_document(req.uri))
    if err is not None:
        raise err
    return edit_for(req, text, new_text, doc.encoding)


async def resolve_action(ls, action: types.CodeAction) -> types.CodeAction:
    req = RefactorRequest.from_data(action.data)
    if req is None:
        return action  # a quick fix (already has its edit) or not ours
    action.edit = await generate_edit(ls, req)
    return action


async def run_command(ls, args) -> None:
    """kog.refactor for clients without codeAction/resolve: generate, then workspace/applyEdit (versioned)."""
    data = args[0] if isinstance(args, (list, tuple)) and args else args
    req = RefactorRequest.from_data(data)
    if req is None:
        raise JsonRpcException(message="kog.refactor: bad arguments")
    try:
        edit = await generate_edit(ls, req)
    except JsonRpcException as exc:
        ls.window_show_message(types.ShowMessageParams(type=types.MessageType.Warning, message=exc.message))
        raise
    res = await ls.workspace_apply_edit_async(types.ApplyWorkspaceEditParams(edit=edit, label="kog refactor"))
    if res is not None and not res.applied:
        log.info("client did not apply the refactor edit: %s", res.failure_reason)


def register(ls) -> None:
    @ls.feature(types.TEXT_DOCUMENT_CODE_ACTION,
                types.CodeActionOptions(code_action_kinds=ACTION_KINDS, resolve_provider=True))
    def code_action(ls, params: types.CodeActionParams):
        return code_actions(ls, params)

    @ls.feature(types.CODE_ACTION_RESOLVE)
    async def code_action_resolve(ls, params: types.CodeAction):
        return await resolve_action(ls, params)

    @ls.command(REFACTOR_COMMAND)
    async def refactor_command(ls, *args):
        return await run_command(ls, args[0] if len(args) == 1 else list(args))
