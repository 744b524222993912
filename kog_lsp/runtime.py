"""The model runtime as the server sees it: background load, the engine worker, kog/status, progress.

initialize answers at once; the model loads on a background thread (importing engine pulls in torch,
which alone takes a second or two). Until it is ready, completion requests get empty answers. A failed
load leaves the server running without a model (documents still tracked, requests answer empty) and
tells the user once (window/showMessage error + kog/status error).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from dataclasses import dataclass

from lsprotocol import types

from kog_lsp.fim import prompt_format

log = logging.getLogger(__name__)

STATUS_METHOD = "kog/status"
WORKER_CHECK_S = 0.5  # how often a waiting request checks that the engine worker thread is alive


@dataclass
class EngineOptions:
    model: str = "default"
    device: str = "auto"
    backend: str = "auto"
    tp: int = 1
    tp_mode: str = "exact"


class Runtime:
    def __init__(self, ls, options: EngineOptions, stats):
        self.ls = ls
        self.options = options
        self.stats = stats
        self.ready = False
        self.state = "loading"
        self.error: str | None = None
        self.worker = None
        self.tokenizer = None
        self.prompt_format = None  # set at load: fim:<format> or prefix-only, with the reason
        self.engine_stats: dict | None = None
        self.backend: str | None = None
        self.backend_reason: str | None = None
        self.load_seconds: float | None = None
        self._eng = None  # the `engine` module, once imported
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._progress_token: str | None = None
        self._initialized = False
        self._busy = 0
        self._reported: set[str] = set()  # error messages already shown to the user
        self.loaded = threading.Event()  # set when loading ended (ok or not)

    # ---- engine-facing helpers used by the completer ----
    @property
    def job_cancelled_error(self):
        return self._eng.JobCancelled if self._eng is not None else _NeverRaised

    def sampling(self, temperature: float, seed: int | None):
        return self._eng.SamplingParams(temperature=temperature, top_p=0.95 if temperature > 0 else 1.0, seed=seed)

    def submit_completion(self, fn, key: str):
        return self.worker.submit(fn, priority=self._eng.Priority.COMPLETION, key=key)

    async def wait_job(self, job):
        """Await a worker job from the event loop; fail instead of hanging if the worker thread died.

        The result is mirrored into a loop-side future (never asyncio.wrap_future on job.future, which
        would chain our cancellation into job.future.cancel()); the caller stops the job with job.cancel().
        """
        loop = asyncio.get_running_loop()
        mirror = loop.create_future()

        def copy(src) -> None:
            if mirror.done():
                return
            if src.cancelled():  # not by us; treat like a worker-side cancellation
                mirror.set_exception(self.job_cancelled_error("job future cancelled"))
                return
            exc = src.exception()
            if exc is not None:
                mirror.set_exception(exc)
            else:
                mirror.set_result(src.result())

        job.future.add_done_callback(lambda f: loop.call_soon_threadsafe(copy, f) if not loop.is_closed() else None)
        mirror.add_done_callback(_consume)
        while True:
            done, _ = await asyncio.wait({mirror}, timeout=WORKER_CHECK_S)
            if done:
                return mirror.result()
            if not self.worker_alive():
                # A dead worker never resolves the job: fail instead of hanging the request.
                self._worker_died()
                raise RuntimeError("engine worker thread is not running")

    def worker_alive(self) -> bool:
        # EngineWorker has no public liveness flag; its thread object is the ground truth.
        t = getattr(self.worker, "_thread", None)
        return t is None or t.is_alive()

    def _worker_died(self) -> None:
        if self.ready:
            log.error("engine worker thread died; completions are off until restart")
            self.ready = False
            self.error = "engine worker thread died (see the server log)"
            self.status("error", message=self.error)

    def generation_failed(self, exc: BaseException) -> None:
        """An engine error during a completion: tell the user (once per distinct error), keep serving."""
        message = f"kog: generation failed: {type(exc).__name__}: {exc}"
        self.status("error", message=message)
        if message not in self._reported:
            self._reported.add(message)
            self.ls.window_show_message(types.ShowMessageParams(type=types.MessageType.Error, message=message))

    def set_busy(self, busy: bool) -> None:
        self._busy += 1 if busy else -1
        if not self.ready:
            return
        state = "busy" if self._busy > 0 else "ready"
        if state != self.state:
            self.status(state)

    # ---- loading ----
    def start(self) -> None:
        """Start loading on a background thread (call from the event loop thread)."""
        self._loop = asyncio.get_running_loop() if _has_running_loop() else None
        self._thread = threading.Thread(target=self._load, name="kog-model-load", daemon=True)
        self._t0 = time.perf_counter()
        self._thread.start()

    def _load(self) -> None:
        o = self.options
        try:
            import engine as eng  # heavy: torch

            e = eng.Engine.load(model=o.model, device=o.device, backend=o.backend, tp=o.tp, tp_mode=o.tp_mode)
            # Read everything we need from the engine before the worker thread owns it.
            stats = e.stats()
            tokenizer = e.tokenizer
            worker = eng.EngineWorker(e)
        except BaseException as exc:  # noqa: BLE001 - any failure must reach the user, not kill the server
            log.exception("model load failed")
            self._post(self._on_failed, f"{type(exc).__name__}: {exc}")
            return
        self._post(self._on_loaded, eng, worker, tokenizer, stats)

    def _post(self, fn, *args) -> None:
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(fn, *args)
        else:
            fn(*args)

    def _on_loaded(self, eng, worker, tokenizer, stats) -> None:
        self._eng, self.worker, self.tokenizer, self.engine_stats = eng, worker, tokenizer, stats
        self.backend = stats.get("backend")
        self.backend_reason = stats.get("backend_reason")
        self.load_seconds = time.perf_counter() - self._t0
        self.ready = True
        self.loaded.set()
        self.prompt_format = prompt_format(tokenizer)
        log.info("model ready in %.1f s: backend=%s (%s) device=%s%s prompts=%s", self.load_seconds, self.backend,
                 self.backend_reason, stats.get("device"), tp_text(stats), self.prompt_format)
        if self._initialized:
            self._announce_end()

    def _on_failed(self, message: str) -> None:
        self.error = message
        self.loaded.set()
        if self._initialized:
            self._announce_end()

    # ---- client notifications ----
    def on_initialized(self) -> None:
        """The client is ready for server->client messages: progress + status."""
        self._initialized = True
        if self.loaded.is_set():
            self._announce_end()
            return
        self.status("loading", message=f"loading model {self.options.model}")
        caps = self.ls.client_capabilities
        if caps and caps.window and caps.window.work_done_progress:
            asyncio.ensure_future(self._progress())

    async def _progress(self) -> None:
        token = f"kog-load-{uuid.uuid4().hex[:8]}"
        try:
            await self.ls.work_done_progress.create_async(token)
        except Exception as exc:  # the client refused: status notifications still show the state
            log.info("client refused work done progress: %s", exc)
            return
        if self.loaded.is_set():
            self._end_progress(token)
            return
        self._progress_token = token
        self.ls.work_done_progress.begin(token, types.WorkDoneProgressBegin(
            title="kog: loading model", message=self.options.model, cancellable=False))
        while not self.loaded.is_set():
            await asyncio.sleep(1.0)
            if self.loaded.is_set() or self._progress_token is None:
                break
            self.ls.work_done_progress.report(token, types.WorkDoneProgressReport(
                message=f"{self.options.model}: {time.perf_counter() - self._t0:.0f} s"))

    def _end_progress(self, token: str) -> None:
        msg = f"ready ({self.backend}{tp_text(self.engine_stats)})" if self.ready else f"failed: {self.error}"
        self.ls.work_done_progress.end(token, types.WorkDoneProgressEnd(message=msg))

    def _announce_end(self) -> None:
        if self._progress_token is not None:
            token, self._progress_token = self._progress_token, None
            self._end_progress(token)
        if self.ready:
            wanted = self.options.backend
            if wanted != "auto" and self.backend != wanted:
                # The user asked for a backend that cannot run here: say so instead of silently falling back.
                self.ls.window_show_message(types.ShowMessageParams(
                    type=types.MessageType.Warning,
                    message=f"kog: backend {wanted!r} is not available here; using {self.backend!r} "
                            f"({self.backend_reason})"))
            self.status("ready", message=f"model ready in {self.load_seconds:.1f} s")
        else:
            # The message goes first: a client that reacts to the status sees the explanation already.
            self.ls.window_show_message(types.ShowMessageParams(
                type=types.MessageType.Error,
                message=f"kog: could not load model {self.options.model!r}: {self.error}. "
                        "Inline completions are off until the server is restarted with a working --model."))
            self.status("error", message=self.error)

    def status(self, state: str, **fields) -> None:
        """Send kog/status (fields override the defaults below)."""
        self.state = state
        params = {
            "state": state,
            "backend": self.backend,
            "reason": self.backend_reason if state != "error" else (self.error or self.backend_reason),
            "model": self.options.model,
            "message": None,
            "lastLatencyMs": self.stats.last_latency_ms,
            "tokPerS": self.stats.last_tok_s,
        }
        params.update(fields)
        try:
            self.ls.protocol.notify(STATUS_METHOD, params)
        except Exception as exc:  # no transport yet / closed pipe: status is best effort
            log.debug("kog/status not sent: %s", exc)

    def shutdown(self) -> None:
        if self.worker is not None:
            self.worker.shutdown()


def tp_text(stats: dict | None) -> str:
    """Suffix for status text: ' tp=2 exact' (and the last per-token exchange wait when known) for a
    tensor-parallel engine, '' otherwise."""
    if not stats or (stats.get("tp") or 1) <= 1:
        return ""
    text = f" tp={stats['tp']} {stats.get('tp_mode', 'exact')}"
    wait = (stats.get("backend_stats") or {}).get("exchange_wait_us")
    return text + (f" (exchange wait {wait:.1f} us/token)" if isinstance(wait, (int, float)) else "")


def _consume(fut) -> None:
    # Mark the outcome as retrieved: after a cancelled wait nobody else reads it.
    if not fut.cancelled():
        fut.exception()


class _NeverRaised(Exception):
    """Placeholder exception type for `except` before the engine module is imported."""


def _has_running_loop() -> bool:
    try:
        asyncio.get_running_loop()
        return True
    except RuntimeError:
        return False
