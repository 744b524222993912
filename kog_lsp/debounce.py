"""Per-document debounce for automatic inline completions, built on asyncio-throttle.

Each document has a Throttler(rate_limit=1, period=debounceMs): at most one generation *starts* per
period per document. The first keystroke after a pause starts at once (no added latency); keystrokes
inside the period wait for its end, and a newer request supersedes (cancels) an older one still waiting,
so the last keystroke of a burst always gets served (leading + trailing edge). debounceMs = 0 disables it.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict

from asyncio_throttle import Throttler


class Superseded(Exception):
    """A newer request for the same document replaced this one while it waited."""


class Debouncer:
    def __init__(self, period_ms: int, max_docs: int = 256):
        self.period_ms = period_ms
        self._throttlers: OrderedDict[str, Throttler] = OrderedDict()
        self._waiting: dict[str, asyncio.Future] = {}
        self._max_docs = max_docs

    def set_period(self, period_ms: int) -> None:
        if period_ms != self.period_ms:
            self.period_ms = period_ms
            self._throttlers.clear()  # new period: start fresh windows

    def _throttler(self, key: str) -> Throttler:
        t = self._throttlers.get(key)
        if t is None:
            # retry_interval bounds how late a waiter notices the window opened; keep it small.
            t = Throttler(rate_limit=1, period=self.period_ms / 1000.0, retry_interval=0.002)
            self._throttlers[key] = t
            if len(self._throttlers) > self._max_docs:
                self._throttlers.popitem(last=False)
        else:
            self._throttlers.move_to_end(key)
        return t

    def supersede(self, key: str) -> None:
        """Cancel the request waiting for `key` (a newer one arrived)."""
        w = self._waiting.pop(key, None)
        if w is not None and not w.done():
            w.cancel()

    async def wait(self, key: str) -> None:
        """Wait for this document's window. Raises Superseded if a newer request replaced this one;
        a cancellation of the calling task itself propagates as CancelledError."""
        if self.period_ms <= 0:
            return
        self.supersede(key)
        waiter = asyncio.ensure_future(self._throttler(key).acquire())
        self._waiting[key] = waiter
        try:
            await waiter
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                waiter.cancel()
                raise  # our own request was cancelled ($/cancelRequest)
            raise Superseded() from None
        finally:
            if self._waiting.get(key) is waiter:
                del self._waiting[key]
