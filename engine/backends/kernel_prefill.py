"""Short prefill chunks as teacher-forced steps of the decode kernel (MonokernelBackend.prefill).

While typing, most requests add one or two tokens past the cached prompt (an SPM prompt ends at the cursor:
bench/NOTES.md session 35 counts 93 % of the editor loop's requests at <= 2 tokens). The graph prefill costs the
same for 1 token as for 32, its smallest bucket (~30 launches per layer: 2.7 ms on the 0.5B shape, 3.8 on 1.5B),
while a kernel launch costs a fixed part plus one decode step per token. The backend times both once at warm-up
and sends chunks up to the break-even length to the kernel.
"""
from __future__ import annotations

import statistics
import time
from typing import Callable

CAP = 8   # the longest chunk the kernel may take (rows of the backend's logits buffer)


def limit(graph_ms: float, one_ms: float, two_ms: float, cap: int = CAP) -> int:
    """The longest chunk (0..cap tokens) whose kernel launch is predicted faster than the graph prefill. A launch of
    n steps costs fixed + n * step, both from the one- and two-step timings; timing noise never makes a step count
    for less than a quarter of a one-step launch."""
    step = max(two_ms - one_ms, 0.25 * one_ms)
    fixed = max(one_ms - step, 0.0)
    n = 0
    while n < cap and fixed + (n + 1) * step < graph_ms:
        n += 1
    return n


def median_ms(fn: Callable[[], object], sync: Callable[[], None], reps: int = 5) -> float:
    """Median wall time of fn() in ms, synchronised after each call (one untimed call first)."""
    fn()
    sync()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)
