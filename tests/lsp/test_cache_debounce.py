import asyncio
import time

import pytest

from kog_lsp.debounce import Debouncer, Superseded
from kog_lsp.stats import Stats, percentile
from kog_lsp.suggest_cache import SuggestionCache


def test_cache_typing_into_ghost_text():
    c = SuggestionCache()
    c.put("u", "def f(", ")\n", "x, y", False)
    assert c.lookup("u", "def f(", ")\n") == ("x, y", False)
    assert c.lookup("u", "def f(x", ")\n") == (", y", False)
    assert c.lookup("u", "def f(x, ", ")\n") == ("y", False)
    assert c.lookup("u", "def f(x, y", ")\n") is None  # fully typed: nothing left
    assert c.lookup("u", "def f(z", ")\n") is None  # diverged
    assert c.lookup("u", "def f(x", "\n") is None  # text after the cursor changed
    assert c.lookup("other", "def f(x", ")\n") is None
    assert c.lookup("u", "def f(x,", ")\n") == (" y", False)
    c.put("u", "a", "", "bc  ", True)
    assert c.lookup("u", "abc", "") is None  # whitespace-only rest is not a suggestion


def test_cache_is_bounded_lru():
    c = SuggestionCache(max_entries=3)
    for i in range(5):
        c.put("u", f"p{i}", "", "suffix", False)
    assert len(c) == 3 and c.lookup("u", "p0", "") is None and c.lookup("u", "p4s", "") == ("uffix", False)
    c.forget("u")
    assert len(c) == 0


async def test_debounce_leading_edge_then_waits():
    d = Debouncer(80)
    t0 = time.perf_counter()
    await d.wait("doc")
    assert time.perf_counter() - t0 < 0.03  # first request after a pause starts at once
    await d.wait("doc")
    assert time.perf_counter() - t0 >= 0.075  # the next one waits for the window
    await d.wait("other")  # windows are per document


async def test_debounce_newer_request_supersedes_waiting_one():
    d = Debouncer(100)
    await d.wait("doc")
    first = asyncio.ensure_future(d.wait("doc"))
    await asyncio.sleep(0.01)
    second = asyncio.ensure_future(d.wait("doc"))
    with pytest.raises(Superseded):
        await first
    await second  # the newest one gets the window


async def test_debounce_own_cancellation_propagates_and_zero_disables():
    d = Debouncer(200)
    await d.wait("doc")
    task = asyncio.ensure_future(d.wait("doc"))
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    d.set_period(0)
    t0 = time.perf_counter()
    for _ in range(5):
        await d.wait("doc")
    assert time.perf_counter() - t0 < 0.02


def test_stats_snapshot():
    s = Stats()
    assert s.snapshot(None)["latencyMs"] == {"p50": None, "p95": None, "count": 0}
    for ms in range(1, 101):
        s.add_latency(float(ms))
    s.add_generation(100, 90, 50.0)
    s.bump("cache_hits", 2)
    snap = s.snapshot({"backend": "reference"})
    assert snap["latencyMs"]["p50"] == 50.0 and snap["latencyMs"]["p95"] == 95.0
    assert snap["prefixCacheHitRate"] == 0.9 and snap["cacheHits"] == 2 and snap["tokPerS"] == 50.0
    assert percentile([3.0], 95) == 3.0


def test_cache_keeps_a_window_of_large_documents():
    from kog_lsp.suggest_cache import WINDOW

    big = "x = 1\n" * 50_000
    c = SuggestionCache()
    c.put("u", big, "\n" + big, "print(x)", False)
    entry = next(iter(c._entries.values()))
    assert len(entry.before_tail) == WINDOW and len(entry.after_head) == WINDOW
    assert c.lookup("u", big + "pri", "\n" + big) == ("nt(x)", False)
    assert c.lookup("u", big[:-6] + "y = 1\n" + "pri", "\n" + big) is None  # same-length edit near the cursor
