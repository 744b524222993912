"""Server-side counters and latency samples (the `kog/stats` request)."""

from __future__ import annotations

import math
import threading
from collections import deque


def percentile(samples, q: float) -> float | None:
    """Nearest-rank percentile (q in [0, 100]) of a sequence; None when empty."""
    xs = sorted(samples)
    if not xs:
        return None
    k = max(0, min(len(xs) - 1, math.ceil(q / 100.0 * len(xs)) - 1))
    return xs[k]


class Stats:
    """Counters the features bump; latencies in ms from request arrival to answer (bounded window)."""

    def __init__(self, window: int = 2048):
        self._lock = threading.Lock()
        self.latencies_ms: deque[float] = deque(maxlen=window)
        self.tok_s: deque[float] = deque(maxlen=64)
        self.completions = 0  # requests answered with at least one item
        self.empty = 0  # requests answered with no item (not ready, disabled, junk filtered)
        self.cancellations = 0  # requests cancelled ($/cancelRequest or superseded)
        self.cache_hits = 0  # answered from the suggestion cache (no engine call)
        self.accepted = 0  # kog.accepted commands
        self.generations = 0  # engine generations run for completions
        self.errors = 0
        self.prompt_tokens = 0
        self.reused_tokens = 0
        self.last_latency_ms: float | None = None

    def add_latency(self, ms: float) -> None:
        with self._lock:
            self.latencies_ms.append(ms)
            self.last_latency_ms = ms

    def add_generation(self, prompt_tokens: int, reused_tokens: int, tok_s: float | None) -> None:
        with self._lock:
            self.generations += 1
            self.prompt_tokens += prompt_tokens
            self.reused_tokens += reused_tokens
            if tok_s:
                self.tok_s.append(tok_s)

    def bump(self, name: str, n: int = 1) -> None:
        with self._lock:
            setattr(self, name, getattr(self, name) + n)

    @property
    def last_tok_s(self) -> float | None:
        return self.tok_s[-1] if self.tok_s else None

    def snapshot(self, engine_stats: dict | None) -> dict:
        with self._lock:
            lat = list(self.latencies_ms)
            tok = list(self.tok_s)
            reuse = self.reused_tokens / self.prompt_tokens if self.prompt_tokens else None
            return {
                "latencyMs": {"p50": percentile(lat, 50), "p95": percentile(lat, 95), "count": len(lat)},
                "tokPerS": (sum(tok) / len(tok)) if tok else None,
                # Share of prompt tokens served from the engine's prefix KV cache (not prefilled again).
                "prefixCacheHitRate": reuse,
                "completions": self.completions,
                "emptyResults": self.empty,
                "cancellations": self.cancellations,
                "cacheHits": self.cache_hits,
                "accepted": self.accepted,
                "generations": self.generations,
                "errors": self.errors,
                "engine": engine_stats,
            }
