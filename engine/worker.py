"""EngineWorker: one daemon thread owns the engine and runs jobs by priority, with cancellation and preemption.

- Lower Priority value runs first; FIFO within a priority.
- A job with the same `key` as an older queued/running job cancels that one (newest wins).
- A COMPLETION submitted while a `preemptible` job runs cancels that run and requeues the job; it restarts later
  (the prefix cache makes the restart cheap) keeping its place in its priority class.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import heapq
import itertools
import logging
import threading
from enum import IntEnum
from typing import Any, Callable

log = logging.getLogger("engine")


class Priority(IntEnum):
    COMPLETION = 0
    REVIEW = 1
    REFACTOR = 2


class JobCancelled(Exception):
    """The job was cancelled (by job.cancel(), a newer job with the same key, or shutdown)."""


def _settle(future: concurrent.futures.Future, result: Any = None, error: BaseException | None = None) -> None:
    """Set a job's outcome unless someone already cancelled the future directly (job.future.cancel()):
    a settled future must never kill the worker thread."""
    if future.done():
        log.debug("job future already settled (%s); outcome dropped", "cancelled" if future.cancelled() else "done")
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


class Job:
    def __init__(self, worker: "EngineWorker", fn: Callable, priority: Priority, key: str | None, preemptible: bool,
                 seq: int):
        self._worker = worker
        self.fn = fn
        self.priority = Priority(priority)
        self.key = key
        self.preemptible = preemptible
        self.seq = seq
        self.future: concurrent.futures.Future = concurrent.futures.Future()
        self.cancel_event = threading.Event()
        self.cancelled = False       # by the user / newest-wins: never requeued
        self.preempted = False       # current run was cancelled to make room; requeue after it stops
        self.runs = 0                # how many times fn started (restarts after preemption count)

    def cancel(self) -> None:
        self._worker._cancel(self)

    def done(self) -> bool:
        return self.future.done()

    def result(self, timeout: float | None = None) -> Any:
        return self.future.result(timeout)

    def __await__(self):
        return self._wait().__await__()

    async def _wait(self) -> Any:
        # shield: cancelling the awaiting task must not cancel the concurrent future behind the worker's back
        # (the worker would later find it settled); it cancels the job instead, which stops the engine promptly.
        try:
            return await asyncio.shield(asyncio.wrap_future(self.future))
        except asyncio.CancelledError:
            self.cancel()
            raise

    def __lt__(self, other: "Job") -> bool:
        return (self.priority, self.seq) < (other.priority, other.seq)

    def __repr__(self) -> str:
        return f"Job(#{self.seq} {self.priority.name} key={self.key!r})"


class EngineWorker:
    def __init__(self, engine_or_loader, name: str = "engine-worker"):
        """engine_or_loader: an Engine, or a zero-argument callable returning one (called on the worker thread,
        so loading does not block the caller; `ready` is set when it finishes, `load_error` holds a failure)."""
        self._cv = threading.Condition()
        self._queue: list[Job] = []
        self._running: Job | None = None
        self._seq = itertools.count()
        self._stop = False
        self.engine = None
        self.load_error: BaseException | None = None
        self.ready = threading.Event()
        self.completed = 0
        self.cancelled = 0
        self.preemptions = 0
        if callable(engine_or_loader) and not hasattr(engine_or_loader, "generate"):
            self._loader = engine_or_loader
        else:
            self._loader = None
            self.engine = engine_or_loader
            self.ready.set()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    # ---- public ----
    def submit(self, fn: Callable, priority: Priority = Priority.COMPLETION, key: str | None = None,
               preemptible: bool = False) -> Job:
        with self._cv:
            if self._stop:
                raise RuntimeError("worker is shut down")
            job = Job(self, fn, priority, key, preemptible, next(self._seq))
            if key is not None:
                for old in [j for j in self._queue if j.key == key]:
                    self._drop_queued(old)
                r = self._running
                if r is not None and r.key == key:
                    r.cancelled = True
                    r.cancel_event.set()
            r = self._running
            if (job.priority == Priority.COMPLETION and r is not None and r.preemptible and not r.cancelled
                    and r.priority > Priority.COMPLETION):
                r.preempted = True
                r.cancel_event.set()
            heapq.heappush(self._queue, job)
            self._cv.notify_all()
        return job

    def shutdown(self, wait: bool = True, timeout: float | None = 10.0) -> None:
        with self._cv:
            self._stop = True
            for j in list(self._queue):
                self._drop_queued(j)
            if self._running is not None:
                self._running.cancelled = True
                self._running.cancel_event.set()
            self._cv.notify_all()
        if wait and threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    def pending(self) -> int:
        with self._cv:
            return len(self._queue)

    @property
    def running(self) -> Job | None:
        return self._running

    # ---- internals ----
    def _drop_queued(self, job: Job) -> None:
        """Caller holds the lock."""
        self._queue.remove(job)
        heapq.heapify(self._queue)
        job.cancelled = True
        job.cancel_event.set()
        self.cancelled += 1
        _settle(job.future, error=JobCancelled(f"{job!r} cancelled before it ran"))

    def _cancel(self, job: Job) -> None:
        with self._cv:
            if job.future.done():
                return
            if job in self._queue:
                self._drop_queued(job)
            elif job is self._running:
                job.cancelled = True
                job.cancel_event.set()

    def _run(self) -> None:
        if self._loader is not None:
            try:
                self.engine = self._loader()
            except BaseException as e:  # report to every job instead of dying silently
                self.load_error = e
                log.exception("engine failed to load")
            finally:
                self.ready.set()
        while True:
            with self._cv:
                while not self._queue and not self._stop:
                    self._cv.wait()
                if self._stop and not self._queue:
                    return
                job = heapq.heappop(self._queue)
                job.cancel_event = threading.Event()   # a fresh event per run (a preempted job restarts)
                job.preempted = False
                self._running = job
            self._execute(job)

    def _execute(self, job: Job) -> None:
        result, error = None, None
        if self.load_error is not None:
            error = RuntimeError(f"engine failed to load: {self.load_error}")
        else:
            job.runs += 1
            try:
                result = job.fn(self.engine, job.cancel_event)
            except BaseException as e:  # the job's failure belongs to its future, not to the worker thread
                error = e
        with self._cv:
            self._running = None
            if job.cancelled:
                self.cancelled += 1
                _settle(job.future, error=JobCancelled(f"{job!r} cancelled"))
            elif job.preempted and not self._stop:
                self.preemptions += 1
                heapq.heappush(self._queue, job)     # same (priority, seq): keeps its place
                log.debug("%r preempted by a completion; requeued", job)
            elif error is not None:
                if isinstance(error, JobCancelled):
                    self.cancelled += 1
                _settle(job.future, error=error)
            else:
                self.completed += 1
                _settle(job.future, result=result)
            self._cv.notify_all()
