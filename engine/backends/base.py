"""Backend interface: every backend reads and writes the one KV layout of engine/kv_cache.py."""
from __future__ import annotations

import threading
from typing import Iterator

import torch

from ..sampling import SamplingParams, sample


class BackendUnavailable(RuntimeError):
    """Raised by a backend that cannot run here; the message is the reason reported in stats()."""


class Backend:
    name = "base"

    supports_tp = False    # True for backends that implement tp > 1 / tp_mode="delayed"

    def __init__(self, model, cache, tp: int = 1, tp_mode: str = "exact"):
        self.model = model     # engine.model.Model (weights + reference forward)
        self.cache = cache     # engine.kv_cache.KVCache
        self.tp, self.tp_mode = tp, tp_mode

    def prefill(self, slot: int, ids: torch.Tensor, start_pos: int, all_logits: bool = False) -> torch.Tensor:
        """ids: LongTensor [T] on the model device, positions start_pos.. -> fp32 [T, V] or [V]; writes KV.

        Only all_logits (scoring) needs every row; completion asks for the last one, which lets a backend skip
        the LM head elsewhere and replay a padded CUDA graph (graph.PrefillGraphs). The K/V of positions past
        start_pos + T may be overwritten (a padded chunk's tail): they are not valid for the slot, and every
        reader masks them."""
        raise NotImplementedError

    def decode(self, slot: int, token: int, pos: int) -> torch.Tensor:
        """One token at position pos -> fp32 logits [V]; writes its KV at pos."""
        raise NotImplementedError

    def decode_loop(self, slot: int, token: int, pos: int, max_new: int, sampling: SamplingParams,
                    stop_ids: frozenset[int], cancel: threading.Event | None,
                    generator: torch.Generator | None = None) -> Iterator[int]:
        """Feed `token` (already sampled, not yet in the cache) at `pos`, then sample and yield up to `max_new`
        tokens. Yielding the n-th token means the KV of every earlier token, including `token`, is written, so
        the caller may record them. A stop id is yielded, then the loop ends. Checks `cancel` before each step
        and returns without yielding when it is set.
        """
        for i in range(max_new):
            if cancel is not None and cancel.is_set():
                return
            logits = self.decode(slot, token, pos + i)
            token = sample(logits, sampling, generator)
            yield token
            if token in stop_ids:
                return

    def stats(self) -> dict:
        """Backend-specific counters, reported under engine.stats()["backend_stats"] (a subclass may also keep
        a plain dict attribute named `stats`; the engine accepts both)."""
        return {}

    def describe(self) -> str:
        """One line for stats()["backend_detail"] and the logs."""
        return self.name
