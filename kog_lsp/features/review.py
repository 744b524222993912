"""Review diagnostics: rescore a document after edits (debounced, newest wins) and publish per-line findings.

- Push (`textDocument/publishDiagnostics`) to clients without pull support; clients that declare
  `textDocument.diagnostic` pull (`textDocument/diagnostic`, answered from the latest review of the current
  version, waiting for it when it is still running) and get `workspace/diagnostic/refresh` when a review lands
  (if they support it). Sending both to one client would show every finding twice (VS Code and Neovim keep
  pushed and pulled diagnostics in separate collections).
- Scoring runs on the engine worker as a REVIEW job, preemptible, keyed per document: a completion pre-empts
  it (it restarts later, cheaply: the prefix KV cache still holds what it scored) and a newer edit replaces it.
"""

from __future__ import annotations

import asyncio
import logging
import time

from lsprotocol import types

from kog_lsp.review import ReviewCancelled, ReviewOptions, WindowedScorer, review_document, to_diagnostics
from kog_lsp.textmap import PROSE_LANGUAGES, language_of

log = logging.getLogger(__name__)

REVIEW_WINDOW_TOKENS = 2048  # per engine.score call (capped by the engine's max_seq_len)
REVIEW_CONTEXT_TOKENS = 256  # tokens a later window sees before the ones it scores
REVIEW_MAX_CHARS = 1_000_000  # larger documents (logs, data, generated code) are not reviewed: scoring them
                              # would keep the engine busy for minutes for findings nobody reads
CPU_SCORE_STEP = 64  # on a CPU, score in growing prefixes of 64 tokens: the most a completion waits for
PULL_WAIT_S = 30.0  # a pull request waits this long for the running review before answering with what exists
LOAD_POLL_S = 0.25


class ReviewService:
    def __init__(self, ls):
        self.ls = ls
        self.scorer: WindowedScorer | None = None
        self._tasks: dict[str, asyncio.Task] = {}  # uri -> debounce+review task (newest wins)
        self._results: dict[str, tuple[int | None, list[types.Diagnostic]]] = {}  # uri -> (version, diagnostics)
        self._updated: dict[str, asyncio.Event] = {}
        self.counters = {"reviews": 0, "cancelled": 0, "failed": 0, "skipped_large": 0, "skipped_prose": 0,
                         "findings": 0, "last_ms": None}

    # ---- client capabilities ----
    def _pull_client(self) -> bool:
        caps = self.ls.client_capabilities
        return bool(caps and caps.text_document and caps.text_document.diagnostic is not None)

    def _refresh_supported(self) -> bool:
        caps = self.ls.client_capabilities
        ws = caps.workspace if caps else None
        return bool(ws and ws.diagnostics and ws.diagnostics.refresh_support)

    # ---- scheduling ----
    def on_change(self, uri: str) -> None:
        """didOpen / didChange (event loop thread): debounce, then review the newest version."""
        opts = ReviewOptions.from_settings(self.ls.settings)
        old = self._tasks.pop(uri, None)
        if old is not None:
            old.cancel()  # the job it submitted is replaced by the next submit with the same key
        doc = self.ls.workspace.open_document(uri)
        if doc is None or not opts.enable:
            self.clear(uri)
            return
        self._tasks[uri] = asyncio.ensure_future(self._debounced(uri, opts))

    def clear(self, uri: str) -> None:
        """Forget a document's findings (closed, or review disabled) and withdraw them from the client."""
        had = self._results.pop(uri, None)
        task = self._tasks.pop(uri, None)
        if task is not None:
            task.cancel()
        if had is not None and had[1]:
            self._publish(uri, None, [])
        self._signal(uri)

    async def _debounced(self, uri: str, opts: ReviewOptions) -> None:
        try:
            await asyncio.sleep(opts.debounce_ms / 1000.0)
            rt = self.ls.runtime
            while not rt.loaded.is_set():  # model still loading: review as soon as it is there
                await asyncio.sleep(LOAD_POLL_S)
            if not rt.ready or rt.worker is None:
                return
            await self._review(uri, opts)
        except asyncio.CancelledError:
            pass
        finally:
            if self._tasks.get(uri) is asyncio.current_task():
                del self._tasks[uri]
            self._signal(uri)

    async def _review(self, uri: str, opts: ReviewOptions) -> None:
        from engine import JobCancelled, Priority  # loaded by now (the runtime imported it)

        doc = self.ls.workspace.open_document(uri)
        if doc is None:
            return
        text, version, encoding = doc.source, doc.version, doc.encoding
        language = language_of(uri, getattr(doc, "language_id", None))
        if language in PROSE_LANGUAGES:
            log.debug("review of %s skipped: %s is prose or data, not code", uri, language)
            self.counters["skipped_prose"] += 1
            self._settle_empty(uri, version)
            return
        if len(text) > REVIEW_MAX_CHARS:
            log.info("review of %s skipped: %d characters (limit %d)", uri, len(text), REVIEW_MAX_CHARS)
            self.counters["skipped_large"] += 1
            self._settle_empty(uri, version)
            return

        def work(engine, cancel):
            if self.scorer is None:
                window = min(REVIEW_WINDOW_TOKENS, int(getattr(engine, "max_seq_len", REVIEW_WINDOW_TOKENS)))
                device = str(getattr(getattr(engine, "model", None), "device", "cpu"))
                step = CPU_SCORE_STEP if device.startswith("cpu") else None
                self.scorer = WindowedScorer(window, min(REVIEW_CONTEXT_TOKENS, window // 4), step=step)
            return review_document(engine, text, language, opts, self.scorer, cancel)

        t0 = time.perf_counter()
        job = self.ls.runtime.worker.submit(work, priority=Priority.REVIEW, key=f"review:{uri}", preemptible=True)
        try:
            findings = await job
        except asyncio.CancelledError:
            job.cancel()
            raise
        except (JobCancelled, ReviewCancelled):
            self.counters["cancelled"] += 1
            return
        except Exception:
            self.counters["failed"] += 1
            log.exception("review of %s (version %s) failed", uri, version)
            self._settle_empty(uri, version)   # settled: a pull must not reschedule the same failure forever
            return
        self.counters["reviews"] += 1
        self.counters["last_ms"] = round((time.perf_counter() - t0) * 1000.0, 1)
        cur = self.ls.workspace.open_document(uri)
        if cur is None or cur.version != version:
            return  # edited meanwhile: the newer version's review is already scheduled
        diags = to_diagnostics(text, findings, encoding, version, opts.severity)
        self.counters["findings"] += len(diags)
        log.debug("review %s v%s: %d findings in %s ms", uri, version, len(diags), self.counters["last_ms"])
        self._results[uri] = (version, diags)
        self._publish(uri, version, diags)

    # ---- delivery ----
    def _settle_empty(self, uri: str, version: int | None) -> None:
        """This version has no findings without a review (skipped or failed); an earlier version's are withdrawn."""
        had = self._results.get(uri)
        self._results[uri] = (version, [])
        if had is not None and had[1]:
            self._publish(uri, version, [])

    def _publish(self, uri: str, version: int | None, diags: list[types.Diagnostic]) -> None:
        if self._pull_client():
            if self._refresh_supported():
                try:
                    self.ls.workspace_diagnostic_refresh(None)
                except Exception as exc:  # best effort: the next pull gets the result anyway
                    log.debug("diagnostic refresh not sent: %s", exc)
            return
        self.ls.text_document_publish_diagnostics(
            types.PublishDiagnosticsParams(uri=uri, version=version, diagnostics=diags))

    def _signal(self, uri: str) -> None:
        ev = self._updated.pop(uri, None)
        if ev is not None:
            ev.set()

    async def pull(self, uri: str, previous_result_id: str | None):
        doc = self.ls.workspace.open_document(uri)
        opts = ReviewOptions.from_settings(self.ls.settings)
        if doc is None or not opts.enable:
            return types.RelatedFullDocumentDiagnosticReport(items=[])
        deadline = time.monotonic() + PULL_WAIT_S
        while True:
            res = self._results.get(uri)
            if res is not None and res[0] == doc.version:
                rid = f"{doc.version}:{len(res[1])}"
                if previous_result_id == rid:
                    return types.RelatedUnchangedDocumentDiagnosticReport(result_id=rid)
                return types.RelatedFullDocumentDiagnosticReport(items=res[1], result_id=rid)
            rt = self.ls.runtime
            if rt.loaded.is_set() and not rt.ready:
                return types.RelatedFullDocumentDiagnosticReport(items=[])
            if uri not in self._tasks:
                self.on_change(uri)
            ev = self._updated.setdefault(uri, asyncio.Event())
            left = deadline - time.monotonic()
            if left <= 0:
                # Still no result for this version: answer with nothing rather than stale ranges; the refresh
                # after the review lands makes the client pull again.
                return types.RelatedFullDocumentDiagnosticReport(items=[])
            try:
                await asyncio.wait_for(ev.wait(), timeout=left)
            except asyncio.TimeoutError:
                pass
            doc = self.ls.workspace.open_document(uri)
            if doc is None:
                return types.RelatedFullDocumentDiagnosticReport(items=[])


# Review keys of the `kog` settings section (docs/interfaces.md), added through settings.register_setting so
# initializationOptions and didChangeConfiguration accept them. Keys settings.py already knows are left alone.
def _review_setting_specs():
    from kog_lsp import settings as st

    d = ReviewOptions()
    return {
        "reviewMinSurprisal": ("review_min_surprisal", st._float_range(0.0, 64.0), d.min_surprisal_bits),
        "reviewMinTopProb": ("review_min_top_prob", st._float_range(0.0, 1.0), d.min_top_prob),
        "reviewInStringsAndComments": ("review_in_strings_and_comments", st._bool, d.in_strings_and_comments),
        "reviewDebounceMs": ("review_debounce_ms", st._int_range(0, 60_000), d.debounce_ms),
    }


def install_review_settings(settings) -> list[str]:
    """Make `settings` (kog_lsp.settings.Settings) accept the review keys; returns the keys added."""
    from kog_lsp.settings import register_setting

    return [key for key, (attr, check, default) in _review_setting_specs().items()
            if register_setting(settings, key, attr, check, default)]


def register(ls) -> None:
    added = install_review_settings(ls.settings)
    if added:
        log.debug("review settings added by features/review.py: %s", ", ".join(added))
    svc = ReviewService(ls)
    ls.review = svc  # tests and kog/stats can read svc.counters
    ls.on_document_change(svc.on_change)
    ls.on_document_close(svc.clear)

    @ls.feature(types.TEXT_DOCUMENT_DIAGNOSTIC,
                types.DiagnosticOptions(identifier="kog", inter_file_dependencies=False, workspace_diagnostics=False))
    async def diagnostic(ls, params: types.DocumentDiagnosticParams):
        return await svc.pull(params.text_document.uri, params.previous_result_id)
