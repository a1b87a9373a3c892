"""Every reward and penalty against hand-computed values on a tiny, hand-built episode.

The episode (cash, assets A and B, and one masked slot; 4 steps) has round numbers so each
expected value below is written out as arithmetic, never copied from the code's output:

    row  nav     executed weights (cash, A, B, -)   closes (cash, A, B, -)   net return
    0    100     1     0      0      0              1  10  20  1
    1    110     1/4   1/2    1/4    0              1  11  20  1               +0.1
    2     99     1/4   3/8    3/8    0              1  12  18  1               -0.1
    3    118.8   1/2   1/4    1/4    0              1   9  16  1               +0.2
    4     95.04  1/2   1/4    1/4    0              1   8  22  1               -0.2

Weights are dyadic so that moves of exactly 1/8 or 1/4 are exact in floating point.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numpy.typing import ArrayLike
from pydantic import ValidationError

from allocator.trainer.sim.rewards import (
    EpisodeHistory,
    PenaltySettings,
    RewardConfig,
    RewardFunction,
    RewardKind,
    ShapleyReward,
    ShapleySettings,
    SortinoReward,
    SortinoSettings,
    StructuredCreditReward,
    StructuredCreditSettings,
    TransactionCostReward,
    TransactionCostSettings,
    downside_sigma,
    jitter_penalty,
    shapley_values,
    soft_log,
    sortino_potential,
    total_variation_penalty,
    turnover_penalty,
)

MASK = np.array([True, True, True, False])
NAV = [100.0, 110.0, 99.0, 118.8, 95.04]
WEIGHTS = [
    [1.0, 0.0, 0.0, 0.0],
    [0.25, 0.5, 0.25, 0.0],
    [0.25, 0.375, 0.375, 0.0],
    [0.5, 0.25, 0.25, 0.0],
    [0.5, 0.25, 0.25, 0.0],
]
PRICES = [
    [1.0, 10.0, 20.0, 1.0],
    [1.0, 11.0, 20.0, 1.0],
    [1.0, 12.0, 18.0, 1.0],
    [1.0, 9.0, 16.0, 1.0],
    [1.0, 8.0, 22.0, 1.0],
]
N_STEPS = len(NAV) - 1
TOL = {"rel": 1e-12, "abs": 1e-12}


def history(steps: int = N_STEPS) -> EpisodeHistory:
    """The table above, recorded up to ``steps`` steps."""
    h = EpisodeHistory(n_slots=4, capacity=N_STEPS)
    h.start(NAV[0], np.array(WEIGHTS[0]), np.array(PRICES[0]), MASK)
    for k in range(steps):
        h.record(NAV[k + 1], np.array(WEIGHTS[k + 1]), np.array(PRICES[k + 1]))
    return h


def play(reward: Callable[[EpisodeHistory], float]) -> list[float]:
    """The reward after each step, evaluated in order as the environment does."""
    h = EpisodeHistory(n_slots=4, capacity=N_STEPS)
    h.start(NAV[0], np.array(WEIGHTS[0]), np.array(PRICES[0]), MASK)
    out = []
    for k in range(N_STEPS):
        h.record(NAV[k + 1], np.array(WEIGHTS[k + 1]), np.array(PRICES[k + 1]))
        out.append(reward(h))
    return out


def sl(x: float, k: float = 1.5) -> float:
    """soft_log written out from its definition."""
    return math.copysign(math.log1p(k * abs(x)), x) / math.log1p(k) if x else 0.0


# --- the hand-built history itself -------------------------------------------------------


def test_history_records_net_returns_and_rows():
    h = history()
    assert h.steps == 4
    assert h.returns[:4] == pytest.approx([0.1, -0.1, 0.2, -0.2], **TOL)
    assert h.window_start(3) == 1  # 4 steps, window 3 -> rows 1..4
    assert h.window_start(30) == 0  # shorter at episode start
    with pytest.raises(IndexError, match="full"):
        h.record(1.0, np.array(WEIGHTS[0]), np.array(PRICES[0]))


# --- TransactionCostReward ----------------------------------------------------------------


def test_transaction_cost_reward_adds_long_horizon_bonus_once_k_reaches_n():
    # N = 2, lambda = 0.5 -> bonus factor 0.5 / 2 = 0.25, applied from k = 2 on
    r = TransactionCostReward(TransactionCostSettings(long_horizon=2, long_weight=0.5))
    expected = [
        0.1,  # k=1 < N: net return only
        -0.1 + 0.25 * (99 / 100 - 1),  # = -0.1025
        0.2 + 0.25 * (118.8 / 110 - 1),  # = 0.2 + 0.25 * 0.08 = 0.22
        -0.2 + 0.25 * (95.04 / 99 - 1),  # = -0.2 + 0.25 * (-0.04) = -0.21
    ]
    assert play(r) == pytest.approx(expected, **TOL)
    assert expected[1:] == pytest.approx([-0.1025, 0.22, -0.21], **TOL)


def test_transaction_cost_reward_is_net_return_without_bonus():
    no_weight = TransactionCostReward(TransactionCostSettings(long_horizon=2, long_weight=0.0))
    long_n = TransactionCostReward(TransactionCostSettings(long_horizon=20, long_weight=1.0))
    assert play(no_weight) == pytest.approx([0.1, -0.1, 0.2, -0.2], **TOL)
    assert play(long_n) == pytest.approx([0.1, -0.1, 0.2, -0.2], **TOL)  # k never reaches 20


# --- StructuredCreditReward ---------------------------------------------------------------


def test_soft_log_fixed_points_and_values():
    assert soft_log(1.0) == pytest.approx(1.0, **TOL)
    assert soft_log(-1.0) == pytest.approx(-1.0, **TOL)
    assert soft_log(0.0) == 0.0
    # k = 1: log1p(x) / log(2) = log2(1 + x)
    assert soft_log(np.array([3.0, 7.0, -3.0]), k=1.0) == pytest.approx([2.0, 3.0, -2.0], **TOL)
    # k = 1.5, x = 2: log(1 + 3) / log(2.5)
    assert soft_log(2.0) == pytest.approx(math.log(4) / math.log(2.5), **TOL)


@given(
    x=st.floats(-1e6, 1e6).filter(lambda v: v == 0 or abs(v) > 1e-100),
    k=st.floats(0.01, 100.0),
)
def test_soft_log_is_odd_and_bends_toward_identity_at_one(x, k):
    y = float(soft_log(x, k))
    assert float(soft_log(-x, k)) == -y
    assert y == pytest.approx(sl(x, k), rel=1e-12, abs=1e-300)
    # concave on x >= 0 with f(0) = 0 and f(1) = 1: above the identity inside [0, 1], below outside
    if abs(x) <= 1:
        assert abs(y) >= abs(x) * (1 - 1e-12)
    else:
        assert abs(y) <= abs(x) * (1 + 1e-12)


def test_structured_credit_reward_by_hand_over_a_full_window():
    s = StructuredCreditSettings(window=3, soft_log_k=1.5, downside_weight=0.5, clip=1.0)
    # steps = 4, window 3 -> rows 2..4 averaged, returns measured from row 1 closes
    avg_cash = (0.25 + 0.5 + 0.5) / 3  # 5/12
    avg_a = (0.375 + 0.25 + 0.25) / 3  # 7/24 (B is the same)
    r_a = 8 / 11 - 1  # -3/11
    r_b = 22 / 20 - 1  # +1/10
    credit = avg_a * sl(r_a) + avg_a * sl(r_b)
    market = (r_a + r_b) / 2  # mean over the 2 live assets only (masked slot excluded): -19/220
    cash = avg_cash * max(-market, 0.0)
    # net returns in the window: -0.1, +0.2, -0.2 -> losses -0.1, -0.2: population std 0.05
    sigma = 0.05
    expected = credit + cash - 0.5 * sigma
    assert StructuredCreditReward(s)(history(4)) == pytest.approx(expected, **TOL)
    assert cash == pytest.approx(5 / 12 * 19 / 220, **TOL)


def test_structured_credit_reward_uses_the_shorter_window_at_episode_start():
    s = StructuredCreditSettings(window=3, soft_log_k=1.5, downside_weight=0.5, clip=1.0)
    # steps = 1: avg = row 1, A +10%, B 0%: market +5% so no cash hedge, no losses so no sigma
    expected = 0.5 * sl(0.1) + 0.25 * sl(0.0)
    assert StructuredCreditReward(s)(history(1)) == pytest.approx(expected, **TOL)
    # steps = 2: rows 1..2 averaged; A 12/10 - 1 = 0.2, B 18/20 - 1 = -0.1; market +0.05
    # losses in the window: just -0.1 -> std 0
    expected = (0.5 + 0.375) / 2 * sl(0.2) + (0.25 + 0.375) / 2 * sl(-0.1)
    assert StructuredCreditReward(s)(history(2)) == pytest.approx(expected, **TOL)


def test_structured_credit_reward_is_clipped_both_ways():
    s = StructuredCreditSettings(window=3, soft_log_k=1.5, downside_weight=0.5, clip=0.05)
    up = 0.5 * sl(0.1)  # about +0.076
    down = 7 / 24 * (sl(-3 / 11) + sl(0.1)) + 5 / 12 * 19 / 220 - 0.5 * 0.05  # about -0.054
    assert up > 0.05
    assert down < -0.05
    assert StructuredCreditReward(s)(history(1)) == 0.05
    assert StructuredCreditReward(s)(history(4)) == -0.05


def test_downside_sigma_is_population_std_of_losses():
    # losses -0.1 and -0.3: mean -0.2, deviations +-0.1 -> population std 0.1
    assert downside_sigma([0.1, -0.1, -0.3, 0.0]) == pytest.approx(0.1, **TOL)
    assert downside_sigma([0.1, 0.2]) == 0.0
    assert downside_sigma([-0.4]) == 0.0
    assert downside_sigma([]) == 0.0


# --- SortinoReward ------------------------------------------------------------------------


def test_sortino_potential_by_hand():
    # mean 0.2/3, downside deviation sqrt(0.01/3): ratio 2/sqrt(3)
    assert sortino_potential([0.1, -0.1, 0.2]) == pytest.approx(2 / math.sqrt(3), **TOL)
    # mean -0.015, dd sqrt((0.01^2 + 0.02^2)/2)
    assert sortino_potential([-0.01, -0.02]) == pytest.approx(-0.015 / math.sqrt(0.0005 / 2), **TOL)
    assert sortino_potential([0.1]) == 0.0  # fewer than 2 returns
    assert sortino_potential([]) == 0.0
    assert sortino_potential([0.0, 0.0]) == 0.0  # no mean, no downside
    assert sortino_potential([0.01, 0.02], cap=3.0) == 3.0  # no losses -> +cap
    # mean 0.74975, dd sqrt(1e-6 / 4) = 5e-4: ratio 1499.5, clipped
    assert sortino_potential([1.0, 1.0, 1.0, -0.001], cap=10.0) == 10.0
    assert sortino_potential([-1.0, -1.0, -1.0, 0.001], cap=10.0) == pytest.approx(
        -(2.999 / 4) / math.sqrt(3 / 4), **TOL
    )  # below the cap: mean / sqrt(mean of squared losses) ~ -0.866


def test_sortino_reward_adds_potential_based_shaping():
    s = SortinoSettings(window=3, gamma=0.9, weight=0.5, cap=10.0)
    f3 = (0.2 / 3) / math.sqrt(0.01 / 3)  # window [0.1, -0.1, 0.2]
    f4 = (-0.1 / 3) / math.sqrt((0.01 + 0.04) / 3)  # window [-0.1, 0.2, -0.2]
    expected = [
        0.1 + 0.5 * (0.9 * 0.0 - 0.0),  # one return: F = 0
        -0.1 + 0.5 * (0.9 * 0.0 - 0.0),  # [0.1, -0.1]: mean 0 -> F = 0
        0.2 + 0.5 * (0.9 * f3 - 0.0),
        -0.2 + 0.5 * (0.9 * f4 - f3),
    ]
    assert play(SortinoReward(s)) == pytest.approx(expected, **TOL)


def test_sortino_reset_forgets_the_previous_potential():
    s = SortinoSettings(window=3, gamma=0.9, weight=0.5, cap=10.0)
    h = history(3)
    f3 = (0.2 / 3) / math.sqrt(0.01 / 3)
    r = SortinoReward(s)
    first = r(h)  # previous potential 0
    again = r(h)  # previous potential is now f3
    assert first == pytest.approx(0.2 + 0.5 * 0.9 * f3, **TOL)
    assert again == pytest.approx(0.2 + 0.5 * (0.9 * f3 - f3), **TOL)
    r.reset()
    assert r(h) == pytest.approx(first, **TOL)


# --- ShapleyReward ------------------------------------------------------------------------


def test_shapley_reward_sums_allocation_times_window_return():
    s = ShapleySettings(window=3, clip=0.1)
    # steps 4: avg A = avg B = 7/24; A -3/11, B +1/10 -> 7/24 * (-19/110) = -133/2640
    assert ShapleyReward(s)(history(4)) == pytest.approx(-133 / 2640, **TOL)
    # steps 1: 1/2 * 0.1 + 1/4 * 0
    assert ShapleyReward(s)(history(1)) == pytest.approx(0.05, **TOL)
    clipped = ShapleySettings(window=3, clip=0.02)
    assert ShapleyReward(clipped)(history(4)) == -0.02
    assert ShapleyReward(clipped)(history(1)) == 0.02


def coalition_value(avg_alloc: ArrayLike, slot_returns: ArrayLike, coalition: set[int]) -> float:
    """``v(S)``: the return of the coalition's allocations, the rest held in cash (return 0)."""
    a = np.asarray(avg_alloc, dtype=np.float64)
    r = np.asarray(slot_returns, dtype=np.float64)
    final = sum(a[i] * (1.0 + r[i]) for i in coalition)
    final += sum(a[i] for i in range(a.size) if i not in coalition)
    return float(final - a.sum()) / float(a.sum()) if a.sum() > 0 else 0.0


def shapley_monte_carlo(
    value: Callable[[set[int]], float],
    n_players: int,
    n_samples: int,
    rng: np.random.Generator,
) -> np.ndarray:
    """Monte Carlo Shapley values: each player's mean marginal gain over random orders."""
    phi = np.zeros(n_players)
    for _ in range(n_samples):
        order = rng.permutation(n_players)
        before: set[int] = set()
        v_before = value(before)
        for player in order:
            with_player = before | {int(player)}
            v_with = value(with_player)
            phi[player] += v_with - v_before
            before, v_before = with_player, v_with
    return phi / n_samples


def test_shapley_values_closed_form_by_hand():
    phi = shapley_values([0.5, 0.3, 0.2], [0.0, 0.1, -0.2])
    assert phi == pytest.approx([0.0, 0.03, -0.04], **TOL)
    # the coalition game's value of the grand coalition is the allocation's return
    assert coalition_value([0.5, 0.3, 0.2], [0.0, 0.1, -0.2], {0, 1, 2}) == pytest.approx(
        0.03 - 0.04, **TOL
    )
    assert coalition_value([0.5, 0.3, 0.2], [0.0, 0.1, -0.2], set()) == 0.0


@settings(max_examples=60, deadline=None)
@given(
    raw=st.lists(st.floats(0.01, 1.0), min_size=1, max_size=7),
    returns=st.data(),
    seed=st.integers(0, 2**32 - 1),
    n_samples=st.integers(1, 4),
)
def test_shapley_closed_form_matches_seed_monte_carlo(raw, returns, seed, n_samples):
    a = np.array(raw) / np.sum(raw)  # a distribution
    r = np.array(returns.draw(st.lists(st.floats(-0.9, 2.0), min_size=a.size, max_size=a.size)))
    mc = shapley_monte_carlo(
        lambda s: coalition_value(a, r, s), a.size, n_samples, np.random.default_rng(seed)
    )
    # additive game: every permutation gives the exact value, so even 1 sample matches
    np.testing.assert_allclose(mc, shapley_values(a, r), rtol=0, atol=1e-12)
    np.testing.assert_allclose(mc, a * r, rtol=0, atol=1e-12)


def exact_shapley(value: Callable[[set[int]], float], n: int) -> np.ndarray:
    """Shapley values by averaging marginal contributions over all n! orders."""
    phi = np.zeros(n)
    orders = list(itertools.permutations(range(n)))
    for order in orders:
        before: set[int] = set()
        for p in order:
            phi[p] += value(before | {p}) - value(before)
            before = before | {p}
    return phi / len(orders)


def majority(s: set[int]) -> float:
    return 1.0 if len(s) >= 2 else 0.0


def gloves(s: set[int]) -> float:
    # player 0 owns a left glove, players 1 and 2 a right glove each: pairs are worth 1
    return float(min(len(s & {0}), len(s & {1, 2})))


def weighted_square(s: set[int]) -> float:
    w = [1.0, 2.0, 3.0, 4.0]
    return sum(w[i] for i in s) ** 2


@pytest.mark.parametrize(
    ("game", "n", "by_hand"),
    [
        (majority, 3, [1 / 3, 1 / 3, 1 / 3]),  # symmetric: v(N) = 1 shared equally
        (gloves, 3, [2 / 3, 1 / 6, 1 / 6]),  # player 0 pivotal in 4 of 6 orders
        # (sum w)^2: phi_i = w_i * sum(w) = w_i * 10 (marginals average to w_i^2 + w_i sum_j w_j)
        (weighted_square, 4, [10.0, 20.0, 30.0, 40.0]),
    ],
)
def test_shapley_monte_carlo_estimates_a_non_additive_game(game, n, by_hand):
    exact = exact_shapley(game, n)
    np.testing.assert_allclose(exact, by_hand, rtol=1e-12)
    mc = shapley_monte_carlo(game, n, 4000, np.random.default_rng(1))
    # each permutation's marginals sum to v(N) - v({}), so the estimate is efficient exactly
    assert mc.sum() == pytest.approx(game(set(range(n))) - game(set()), rel=1e-12)
    # sampling error: marginals lie in [0, v(N)], so std <= v(N)/2 and 6 sigma < 0.05 v(N)
    np.testing.assert_allclose(mc, exact, rtol=0, atol=0.05 * game(set(range(n))))


# --- penalties ----------------------------------------------------------------------------


def test_turnover_penalty_sums_absolute_moves_of_executed_weights():
    # moves per step: (3/4 + 1/2 + 1/4), (1/8 + 1/8), (1/4 + 1/8 + 1/8), nothing
    expected = [2 * 1.5, 2 * 0.25, 2 * 0.5, 0.0]
    assert play(lambda h: turnover_penalty(h, 2.0)) == pytest.approx(expected, **TOL)


def test_jitter_penalty_charges_only_small_moves():
    expected = [
        0.0,  # moves 3/4, 1/2, 1/4: all decisive (>= band 1/4, the boundary included)
        4 * (0.125**2 + 0.125**2),  # two moves of 1/8 inside the band: 0.125
        4 * (0.125**2 + 0.125**2),  # cash moved 1/4 (free), A and B 1/8 each
        0.0,  # no move
    ]
    assert play(lambda h: jitter_penalty(h, 4.0, 0.25)) == pytest.approx(expected, **TOL)
    assert expected[1] == 0.125
    # with a wider band the 1/4 moves become jitter as well
    assert jitter_penalty(history(3), 4.0, 0.3) == pytest.approx(4 * (0.0625 + 0.03125), **TOL)


def test_total_variation_penalty_sums_l1_moves_over_the_window():
    expected = [
        2 * 1.5,  # only one move so far
        2 * (1.5 + 0.25),  # window 2 holds both moves
        2 * (0.25 + 0.5),  # moves of steps 2 and 3
        2 * (0.5 + 0.0),  # moves of steps 3 and 4
    ]
    got = play(lambda h: total_variation_penalty(h, 2.0, 2))
    assert got == pytest.approx(expected, **TOL)


# --- RewardFunction and RewardConfig ------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "cls"),
    [
        (RewardKind.TRANSACTION_COST, TransactionCostReward),
        (RewardKind.STRUCTURED_CREDIT, StructuredCreditReward),
        (RewardKind.SORTINO, SortinoReward),
        ("SHAPLEY", ShapleyReward),
    ],
)
def test_reward_function_selects_the_configured_kind(kind, cls):
    f = RewardFunction(RewardConfig(kind=kind))
    assert type(f.reward) is cls
    assert f.penalties == PenaltySettings(turnover=0, jitter=0, total_variation=0)  # all off
    assert play(f) == pytest.approx(play(cls(getattr(f.config, f.config.kind.lower()))), **TOL)


def test_reward_function_subtracts_every_enabled_penalty():
    config = RewardConfig(
        kind=RewardKind.TRANSACTION_COST,
        transaction_cost=TransactionCostSettings(long_horizon=2, long_weight=0.5),
        penalties=PenaltySettings(
            turnover=2.0, jitter=4.0, jitter_deadband=0.25, total_variation=2.0, tv_window=2
        ),
    )
    f = RewardFunction(config)
    rewards = [0.1, -0.1025, 0.22, -0.21]  # transaction-cost reward, worked out above
    turnover = [3.0, 0.5, 1.0, 0.0]
    jitter = [0.0, 0.125, 0.125, 0.0]
    tv = [3.0, 3.5, 1.5, 1.0]
    expected = [r - a - b - c for r, a, b, c in zip(rewards, turnover, jitter, tv, strict=True)]
    assert play(f) == pytest.approx(expected, **TOL)


def test_reward_function_reset_resets_the_reward():
    f = RewardFunction(RewardConfig(kind=RewardKind.SORTINO))
    h = history(3)
    first = f(h)
    assert f(h) != first  # the shaping remembered the previous potential
    f.reset()
    assert f(h) == first


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"kind": "SHARPE"}, "kind"),
        ({"bogus": 1}, "bogus"),
        ({"penalties": {"turnovr": 1.0}}, "penalties.turnovr"),
        ({"penalties": {"turnover": -1.0}}, "penalties.turnover"),
        ({"penalties": {"jitter_deadband": 0.0}}, "penalties.jitter_deadband"),
        ({"penalties": {"jitter_deadband": 1.5}}, "penalties.jitter_deadband"),
        ({"penalties": {"tv_window": 0}}, "penalties.tv_window"),
        ({"sortino": {"window": 1}}, "sortino.window"),
        ({"sortino": {"gamma": 1.5}}, "sortino.gamma"),
        ({"sortino": {"cap": 0.0}}, "sortino.cap"),
        ({"shapley": {"clip": 0.0}}, "shapley.clip"),
        ({"structured_credit": {"soft_log_k": 0.0}}, "structured_credit.soft_log_k"),
        ({"transaction_cost": {"long_horizon": 0}}, "transaction_cost.long_horizon"),
        ({"transaction_cost": {"long_weight": -0.1}}, "transaction_cost.long_weight"),
    ],
)
def test_reward_config_rejects_unknown_keys_and_bad_values(kwargs, field):
    with pytest.raises(ValidationError) as exc:
        RewardConfig(**kwargs)
    locs = [".".join(str(p) for p in e["loc"]) for e in exc.value.errors()]
    assert locs == [field]
    assert field in str(exc.value)


def test_reward_config_is_frozen_and_parses_nested_dicts():
    c = RewardConfig(kind="SORTINO", sortino={"window": 5, "gamma": 1.0})
    assert c.kind is RewardKind.SORTINO
    assert c.sortino == SortinoSettings(window=5, gamma=1.0)
    with pytest.raises(ValidationError):
        c.kind = RewardKind.SHAPLEY  # type: ignore[misc]
