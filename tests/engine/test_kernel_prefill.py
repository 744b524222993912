"""Short prefill chunks as kernel steps (engine/backends/kernel_prefill.py, MonokernelBackend.prefill): the break-even
rule, the routing between the kernel and the graphs, and the warm-up timing, with a stand-in kernel (the GPU test
is tests/gpu/test_monokernel.py::test_engine_short_chunks_prefill_as_kernel_steps)."""
import types

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from engine.backends import kernel_prefill
from engine.backends.monokernel import MonokernelBackend

V = 11


def test_limit_is_the_break_even_chunk():
    # 1.5B-like: a launch costs 0.4 ms + 1.1 ms per step, the graph 3.8 ms whatever the chunk: 3 tokens
    assert kernel_prefill.limit(3.8, 1.5, 2.6) == 3
    assert kernel_prefill.limit(2.7, 0.7, 1.25) == 4        # 0.5B-like
    assert kernel_prefill.limit(1.0, 1.5, 2.6) == 0          # the graph is faster even for one token
    assert kernel_prefill.limit(50.0, 0.1, 0.2) == kernel_prefill.CAP
    # noise (two steps timed faster than one): a step still counts for a quarter of the one-step launch
    assert kernel_prefill.limit(1.6, 1.0, 0.9) == 3           # 0.75 ms + 0.25 ms per step


@given(st.floats(0.1, 20), st.floats(0.05, 5), st.floats(0.05, 5))
def test_limit_picks_only_chunks_predicted_faster(graph, one, two):
    n = kernel_prefill.limit(graph, one, two)
    step = max(two - one, 0.25 * one)
    fixed = max(one - step, 0.0)
    assert 0 <= n <= kernel_prefill.CAP
    if n:
        assert fixed + n * step < graph
    if n < kernel_prefill.CAP:
        assert fixed + (n + 1) * step >= graph


class _Kernel:
    """Records launches; step j's logits are all j + 10 * (input token of step j)."""

    def __init__(self):
        self.launches = []

    def launch(self, slot, token, pos, n, forced=None, logits_out=None):
        self.launches.append((slot, token, pos, n, forced))
        toks = forced if forced is not None else [token]
        for j in range(n):
            logits_out[j].fill_(j + 10 * toks[j])

    def wait(self):
        pass


class _Graphs:
    def __init__(self):
        self.calls = []

    def prefill(self, slot, ids, start_pos, all_logits=False):
        self.calls.append((slot, ids.tolist(), start_pos, all_logits))
        return torch.full((ids.shape[0], V) if all_logits else (V,), -1.0)

    def stats(self):
        return {"prefill_graph_calls": len(self.calls)}


def _backend(limit):
    be = object.__new__(MonokernelBackend)
    be.mk, be.prefill_graphs = _Kernel(), _Graphs()
    be.stats = {"launches": 0, "kernel_prefills": 0, "kernel_prefill_max": limit}
    be.kernel_prefill_max = limit
    be._logits = torch.empty(1, V)
    be._chunk_logits = torch.empty(kernel_prefill.CAP, V)
    return be


def test_short_chunks_run_as_kernel_steps_and_the_rest_on_the_graphs():
    be = _backend(3)
    out = be.prefill(2, torch.tensor([5, 6, 7]), 40)
    assert be.mk.launches == [(2, 5, 40, 3, [5, 6, 7])]          # teacher-forced, from the chunk's first token
    assert torch.equal(out, torch.full((V,), 2.0 + 70))          # the last step's logits
    assert be.stats["kernel_prefills"] == 1 and be.stats["launches"] == 1 and be.prefill_graphs.calls == []
    out = be.prefill(2, torch.tensor([8]), 43)
    assert be.mk.launches[-1] == (2, 8, 43, 1, None) and torch.equal(out, torch.full((V,), 80.0))
    be.prefill(2, torch.tensor([1, 2, 3, 4]), 44)                # longer than the limit
    be.prefill(2, torch.tensor([1, 2]), 44, all_logits=True)     # scoring needs every row
    assert be.prefill_graphs.calls == [(2, [1, 2, 3, 4], 44, False), (2, [1, 2], 44, True)]
    assert len(be.mk.launches) == 2 and be.stats["kernel_prefills"] == 2
    assert torch.equal(be.decode(1, 9, 50), torch.full((V,), 90.0))   # decode: the one-step case, not forced
    assert be.mk.launches[-1] == (1, 9, 50, 1, None) and be.stats["kernel_prefills"] == 2


def test_no_kernel_prefill_before_the_warmup_timing():
    be = _backend(0)
    be.prefill(0, torch.tensor([3]), 10)
    assert be.mk.launches == [] and be.prefill_graphs.calls == [(0, [3], 10, False)]


@pytest.mark.parametrize("times,want", [((3.8, 1.5, 2.6), 3), ((1.0, 1.5, 2.6), 0)])
def test_warmup_timing_sets_the_limit_and_says_so(monkeypatch, caplog, times, want):
    be = _backend(0)
    be.model = types.SimpleNamespace(device=torch.device("cpu"))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    calls = []

    def timer(fn, sync):
        fn()
        sync()
        calls.append(len(be.mk.launches))
        return times[len(calls) - 1]
    with caplog.at_level("INFO", logger="engine"):
        be._time_kernel_prefill(timer)
    assert calls == [0, 1, 2]                                    # graph, then 1 and 2 kernel steps
    assert be.mk.launches == [(0, 0, 0, 1, None), (0, 0, 0, 2, [0, 0])]
    assert be.kernel_prefill_max == want and be.stats["kernel_prefill_max"] == want
    assert be.stats["kernel_prefill_ms"] == {"graph_1_token": times[0], "kernel_1_step": times[1],
                                             "kernel_2_steps": times[2]}
    assert be.stats["launches"] == 0                             # timing launches serve no request
    assert any(f"chunks of up to {want} tokens" in r.getMessage() for r in caplog.records)
