"""divmod_small (kernels/csrc/mk_block.cuh) on the CPU: x / d from a float estimate with an approximate reciprocal,
corrected once. Its claim is that the estimate is off by at most one for 0 <= x < 2^21 and 1 <= d < 2^21 whatever
rcp.approx returns within one ulp of 1 / d, so one correction step is exact. Checked here for both one-ulp
neighbours of the reciprocal over every (x, d) the kernel divides (x, d < 4,096: the cluster combine, the DOWN
share's chunk groups, mv_load's batches, the residual rotation) and at the range's edge."""
import numpy as np
import pytest

LIMIT = 1 << 21


def estimate(x: np.ndarray, rcp: np.float32) -> np.ndarray:
    """__float2int_rz(__int2float_rn(x) * rcp) in float32."""
    return np.trunc(x.astype(np.float32) * rcp).astype(np.int64)


def divmod_small(x: np.ndarray, d: int, rcp: np.float32) -> tuple[np.ndarray, np.ndarray]:
    """The kernel's correction step, vectorised."""
    q = estimate(x, rcp)
    r = x - q * d
    low, high = r < 0, r >= d
    q = np.where(low, q - 1, np.where(high, q + 1, q))
    r = np.where(low, r + d, np.where(high, r - d, r))
    return q, r


def reciprocals(d: int) -> list[np.float32]:
    """1 / d rounded, and its neighbours one ulp away: what rcp.approx.ftz.f32 may return."""
    r = np.float32(1.0) / np.float32(d)
    return [r, np.nextafter(r, np.float32(0)), np.nextafter(r, np.float32(1e9))]


@pytest.mark.parametrize("hi", [4096])
def test_exact_for_every_small_pair(hi):
    x = np.arange(hi, dtype=np.int64)
    for d in range(1, hi):
        for rcp in reciprocals(d):
            assert np.abs(estimate(x, rcp) - x // d).max() <= 1, d
            q, r = divmod_small(x, d, rcp)
            assert np.array_equal(q, x // d) and np.array_equal(r, x % d), d


def test_exact_at_the_edge_of_the_range():
    rng = np.random.default_rng(5)
    xs = np.concatenate([np.arange(LIMIT - 4096, LIMIT), rng.integers(0, LIMIT, 20000)]).astype(np.int64)
    ds = sorted({1, 2, 3, 7, 28, 112, 4864, 8960, LIMIT - 1, *rng.integers(1, LIMIT, 200).tolist()})
    for d in ds:
        for rcp in reciprocals(d):
            assert np.abs(estimate(xs, rcp) - xs // d).max() <= 1, d
            q, r = divmod_small(xs, d, rcp)
            assert np.array_equal(q, xs // d) and np.array_equal(r, xs % d), d


def test_one_correction_is_not_enough_far_past_the_range():
    # The bound is real: at x ~ 2^26 a one-ulp reciprocal puts the estimate two or more away for some d.
    x = np.arange((1 << 26) - 4096, 1 << 26, dtype=np.int64)
    worst = max(int(np.abs(estimate(x, rcp) - x // d).max()) for d in range(3, 200) for rcp in reciprocals(d))
    assert worst >= 2
