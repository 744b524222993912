"""The screened LM head's host side (kernels/lm_screen.py): the int8 copy, the bound it promises, and the candidate
rule the kernel (mk_lmscreen.cuh) applies. The GPU test (tests/gpu/test_monokernel.py) checks the kernel picks the
exact head's tokens; these check the rule on CPU, including a negative control (a bound too small loses picks)."""
import math

import pytest
import torch
from hypothesis import given, settings, strategies as st

from kernels import isa
from kernels.lm_screen import approx_logits, bounds, candidates, quantize, staging_floats


def _weights(seed: int, V: int, K: int, outliers: bool) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(V, K, generator=g) * 0.02
    if outliers:   # rows and columns far above the rest, as real LM heads have
        w[torch.randint(0, V, (V // 16,), generator=g)] *= 8
        w[:, torch.randint(0, K, (K // 32,), generator=g)] *= 20
    w[0] = 0   # an all-zero row: scale 1, q 0, no error
    return w.bfloat16()


def _x(seed: int, K: int, outliers: bool) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed + 1000)
    x = torch.randn(K, generator=g) * 2
    if outliers:
        x[torch.randint(0, K, (4,), generator=g)] *= 50
    return x


def test_quantize_stores_int8_rows_and_bound_factors():
    w = _weights(0, 300, 128, outliers=True)
    q8, s, c, d = quantize(w, rows_per_chunk=64)   # several chunks
    assert q8.dtype == torch.int8 and s.dtype == c.dtype == d.dtype == torch.float32
    q = q8.double()
    assert q.abs().max() <= 127 and (q.abs().amax(dim=1)[1:] == 127).all()   # every non-zero row uses the range
    assert s[0] == 1 and (q[0] == 0).all() and c[0] == 0 and d[0] == 0
    deq = q * s.double()[:, None]
    err = (w.double() - deq).norm(dim=1)
    assert (err <= c.double()).all() and (c.double() <= 1.01 * err + 1e-4 * w.double().norm(dim=1) + 1e-30).all()
    assert (deq.norm(dim=1) <= d.double()).all()
    assert staging_floats(1151, 896) == 4 * 1151 + isa.LM_CAND_MAX + 4 + 224 + 56


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), K=st.sampled_from([64, 128, 896]), outliers=st.booleans())
def test_the_bound_covers_fp32_logits_in_any_summation_order(seed, K, outliers):
    w = _weights(seed, 257, K, outliers)
    x = _x(seed, K, outliers)
    q8, s, c, d = quantize(w)
    a = approx_logits(q8, s, x)
    wf = w.float()
    exact = [wf @ x, (wf.flip(1) @ x.flip(0)), (wf * x).sum(dim=1)]   # three fp32 orders
    b = bounds(a, c, d, x)
    for e in exact:
        assert ((a - e).abs() <= b).all()


def _pick(e: torch.Tensor, T: float, g: torch.Tensor | None) -> int:
    v = e if T <= 0 else e / T + g
    return int(torch.argmax(v))   # first maximal index: the kernel's tie rule (better())


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), T=st.sampled_from([0.0, 0.7, 2.0]), outliers=st.booleans(),
       block=st.sampled_from([None, 97, 256]))
def test_candidates_hold_the_exact_heads_pick(seed, T, outliers, block):
    V, K = 1000, 128
    w = _weights(seed, V, K, outliers)
    x = _x(seed, K, outliers)
    q8, s, c, d = quantize(w)
    a = approx_logits(q8, s, x)
    e = w.float() @ x
    gen = torch.Generator().manual_seed(seed)
    g = -torch.log(-torch.log(torch.rand(V, generator=gen).clamp_min(1e-12))) if T > 0 else None
    keep = candidates(a, bounds(a, c, d, x), T, g, block)
    # the kernel computes exact logits of the candidates only, every other row is -inf: the pick is the same
    masked = torch.where(keep, e, torch.full_like(e, -math.inf))
    assert _pick(masked, T, g) == _pick(e, T, g)
    if not outliers:   # and the screen screens (W's outlier columns widen every row's bound: correct, not cheap)
        assert keep.sum() < V // 10


def test_near_ties_and_flat_logits_keep_every_contender():
    K = 64
    w = torch.zeros(6, K)
    w[1, 0], w[2, 0], w[3, 0] = 1.0, 1.0, 1.0 - 2 ** -8   # rows 1 and 2 tie exactly, row 3 one bf16 step below
    w[4, 1] = 0.5
    w = w.bfloat16()
    x = torch.zeros(K)
    x[0], x[1] = 1.0, 1.0
    q8, s, c, d = quantize(w)
    a = approx_logits(q8, s, x)
    keep = candidates(a, bounds(a, c, d, x))
    assert keep[1] and keep[2]   # both tied maxima: the tie rule (lowest index) runs on exact values
    z = torch.zeros(50)
    flat = candidates(z, bounds(z, z, z, torch.zeros(16)))
    assert flat.all()   # x = 0: every logit is 0, every row a contender (the kernel's overflow path)


def test_a_bound_too_small_loses_picks():
    """Negative control: the same rule with the bound shrunk 100x misses the exact argmax on some seeds, so the
    pick tests above can fail."""
    lost = 0
    for seed in range(40):
        w = _weights(seed, 2000, 128, outliers=False)
        x = _x(seed, 128, outliers=False)
        q8, s, c, d = quantize(w)
        a = approx_logits(q8, s, x)
        e = w.float() @ x
        keep = candidates(a, bounds(a, c, d, x) / 100)
        lost += not bool(keep[int(torch.argmax(e))])
    assert lost > 0


@pytest.mark.parametrize("T", [0.0, 1.0])
def test_blocks_decide_alone(T):
    """Per-block maxima (each CTA against its own rows) keep a superset of the one-block rule's candidates."""
    w = _weights(3, 600, 64, outliers=False)
    x = _x(3, 64, outliers=False)
    q8, s, c, d = quantize(w)
    a = approx_logits(q8, s, x)
    b = bounds(a, c, d, x)
    g = torch.zeros(600) if T > 0 else None
    one = candidates(a, b, T, g)
    per = candidates(a, b, T, g, block=50)
    assert (per | one).equal(per) and per.sum() > one.sum()
