"""Reference backend: the plain-torch model, eager, on CPU or GPU."""
from __future__ import annotations

import torch

from .base import Backend


class ReferenceBackend(Backend):
    name = "reference"

    def prefill(self, slot, ids, start_pos, all_logits=False):
        return self.model.forward(self.cache.k, self.cache.v, slot, ids, start_pos, all_logits)

    def decode(self, slot, token, pos):
        # Reuse one small tensor for the token id: no per-step allocation on the host side.
        buf = getattr(self, "_tok", None)
        if buf is None:
            buf = self._tok = torch.zeros(1, dtype=torch.long, device=self.model.device)
        buf.fill_(token)
        return self.model.forward(self.cache.k, self.cache.v, slot, buf, pos, False)
