"""KogLanguageServer: lifecycle, settings, documents; features register themselves (kog_lsp/features/)."""

from __future__ import annotations

import importlib
import logging

from lsprotocol import types
from pygls.exceptions import FeatureRequestError
from pygls.lsp.server import LanguageServer

from kog_lsp import __version__
from kog_lsp.completer import Completer
from kog_lsp.protocol import KogProtocol
from kog_lsp.runtime import EngineOptions, Runtime
from kog_lsp.settings import Settings
from kog_lsp.stats import Stats

log = logging.getLogger(__name__)

# Feature modules, registered in this order.
FEATURE_MODULES = ("completion", "status", "review", "actions")


class KogLanguageServer(LanguageServer):
    def __init__(self, options: EngineOptions | None = None):
        super().__init__("kog-lsp", __version__, protocol_cls=KogProtocol)
        self.settings = Settings()
        self.stats = Stats()
        self.runtime = Runtime(self, options or EngineOptions(), self.stats)
        self.completer = Completer(self.runtime, self.settings, self.stats)
        self._change_listeners: list = []
        self._close_listeners: list = []
        self.features_loaded: list[str] = []

    def report_server_error(self, error: Exception, source) -> None:
        """pygls's default pops "Error in server" at the user for protocol garbage (a bad JSON frame, a
        notification with wrong params). Those are client bugs the user cannot act on: log them and
        mirror them to window/logMessage (the client's output panel) instead. Request errors are already
        answered with an LSP error response."""
        if source is FeatureRequestError:  # the client got an error response already
            log.info("request failed: %s", error)
            return
        log.error("%s: %s", getattr(source, "__name__", source), error)
        try:
            self.window_log_message(types.LogMessageParams(type=types.MessageType.Error,
                                                           message=f"kog-lsp: {error}"))
        except Exception:  # no transport (shutting down): the log line above is enough
            pass

    def on_document_change(self, callback) -> None:
        """callback(uri) after didOpen / didChange (review schedules rescoring from here)."""
        self._change_listeners.append(callback)

    def on_document_close(self, callback) -> None:
        """callback(uri) after didClose (features drop per-document state, withdraw diagnostics)."""
        self._close_listeners.append(callback)

    def notify_document_close(self, uri: str) -> None:
        self._notify(self._close_listeners, uri)

    def notify_document_change(self, uri: str) -> None:
        self._notify(self._change_listeners, uri)

    def _notify(self, listeners, uri: str) -> None:
        for cb in listeners:
            try:
                cb(uri)
            except Exception:  # one listener's bug must not break document sync
                log.exception("document change listener failed for %s", uri)

    def apply_settings(self, values) -> None:
        for warning in self.settings.update(values):
            log.warning(warning)
            self.window_show_message(types.ShowMessageParams(type=types.MessageType.Warning, message=f"kog: {warning}"))
        self.completer.debouncer.set_period(self.settings.debounce_ms)

    def open_documents(self):
        """(uri, version, text) of every open document (context chunks)."""
        return [(d.uri, d.version, d.source) for d in self.workspace.text_documents.values()]


def _register_lifecycle(ls: KogLanguageServer) -> None:
    @ls.feature(types.INITIALIZE)
    def initialize(ls: KogLanguageServer, params: types.InitializeParams):
        ls.apply_settings(params.initialization_options)
        ls.runtime.start()

    @ls.feature(types.INITIALIZED)
    def initialized(ls: KogLanguageServer, params: types.InitializedParams):
        ls.runtime.on_initialized()

    @ls.feature(types.WORKSPACE_DID_CHANGE_CONFIGURATION)
    async def did_change_configuration(ls: KogLanguageServer, params: types.DidChangeConfigurationParams):
        values = params.settings
        if isinstance(values, dict) and values:
            ls.apply_settings(values)
            return
        # Pull-style clients send an empty notification and answer workspace/configuration instead.
        caps = ls.client_capabilities
        if caps and caps.workspace and caps.workspace.configuration:
            try:
                result = await ls.workspace_configuration_async(
                    types.ConfigurationParams(items=[types.ConfigurationItem(section="kog")]))
            except Exception as exc:
                log.warning("workspace/configuration failed: %s", exc)
                return
            if result and isinstance(result[0], dict):
                ls.apply_settings(result[0])

    @ls.feature(types.TEXT_DOCUMENT_DID_OPEN)
    def did_open(ls: KogLanguageServer, params: types.DidOpenTextDocumentParams):
        ls.notify_document_change(params.text_document.uri)

    @ls.feature(types.TEXT_DOCUMENT_DID_CHANGE)
    def did_change(ls: KogLanguageServer, params: types.DidChangeTextDocumentParams):
        ls.notify_document_change(params.text_document.uri)

    @ls.feature(types.TEXT_DOCUMENT_DID_CLOSE)
    def did_close(ls: KogLanguageServer, params: types.DidCloseTextDocumentParams):
        ls.completer.forget(params.text_document.uri)
        ls.notify_document_close(params.text_document.uri)

    @ls.feature(types.SHUTDOWN)
    def shutdown(ls: KogLanguageServer, *args):
        ls.runtime.shutdown()


def create_server(options: EngineOptions | None = None) -> KogLanguageServer:
    ls = KogLanguageServer(options)
    _register_lifecycle(ls)
    for name in FEATURE_MODULES:
        mod = importlib.import_module(f"kog_lsp.features.{name}")
        mod.register(ls)
        ls.features_loaded.append(name)
    return ls
