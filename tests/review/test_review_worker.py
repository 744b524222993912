"""Review jobs on the real EngineWorker: a completion pre-empts a running review, which restarts and still gives
the same findings (windows finished before the pre-emption come from the scorer's cache)."""

import threading
import time

from kog_lsp.review import ReviewOptions, WindowedScorer, review_document

SNIPPET = (
    "def scale(values, factor):\n"
    "    out = []\n"
    "    for v in values:\n"
    "        out.append(v * factor)\n"
    "    return out\n\n"
)


def test_completion_preempts_review_and_review_restarts(tiny_engine):
    from engine import EngineWorker, Priority

    text = "".join(SNIPPET.replace("scale", f"scale{k}") for k in range(40))
    opts = ReviewOptions(min_surprisal_bits=0.0, min_top_prob=0.0)
    scorer = WindowedScorer(window=256, context=32)
    worker = EngineWorker(tiny_engine)
    started = threading.Event()

    def review(engine, cancel):
        started.set()
        return review_document(engine, text, "python", opts, scorer, cancel)

    try:
        rjob = worker.submit(review, priority=Priority.REVIEW, key="review:x", preemptible=True)
        assert started.wait(30)
        deadline = time.monotonic() + 60
        while scorer.windows_scored < 1 and time.monotonic() < deadline:  # let the first window finish
            time.sleep(0.001)
        ids = tiny_engine.tokenizer.encode("def f(x):\n    return")
        t0 = time.perf_counter()
        cjob = worker.submit(lambda e, c: e.complete(ids, max_new_tokens=4), priority=Priority.COMPLETION,
                             key="completion:x")
        cjob.result(timeout=60)
        completion_s = time.perf_counter() - t0
        assert not rjob.done(), "the review should still be pending when the completion is answered"
        findings = rjob.result(timeout=300)
        assert worker.preemptions >= 1 and rjob.runs >= 2
    finally:
        worker.shutdown()
    # The pre-emption cost the completion at most one score chunk of waiting, far less than the whole review.
    assert completion_s < 30
    assert scorer.windows_cached >= 1  # the restart reused windows scored before the pre-emption
    fresh = review_document(tiny_engine, text, "python", opts, WindowedScorer(window=256, context=32))
    assert [(f.line, f.actual, f.expected) for f in findings] == [(f.line, f.actual, f.expected) for f in fresh]
