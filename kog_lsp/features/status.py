"""Custom requests: kog/stats (latency, throughput, cache numbers) and kog/document (the server's view
of a document, for clients and tests that check synchronisation)."""

from __future__ import annotations

from pygls.exceptions import JsonRpcInvalidParams

STATS_METHOD = "kog/stats"
DOCUMENT_METHOD = "kog/document"


def stats_result(ls) -> dict:
    snap = ls.stats.snapshot(ls.runtime.engine_stats)
    snap["state"] = ls.runtime.state
    snap["backend"] = ls.runtime.backend
    snap["promptFormat"] = ls.runtime.prompt_format
    snap["settings"] = ls.settings.to_dict()
    worker = ls.runtime.worker
    snap["queue"] = worker.pending() if worker is not None else 0  # engine jobs waiting: must not grow
    review = getattr(ls, "review", None)
    snap["review"] = dict(review.counters) if review is not None else None
    completer = getattr(ls, "completer", None)
    snap["promptTokenCache"] = completer.prompt_tokens.stats() if completer is not None else None
    return snap


def _field(params, name):
    if isinstance(params, dict):
        return params.get(name)
    return getattr(params, name, None)


def register(ls) -> None:
    @ls.feature(STATS_METHOD)
    def kog_stats(ls, params=None):
        return stats_result(ls)

    @ls.feature(DOCUMENT_METHOD)
    def kog_document(ls, params=None):
        uri = _field(params, "uri")
        if not isinstance(uri, str):
            raise JsonRpcInvalidParams("kog/document needs {uri: string}")
        doc = ls.workspace.open_document(uri)
        if doc is None:
            raise JsonRpcInvalidParams(f"document not open: {uri}")
        return {"uri": uri, "version": doc.version, "text": doc.source, "encoding": doc.encoding}
