"""pygls protocol subclass: exact documents, error answers for malformed requests, tolerant didChange.

- pygls 2.1 raises while *parsing* a request whose params do not match the LSP types, before it knows
  the request id, so the client would wait forever. We catch that case and answer InvalidParams (-32602).
- didChange/didClose for a URI the client never opened is logged and ignored (pygls raises KeyError,
  which would pop an "Error in server" message at the user for a client-side race).
- The workspace pygls builds in initialize is swapped for a KogWorkspace (exact positions, see documents.py).
"""

from __future__ import annotations

import logging
from urllib.parse import unquote

from lsprotocol import types
from pygls.exceptions import JsonRpcInvalidParams, JsonRpcInvalidRequest
from pygls.protocol import LanguageServerProtocol
from pygls.protocol.language_server import lsp_method

from kog_lsp.documents import KogWorkspace, replace_workspace

log = logging.getLogger(__name__)


class _MalformedRequest:
    """Stands in for a request whose params failed to parse; answered with InvalidParams."""

    def __init__(self, msg_id, method: str, reason: str):
        self.id = msg_id
        self.method = method
        self.reason = reason


class KogProtocol(LanguageServerProtocol):
    # pygls assigns `self._workspace = Workspace(...)` in initialize; intercept it to use ours.
    @property
    def _workspace(self):
        return self.__dict__.get("_kog_workspace")

    @_workspace.setter
    def _workspace(self, ws):
        if ws is not None and not isinstance(ws, KogWorkspace):
            ws = replace_workspace(ws)
        self.__dict__["_kog_workspace"] = ws

    def structure_message(self, data):
        try:
            return super().structure_message(data)
        except JsonRpcInvalidParams as exc:
            if isinstance(data, dict) and "id" in data and "method" in data:
                cause = exc.__cause__ or exc
                return _MalformedRequest(data["id"], str(data["method"]), str(cause).splitlines()[0])
            raise

    def handle_message(self, message):
        if isinstance(message, dict):
            # No "jsonrpc" member: pygls hands the raw dict over and drops it. A request (it has an id)
            # must still be answered or the client waits forever.
            if "id" in message and "method" in message:
                log.warning("request %r without jsonrpc version answered InvalidRequest", message.get("id"))
                err = JsonRpcInvalidRequest("missing or wrong \"jsonrpc\": \"2.0\" member")
                self._send_response(message["id"], error=err.to_response_error())
            else:
                log.warning("message without jsonrpc version ignored: %.200r", message)
            return
        if isinstance(message, _MalformedRequest):
            log.warning("malformed %s request %r: %s", message.method, message.id, message.reason)
            err = JsonRpcInvalidParams(f"invalid params for {message.method}: {message.reason}")
            self._send_response(message.id, error=err.to_response_error())
            return
        return super().handle_message(message)

    @lsp_method(types.TEXT_DOCUMENT_DID_CHANGE)
    def lsp_text_document__did_change(self, params: types.DidChangeTextDocumentParams):
        if not self.workspace.has_document(params.text_document.uri):
            log.warning("didChange for a document that is not open: %s (ignored)", params.text_document.uri)
            return
        yield from super().lsp_text_document__did_change(params)

    @lsp_method(types.TEXT_DOCUMENT_DID_CLOSE)
    def lsp_text_document__did_close(self, params: types.DidCloseTextDocumentParams):
        if not self.workspace.has_document(params.text_document.uri):
            log.warning("didClose for a document that is not open: %s (ignored)", unquote(params.text_document.uri))
        yield from super().lsp_text_document__did_close(params)
