"""The screened LM head: an int8 copy of the LM head picks the candidates, the bf16 rows decide among them.

The LM head streams vocab x d bf16 weights every token (0.5B: 272 MB, ~11 % of a token). The screened head
(kernels/csrc/mk_lmscreen.cuh) streams an int8 copy instead (half the bytes): each LMHEAD block quantizes its input
x to int8 too, one scale per 16 elements (qx = round(x / s_c), s_c = max|x in chunk c| / 127: an outlier costs only
its own chunk's precision), takes exact integer dot products per chunk (dp4a) and a_r = s_r sum_c s_c (q_r . qx)_c,
with a bound B_r on |a_r - e_r|, where e_r is the logit the exact (bf16) head computes.
Any row that can still be the argmax (a_r + B_r >= max_k (a_k - B_k)) or, with temperature T, the Gumbel-max sample
((a_r + B_r) / T + g_r >= max_k ((a_k - B_k) / T + g_k)) is a candidate: its bf16 row is read again and its exact
logit computed with the exact head's own arithmetic; every other row is out. The pick is the exact head's pick, not
an approximation of it: rounding to nearest is monotone, so the bound's inequalities survive the fp32 arithmetic of
the comparisons. Top-p needs every row's probability and launches with logits output need every logit: both run the
exact head (runtime.Monokernel.lm_mode says which head ran and why).

Per row r of W (the LM head, fp32 view of its bf16 values):
    s_r = max|W_r| / 127,  q_r = round(W_r / s_r) in [-127, 127] (int8)
    c_r >= ||W_r - s_r q_r||_2 + (K + 2) u ||W_r||_2,   d_r >= ||s_r q_r||_2,   u = 2^-24
and B_r = ||x|| c_r + ex d_r + 2^-20 |a_r|, ex = ||x - x~|| + (K / 16 + 3) u (||x|| + ex) (x~: x dequantized):
    |a*_r - x . W_r| <= |(x~ - x) . s_r q_r| + |x . (s_r q_r - W_r)|   (a*_r: a_r in exact arithmetic;
    Cauchy-Schwarz), the fp32 sum over chunks is within (K / 16 + 3) u ||x~|| d_r of a*_r, (K + 2) u ||x|| ||W_r||
bounds the exact head's fp32 dot product in any order, and 2^-20 |a_r| covers the roundings of a_r's last product
and of a_r -/+ B_r. The kernel inflates the norms by 2^-9 (and ex by 2^-20 ||x||) for its own rounding of them.
"""
from __future__ import annotations

import torch

from . import isa

U32 = 2.0 ** -24
NORM_SLACK = 1.0 + 2.0 ** -9   # the kernel's ||x|| and ||x - s_x qx|| times this (mk_lmscreen.cuh)
A_SLACK = 2.0 ** -20           # plus |a| times this (mk_lmscreen.cuh lm8_bound)
CHUNK = 16                     # x is quantized with one scale per 16 elements (one 16-byte chunk of a q row)


def staging_floats(rows: int, d: int) -> int:
    """Shared memory (floats of the attention staging region) an LMHEAD block of `rows` rows needs to be screened:
    scale, c, d and the Gumbel noise per row, the candidate list and its count, x in int8 and its chunk scales
    (mk_lmscreen.cuh)."""
    return ((4 * rows + isa.LM_CAND_MAX + 4) & ~3) + d // 4 + d // CHUNK


def _up(t64: torch.Tensor) -> torch.Tensor:
    """float64 -> the nearest float32 at or above it."""
    t = t64.to(torch.float32)
    return torch.where(t.to(torch.float64) < t64, torch.nextafter(t, torch.full_like(t, float("inf"))), t)


def quantize(w: torch.Tensor, rows_per_chunk: int = 8192):
    """w: [V, K] (bf16 or fp32), any device. -> (q int8 [V, K], scale fp32 [V], c fp32 [V], d fp32 [V]) on w's
    device; c and d computed in float64 and rounded up to fp32."""
    V, K = w.shape
    q8 = torch.empty(V, K, dtype=torch.int8, device=w.device)
    scale, c, d = (torch.empty(V, dtype=torch.float32, device=w.device) for _ in range(3))
    for r0 in range(0, V, rows_per_chunk):
        wf = w[r0:r0 + rows_per_chunk].to(torch.float64)
        s = (wf.abs().amax(dim=1) / 127.0).to(torch.float32)
        s = torch.where(s > 0, s, torch.ones_like(s))   # an all-zero row: q = 0, no error
        sd = s.to(torch.float64)
        q = torch.round(wf / sd[:, None]).clamp_(-127, 127)
        deq = q * sd[:, None]
        sl = slice(r0, r0 + rows_per_chunk)
        q8[sl] = q.to(torch.int8)
        scale[sl] = s
        c[sl] = _up((wf - deq).norm(dim=1) + (K + 2) * U32 * wf.norm(dim=1))
        d[sl] = _up(deq.norm(dim=1))
    return q8, scale, c, d


def quantize_x(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The block's int8 input (mk_lmscreen.cuh), by chunks of 16: (qx as int64 values in [-127, 127], the chunk
    scales s_c = max |x in chunk| / 127, fp32)."""
    xs = x.to(torch.float32).view(-1, CHUNK)
    m = xs.abs().amax(dim=1)
    inv = torch.where(m > 0, 127.0 / m, torch.zeros_like(m))
    qx = torch.round(xs * inv[:, None]).clamp(-127, 127).to(torch.int64)
    return qx.view(-1), m / 127.0


def approx_logits(q8: torch.Tensor, scale: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """fp32 a_r = s_r sum_c s_c (q_r . qx)_c, each chunk's integer dot product exact (int64 here, dp4a in the
    kernel), the sum over chunks in fp32 (any order: the bound covers it)."""
    qx, sc = quantize_x(x)
    V, K = q8.shape
    dots = (q8.to(torch.int64).view(V, K // CHUNK, CHUNK) * qx.view(1, K // CHUNK, CHUNK)).sum(dim=2)
    return (dots.to(torch.float32) * sc).sum(dim=1) * scale


def bounds(a: torch.Tensor, c: torch.Tensor, d: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """B_r as the kernel computes it (lm8_bound): nx c + ex d + 2^-20 |a|, ex including the fp32 sum over the
    K / 16 chunks ((K / 16 + 3) u (nx + ex))."""
    x = x.to(torch.float32)
    qx, sc = quantize_x(x)
    nx = torch.linalg.vector_norm(x) * NORM_SLACK
    deq = (qx.view(-1, CHUNK).to(torch.float32) * sc[:, None]).view(-1)
    ex = (torch.linalg.vector_norm(x - deq) + nx * A_SLACK) * NORM_SLACK
    ex = ex + (x.numel() // CHUNK + 3) * U32 * (nx + ex) * NORM_SLACK
    return nx * c + ex * d + a.abs() * A_SLACK


def candidates(a: torch.Tensor, b: torch.Tensor, temperature: float = 0.0, gumbel: torch.Tensor | None = None,
               block: int | None = None) -> torch.Tensor:
    """Bool [V]: the rows whose exact logit must be computed, from the approximations a and bounds b. The kernel
    decides per LMHEAD instruction (each CTA over its own rows, against its own rows' maxima: no exchange between
    CTAs): block = that many rows per instruction (None: one block). gumbel: the rows' Gumbel noise when
    temperature > 0."""
    lo, hi = a - b, a + b
    keep = torch.zeros_like(a, dtype=torch.bool)
    n = a.numel()
    step = block or n
    for r0 in range(0, n, step):
        sl = slice(r0, min(n, r0 + step))
        k = hi[sl] >= lo[sl].max()
        if temperature > 0:
            assert gumbel is not None
            k |= hi[sl] / temperature + gumbel[sl] >= (lo[sl] / temperature + gumbel[sl]).max()
        keep[sl] = k
    return keep
