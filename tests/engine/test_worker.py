"""EngineWorker with real threads; ordering is forced with events, not sleeps."""
import asyncio
import threading

import pytest

from engine.worker import EngineWorker, JobCancelled, Priority

T = 5.0   # generous timeout for waits; tests finish in milliseconds


class FakeEngine:
    def generate(self):   # marks it as an engine, not a loader
        pass


def _gate(worker):
    """Occupy the worker until the returned event is set."""
    started, release = threading.Event(), threading.Event()

    def block(engine, cancel):
        started.set()
        release.wait(T)
        return "gate"
    job = worker.submit(block, Priority.COMPLETION)
    assert started.wait(T)
    return job, release


@pytest.fixture
def worker():
    w = EngineWorker(FakeEngine())
    yield w
    w.shutdown()


def test_runs_on_worker_thread_with_engine(worker):
    eng = worker.engine
    job = worker.submit(lambda e, c: (e is eng, threading.current_thread().name))
    assert job.future.result(T) == (True, "engine-worker")


def test_priority_then_fifo(worker):
    gate, release = _gate(worker)
    order = []
    jobs = [worker.submit(lambda e, c, n=n: order.append(n), p) for n, p in
            [("r1", Priority.REFACTOR), ("v1", Priority.REVIEW), ("c1", Priority.COMPLETION),
             ("v2", Priority.REVIEW), ("c2", Priority.COMPLETION)]]
    release.set()
    for j in jobs:
        j.future.result(T)
    assert order == ["c1", "c2", "v1", "v2", "r1"]


def test_cancel_queued_and_running(worker):
    gate, release = _gate(worker)
    queued = worker.submit(lambda e, c: "never")
    queued.cancel()
    with pytest.raises(JobCancelled):
        queued.future.result(T)
    release.set()
    gate.future.result(T)

    started = threading.Event()

    def long(e, cancel):
        started.set()
        assert cancel.wait(T)
        return "partial"
    running = worker.submit(long)
    assert started.wait(T)
    running.cancel()
    with pytest.raises(JobCancelled):
        running.future.result(T)


def test_newest_wins_by_key(worker):
    started = threading.Event()
    saw_cancel = threading.Event()

    def first(e, cancel):
        started.set()
        if cancel.wait(T):
            saw_cancel.set()
        return 1
    a = worker.submit(first, key="completion:a")
    assert started.wait(T)
    b = worker.submit(lambda e, c: 2, key="completion:a")   # cancels a (running)
    with pytest.raises(JobCancelled):
        a.future.result(T)
    assert saw_cancel.is_set() and b.future.result(T) == 2
    # Queued duplicates: only the newest runs.
    gate, release = _gate(worker)
    q1 = worker.submit(lambda e, c: "q1", key="k")
    q2 = worker.submit(lambda e, c: "q2", key="k")
    other = worker.submit(lambda e, c: "other", key="j")
    release.set()
    with pytest.raises(JobCancelled):
        q1.future.result(T)
    assert q2.future.result(T) == "q2" and other.future.result(T) == "other"


def test_completion_preempts_and_requeues(worker):
    runs = []
    first_run = threading.Event()

    def review(e, cancel):
        runs.append("start")
        if len(runs) == 1:
            first_run.set()
            assert cancel.wait(T)       # preempted
            return "stale"
        return "done"
    job = worker.submit(review, Priority.REVIEW, key="review:a", preemptible=True)
    assert first_run.wait(T)
    comp = worker.submit(lambda e, c: runs.append("completion") or "c", Priority.COMPLETION)
    assert comp.future.result(T) == "c"
    assert job.future.result(T) == "done"
    assert runs == ["start", "completion", "start"] and job.runs == 2 and worker.preemptions == 1


def test_non_preemptible_not_interrupted(worker):
    started, release = threading.Event(), threading.Event()
    cancelled = []

    def refactor(e, cancel):
        started.set()
        release.wait(T)
        cancelled.append(cancel.is_set())
        return "r"
    r = worker.submit(refactor, Priority.REFACTOR)
    assert started.wait(T)
    c = worker.submit(lambda e, cc: "c", Priority.COMPLETION)
    release.set()
    assert r.future.result(T) == "r" and c.future.result(T) == "c" and cancelled == [False]


def test_exception_propagates(worker):
    def boom(e, c):
        raise KeyError("x")
    with pytest.raises(KeyError):
        worker.submit(boom).future.result(T)
    assert worker.submit(lambda e, c: 5).future.result(T) == 5   # the thread survived


def test_await_job(worker):
    async def main():
        return await worker.submit(lambda e, c: 42)
    assert asyncio.run(main()) == 42

    async def cancelled():
        gate, release = _gate(worker)
        j = worker.submit(lambda e, c: 1)
        j.cancel()
        release.set()
        await j
    with pytest.raises(JobCancelled):
        asyncio.run(cancelled())


def test_loader_runs_on_thread_and_errors_reach_jobs():
    threads = []

    def loader():
        threads.append(threading.current_thread().name)
        return FakeEngine()
    w = EngineWorker(loader)
    assert w.ready.wait(T) and threads == ["engine-worker"]
    assert isinstance(w.submit(lambda e, c: e).future.result(T), FakeEngine)
    w.shutdown()

    def bad():
        raise ValueError("the default model is missing")
    w2 = EngineWorker(bad)
    assert w2.ready.wait(T) and isinstance(w2.load_error, ValueError)
    with pytest.raises(RuntimeError, match="default model is missing"):
        w2.submit(lambda e, c: 1).future.result(T)
    w2.shutdown()


def test_shutdown_cancels_pending():
    w = EngineWorker(FakeEngine())
    gate, release = _gate(w)
    q = w.submit(lambda e, c: 1)
    w.shutdown(wait=False)
    with pytest.raises(JobCancelled):
        q.future.result(T)
    release.set()
    with pytest.raises(JobCancelled):
        gate.future.result(T)
    with pytest.raises(RuntimeError):
        w.submit(lambda e, c: 1)


def test_real_engine_generation_cancelled_by_newer(tiny_qwen):
    from engine import Engine
    eng = Engine.load(str(tiny_qwen), device="cpu", max_seq_len=256)
    w = EngineWorker(eng)
    ids = eng.tokenizer.encode("def main(argv):\n")
    first_token, newer_submitted = threading.Event(), threading.Event()

    def gen(e, cancel):
        for ev in e.generate(ids, max_new_tokens=200, stop_ids=(), cancel=cancel):
            first_token.set()
            newer_submitted.wait(T)   # hold here so the newer job surely arrives mid-generation
        return e.last_result
    a = w.submit(gen, key="completion:f")
    assert first_token.wait(T)
    b = w.submit(lambda e, c: e.complete(ids, max_new_tokens=3, stop_ids=(), cancel=c), key="completion:f")
    newer_submitted.set()
    with pytest.raises(JobCancelled):
        a.future.result(T)
    rb = b.future.result(T)
    assert rb.finish_reason == "length" and rb.reused_tokens == len(ids) - 1
    w.shutdown()


def test_cancelling_the_awaiting_task_cancels_the_job_and_keeps_the_worker_alive(worker):
    """An asyncio task awaiting a running job is cancelled (as $/cancelRequest does): the job's cancel event is
    set, the worker thread survives, and later jobs still run."""
    started, saw_cancel = threading.Event(), threading.Event()

    def long_job(engine, cancel):
        started.set()
        if cancel.wait(T):
            saw_cancel.set()
        return "finished"

    async def main():
        task = asyncio.ensure_future(worker.submit(long_job))
        await asyncio.get_running_loop().run_in_executor(None, started.wait, T)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    asyncio.run(main())
    assert saw_cancel.wait(T)
    assert worker.submit(lambda e, c: "alive").result(T) == "alive"


def test_future_cancelled_directly_does_not_kill_the_worker(worker):
    gate, release = _gate(worker)
    queued = worker.submit(lambda e, c: 1)
    assert gate.future.cancel() is True       # nobody told the worker
    assert queued.future.cancel() is True
    release.set()
    assert worker.submit(lambda e, c: "alive").result(T) == "alive"
