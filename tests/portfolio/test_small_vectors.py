"""The numpy-free post-processing of one small vector gives numpy's floats, bit for bit."""

from __future__ import annotations

import math

import numpy as np
import pytest

from allocator.portfolio import (
    SMALL_SLOTS,
    ema_smooth,
    ema_smooth_small,
    live_mask,
    pairwise_sum,
    renormalize,
    renormalize_small,
)


def _vector(rng: np.random.Generator, n: int) -> np.ndarray:
    """Weights over many magnitudes, with exact zeros, -0.0, negatives and NaN sprinkled in."""
    x = rng.random(n) * 10.0 ** rng.uniform(-6, 6)
    special = rng.random(n)
    x[special < 0.1] = 0.0
    x[(special >= 0.1) & (special < 0.15)] = -0.0
    x[(special >= 0.15) & (special < 0.2)] = -rng.random()
    x[(special >= 0.2) & (special < 0.22)] = math.nan
    return x


@pytest.mark.parametrize("n", [1, 2, 5, 7, 8, 9, 15, 16, 17, 21, 64, 127, 128, 129, 300])
def test_pairwise_sum_is_numpys_sum(n: int) -> None:
    rng = np.random.default_rng(n)
    for _ in range(50):
        values = np.sort(rng.random(n) * 10.0 ** rng.uniform(-3, 3))
        assert pairwise_sum(values.tolist()) == float(np.add.reduce(values))


def test_renormalize_small_agrees_with_renormalize() -> None:
    rng = np.random.default_rng(0)
    answered = 0
    for _ in range(3000):
        n = int(rng.integers(1, SMALL_SLOTS + 1))
        x, mask = _vector(rng, n), rng.random(n) < 0.7
        got = renormalize_small(x.tolist(), mask.tolist())
        if got is None:  # left to numpy: nothing positive and live
            assert not np.any(np.where(live_mask(mask), np.nan_to_num(x, nan=0.0), 0.0) > 0)
            continue
        answered += 1
        want = renormalize(x, mask)
        np.testing.assert_allclose(got, want, rtol=0.0, atol=1e-12)
        assert np.array_equal(got, want)  # the same values (numpy may keep a zero's sign)
        # one row of a batch, as the decision step renormalizes it
        assert np.array_equal(got, renormalize(x[None, :], mask[None, :])[0])
    assert answered > 2500


def test_renormalize_small_gives_numpys_bytes_for_a_policys_weights() -> None:
    """Non-negative weights, as a policy's graph answers them: the same bytes as numpy."""
    rng = np.random.default_rng(2)
    for _ in range(3000):
        n = int(rng.integers(1, SMALL_SLOTS + 1))
        x = rng.dirichlet(np.ones(n)).astype(np.float32).astype(np.float64)
        x[rng.random(n) < 0.1] = 0.0
        mask = rng.random(n) < 0.8
        got = renormalize_small(x.tolist(), mask.tolist())
        if got is not None:  # None: no live mass, left to numpy
            want = renormalize(x[None, :], mask[None, :])[0]
            assert np.array(got).tobytes() == want.tobytes()


def test_ema_smooth_small_agrees_with_ema_smooth() -> None:
    rng = np.random.default_rng(1)
    for _ in range(3000):
        n = int(rng.integers(1, SMALL_SLOTS + 1))
        previous = rng.dirichlet(np.ones(n))
        weights, mask = rng.dirichlet(np.ones(n)), rng.random(n) < 0.8
        beta = float(rng.choice([0.0, 0.5, 0.9, rng.random()]))
        got = ema_smooth_small(previous.tolist(), weights.tolist(), mask.tolist(), beta)
        want = ema_smooth(previous[None, :], weights[None, :], mask[None, :], beta)[0]
        assert got is not None
        np.testing.assert_allclose(got, want, rtol=0.0, atol=1e-12)
        assert np.array(got).tobytes() == want.tobytes()


@pytest.mark.parametrize(
    "x",
    [
        [0.0, 0.0, 0.0],  # nothing wanted: all cash (numpy's case)
        [math.nan, -1.0, math.nan],
        [0.2, math.inf, 0.3],  # an infinite preference: numpy's case
        [],
    ],
)
def test_degenerate_vectors_are_left_to_numpy(x: list[float]) -> None:
    assert renormalize_small(x, [True] * len(x)) is None


def test_a_masked_infinity_is_left_to_numpy() -> None:
    """numpy's masked +inf becomes NaN and takes the degenerate path; so must this one."""
    assert renormalize_small([0.5, 0.5, math.inf], [True, True, False]) is None


def test_ema_small_checks_its_inputs_as_ema_smooth_does() -> None:
    with pytest.raises(ValueError, match="beta"):
        ema_smooth_small([1.0], [1.0], [True], 1.0)
    with pytest.raises(ValueError, match="length"):
        ema_smooth_small([1.0], [0.5, 0.5], [True, True], 0.5)
