"""The counter-based RNG and sampling rules the kernel's SAMPLE/LMHEAD instructions implement (CPU side).

One hash per (seed, step, token id) gives a uniform u in (0, 1) and Gumbel noise -log(-log u):
- temperature <= 0: greedy argmax (lowest id wins ties);
- temperature > 0, top_p >= 1: Gumbel-max over the whole vocabulary, an exact sample of softmax(logits / T);
- temperature > 0, top_p < 1: nucleus over the candidate set (the top-8 logits of every LM-head block, which
  always contains the global top-8): probabilities use the exact full-vocabulary normaliser, a candidate is kept
  when the mass ranked strictly above it is < top_p, and Gumbel-max picks among the kept ones. If the nucleus
  would need more than the candidates hold, all candidates are kept (documented approximation).
"""
from __future__ import annotations

import numpy as np

M64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15
MIX1 = 0xBF58476D1CE4E5B9
MIX2 = 0x94D049BB133111EB


def mix_uniform(seed: int, step: int, ids: np.ndarray) -> np.ndarray:
    """ids: int array -> float64 uniforms in (0, 1) (only the top 24 bits are used, as in the kernel)."""
    with np.errstate(over="ignore"):
        key = (np.uint64(step & 0xFFFFFFFF) << np.uint64(32)) | ids.astype(np.uint64)
        z = np.uint64(seed & M64) + key * np.uint64(GOLDEN)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(MIX1)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(MIX2)
        z = z ^ (z >> np.uint64(31))
    return ((z >> np.uint64(40)).astype(np.float64) + 0.5) * (2.0 ** -24)


def gumbel(seed: int, step: int, ids: np.ndarray) -> np.ndarray:
    u = mix_uniform(seed, step, ids).astype(np.float32)
    return -np.log(-np.log(u))
