"""KV cache with prefix reuse: a small LRU of slots, each remembering which token ids its KV holds.

Layout (the contract): k, v = [n_slots, n_layers, n_kv_heads, max_len, head_dim], keys stored after RoPE.
Memory is bounded by n_slots x max_len. A slot's `ids` lists exactly the tokens whose KV has been written,
so a cancelled or stopped generation leaves the slot consistent.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class Slot:
    ids: list[int] = field(default_factory=list)   # tokens whose K/V are valid at positions 0..len-1
    last_used: int = 0
    # scores[i] = (logprob of ids[i+1], top_id, top_logprob) predicted at position i; valid for a prefix only.
    scores: list[tuple[float, int, float]] = field(default_factory=list)


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    # Compare in chunks first: prompts share thousands of tokens, a per-element Python loop would dominate.
    step = 256
    while i + step <= n and a[i:i + step] == b[i:i + step]:
        i += step
    while i < n and a[i] == b[i]:
        i += 1
    return i


class KVCache:
    def __init__(self, n_slots: int, n_layers: int, n_kv_heads: int, max_len: int, head_dim: int,
                 dtype=torch.float32, device="cpu"):
        if n_slots < 1:
            raise ValueError("kv_slots must be >= 1")
        shape = (n_slots, n_layers, n_kv_heads, max_len, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.max_len = max_len
        self.slots = [Slot() for _ in range(n_slots)]
        self._clock = 0
        self.hits = 0
        self.misses = 0
        self.reused_tokens = 0
        self.prefilled_tokens = 0

    @property
    def n_slots(self) -> int:
        return len(self.slots)

    def nbytes(self) -> int:
        return 2 * self.k.numel() * self.k.element_size()

    def acquire(self, ids: list[int]) -> tuple[int, int]:
        """Pick a slot for `ids`; returns (slot, lcp): the slot's KV is valid for ids[:lcp].

        The slot with the longest common prefix wins. If using it in place would throw away most of what it
        holds (another document that shares only a head of context), that prefix is copied into the least
        recently used slot instead, so switching between two documents keeps both cached.
        """
        if len(ids) > self.max_len:
            raise ValueError(f"sequence of {len(ids)} tokens exceeds max_seq_len {self.max_len}")
        self._clock += 1
        best, best_lcp = 0, -1
        for i, s in enumerate(self.slots):
            lcp = common_prefix(s.ids, ids)
            if lcp > best_lcp or (lcp == best_lcp and s.last_used < self.slots[best].last_used):
                best, best_lcp = i, lcp
        lru = min(range(self.n_slots), key=lambda i: (len(self.slots[i].ids) > 0, self.slots[i].last_used))
        slot = best
        if best_lcp == 0:
            slot = lru
        elif best_lcp * 2 < len(self.slots[best].ids) and lru != best:
            n = best_lcp
            self.k[lru, :, :, :n].copy_(self.k[best, :, :, :n])
            self.v[lru, :, :, :n].copy_(self.v[best, :, :, :n])
            self.slots[lru].ids = self.slots[best].ids[:n]
            self.slots[lru].scores = self.slots[best].scores[:max(0, n - 1)]
            slot = lru
        s = self.slots[slot]
        s.last_used = self._clock
        lcp = max(best_lcp, 0)
        self.truncate(slot, lcp)
        return slot, lcp

    def truncate(self, slot: int, n: int) -> None:
        s = self.slots[slot]
        del s.ids[n:]
        # A score at position i predicts ids[i+1]: it stays valid while ids[:i+2] is unchanged.
        del s.scores[max(0, n - 1):]

    def record(self, slot: int, ids: list[int]) -> None:
        """The KV of `ids` (extending the slot's current ids) has been written."""
        self.slots[slot].ids.extend(ids)

    def reset(self) -> None:
        for s in self.slots:
            s.ids.clear()
            s.scores.clear()
