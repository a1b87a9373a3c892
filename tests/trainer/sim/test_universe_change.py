"""PortfolioEnv whose universe changes mid-episode: layout, accounting, observations, errors.

Expected observations are rebuilt with the ``portfolio`` contract functions from the raw closes
of the new universe; the accounting is recomputed by asset id on a small hand-made market,
never read back from the environment's arrays.
"""

from __future__ import annotations

import copy
import warnings
from typing import Any

import numpy as np
import pandas as pd
import pytest
from gymnasium.utils.env_checker import check_env

from allocator.portfolio import (
    CASH_ID,
    AnchorKind,
    AnchorSpec,
    anchor_weights,
    build_asset_observation,
    build_observation,
)
from allocator.trainer.market.data import MarketData
from allocator.trainer.sim.env import EnvConfig, PortfolioEnv
from allocator.trainer.sim.rewards import (
    PenaltySettings,
    RewardConfig,
    RewardKind,
    window_credit_inputs,
)
from tests.markets import random_walk_market

NAN = np.nan
# Rows 0..7. E delists after row 4; F lists on row 3.
CLOSES = {
    "A": [10.0, 10.5, 11.0, 10.0, 12.0, 12.5, 13.0, 12.0],
    "B": [20.0, 19.0, 21.0, 22.0, 20.0, 21.0, 22.0, 23.0],
    "C": [5.0, 5.5, 5.2, 5.4, 5.0, 5.6, 5.8, 6.0],
    "D": [8.0, 8.4, 8.0, 8.8, 9.2, 9.0, 9.6, 10.0],
    "E": [10.0, 11.0, 12.0, 11.0, 12.0, NAN, NAN, NAN],
    "F": [NAN, NAN, NAN, 7.0, 7.5, 7.2, 7.7, 8.0],
}
SMALL = EnvConfig(max_assets=3, window=2, episode_length=4, beta=0.5, cost_bps=100.0)
START = 2  # decisions on rows 2..5, the last one valued at row 6


@pytest.fixture(scope="module")
def small() -> MarketData:
    names = tuple(CLOSES)
    prices = np.array([CLOSES[a] for a in names]).T
    dates = pd.bdate_range("2020-01-01", periods=prices.shape[0])
    return MarketData(prices=prices, dates=dates, assets=names, source="hand-made")


@pytest.fixture(scope="module")
def market() -> MarketData:
    return random_walk_market(n_dates=200, n_assets=8, seed=5)


def contract_observation(env: PortfolioEnv, data: MarketData) -> np.ndarray:
    """The observation of the env's current universe, from the raw closes of the data."""
    cfg = env.config
    n_prices = cfg.asset_feature_spec.prices_per_asset if env.asset_spec else cfg.window + 1
    window = np.full((cfg.max_assets, n_prices), np.nan)  # masked rows must be ignored
    live = data.prices[env.t - n_prices + 1 : env.t + 1][:, env.asset_index]
    window[: env.asset_index.size] = live.T
    if env.asset_spec is None:
        return build_observation(window, env.drifted, env.mask, cfg.feature_spec, env.stats)
    assert env.feature_norm is not None
    return build_asset_observation(window, env.drifted, env.mask, env.asset_spec, env.feature_norm)


def by_id(env: PortfolioEnv, vector: np.ndarray) -> dict[str, float]:
    """A slot vector of the env as ``{asset id: value}`` (cash as ``CASH_ID``)."""
    ids = (CASH_ID, *env.asset_names)
    return {a: float(vector[j]) for j, a in enumerate(ids)}


# --- layout ------------------------------------------------------------------------------


def test_staying_assets_keep_their_order_and_joiners_follow_in_the_order_given(market) -> None:
    env = PortfolioEnv(market, EnvConfig(max_assets=6, window=5, episode_length=20))
    env.reset(options={"assets": ["A3", "A0", "A5", "A1"], "start": 30})
    env.step(np.zeros(7, np.float32))
    _, info = env.change_universe(["A6", "A1", "A2", "A3"])
    assert env.asset_names == info["assets"] == ("A3", "A1", "A6", "A2")
    np.testing.assert_array_equal(env.asset_index, [3, 1, 6, 2])
    np.testing.assert_array_equal(env.mask, [True] * 5 + [False] * 2)
    assert env.drifted[5:].sum() == 0.0
    assert env.executed is not None
    assert env.executed[3:].sum() == 0.0  # joiners carry nothing; A0 and A5 were dropped
    assert info["liquidation_turnover"] > 0.0  # A0 and A5 were held


# --- observations ------------------------------------------------------------------------

TILT = {"mapping": "tilt", "k": 1.5, "anchor": {"kind": "inverse_volatility", "vol_window": 9}}
REPRESENTATIONS = {
    "returns": {},
    "asset_v1-tilt": {"features": "asset_v1", "horizons": [3, 7], "vol_window": 4, "action": TILT},
}


@pytest.mark.parametrize("changes", REPRESENTATIONS.values(), ids=REPRESENTATIONS.keys())
def test_observations_across_changes_are_the_contract_observations_of_the_new_closes(
    market, changes
) -> None:
    cfg = EnvConfig(max_assets=5, window=6, episode_length=14, **changes)
    env = PortfolioEnv(market, cfg)
    schedule = {9: ["A4", "A0", "A7"]}  # fewer assets, a reused slot, and a joiner
    obs, _ = env.reset(seed=1, options={"assets": ["A0", "A1", "A2"], "universe_changes": schedule})
    rng = np.random.default_rng(0)
    seen = set()
    for k in range(14):
        if k == 4:  # A1 leaves, A6 and A3 join: more assets than before
            obs, info = env.change_universe(["A6", "A2", "A0", "A3"])
            assert info["assets"] == ("A0", "A2", "A6", "A3")
        seen.add(env.asset_names)
        np.testing.assert_allclose(obs, contract_observation(env, market), rtol=1e-6, atol=1e-6)
        assert env.observation_space.contains(obs)
        if cfg.action.mapping == "tilt":
            spec = AnchorSpec(AnchorKind.INVERSE_VOLATILITY, cash_share=0.05, vol_window=9)
            window = np.full((5, 10), np.nan)
            window[: env.asset_index.size] = market.prices[env.t - 9 : env.t + 1, env.asset_index].T
            np.testing.assert_allclose(
                env.anchor, anchor_weights(window, env.mask, spec), atol=1e-12
            )
        obs, _, _, truncated, info = env.step(rng.uniform(-1, 1, 6).astype(np.float32))
        if k == 8:
            assert info["assets"] == ("A0", "A4", "A7")  # A0 stays first; joiners as given
    assert truncated
    assert seen == {("A0", "A1", "A2"), ("A0", "A2", "A6", "A3"), ("A0", "A4", "A7")}
    np.testing.assert_allclose(obs, contract_observation(env, market), rtol=1e-6, atol=1e-6)


def test_a_scheduled_change_is_the_same_as_calling_change_universe(market) -> None:
    cfg = EnvConfig(max_assets=4, window=5, episode_length=10, cost_bps=20.0)
    options: dict[str, Any] = {"assets": ["A0", "A1", "A2"], "start": 40}
    scheduled, called = PortfolioEnv(market, cfg), PortfolioEnv(market, cfg)
    obs_a, _ = scheduled.reset(options=options | {"universe_changes": {3: ["A2", "A5", "A0"]}})
    obs_b, _ = called.reset(options=options)
    rng = np.random.default_rng(3)
    for k in range(10):
        if k == 3:
            obs_b, _ = called.change_universe(["A2", "A5", "A0"])
        np.testing.assert_array_equal(obs_a, obs_b)
        action = rng.uniform(-1, 1, 5).astype(np.float32)
        (obs_a, *a, info_a), (obs_b, *b, info_b) = scheduled.step(action), called.step(action)
        assert a == b  # reward, terminated, truncated
        assert ("assets" in info_a) == (k == 2)
        for key in ("raw_weights", "executed_weights", "turnover", "cost", "nav"):
            np.testing.assert_array_equal(info_a[key], info_b[key])
    assert scheduled.asset_names == called.asset_names == ("A0", "A2", "A5")


# --- accounting, by hand -----------------------------------------------------------------


class Book:
    """The step rule by asset id: holdings drift, leavers sold into cash, EMA by id, costs."""

    def __init__(self, beta: float, rate: float) -> None:
        self.holdings: dict[str, float] = {CASH_ID: 1.0}
        self.previous: dict[str, float] | None = None
        self.nav, self.beta, self.rate = 1.0, beta, rate

    def step(self, raw: dict[str, float], t: int, data: MarketData) -> dict[str, Any]:
        ids = list(raw)
        sold = sum(w for a, w in self.holdings.items() if a not in ids)
        current = {a: self.holdings.get(a, 0.0) for a in ids}
        current[CASH_ID] += sold
        blend = {
            a: raw[a]
            if self.previous is None
            else self.beta * self.previous.get(a, 0.0) + (1 - self.beta) * raw[a]
            for a in ids
        }
        total = sum(blend.values())
        s = {a: v / total for a, v in blend.items()}
        turnover = sold + sum(abs(s[a] - current[a]) for a in ids if a != CASH_ID)
        cost = self.rate * turnover * self.nav
        col = {a: j for j, a in enumerate(data.assets)}
        growth = {
            a: 1.0 if a == CASH_ID else data.prices[t + 1, col[a]] / data.prices[t, col[a]]
            for a in ids
        }
        gross = sum(s[a] * growth[a] for a in ids)
        self.nav = (self.nav - cost) * gross
        self.holdings = {a: s[a] * growth[a] / gross for a in ids}
        self.previous = s
        return {"sold": sold, "smoothed": s, "turnover": turnover, "cost": cost}


def test_leavers_are_sold_into_cash_and_the_sale_pays_its_cost(small) -> None:
    env = PortfolioEnv(small, SMALL)
    env.reset(options={"assets": ["A", "B", "C"], "start": START})
    book = Book(beta=0.5, rate=0.01)
    sales: list[float] = []
    plan = [
        {CASH_ID: 0.1, "A": 0.3, "B": 0.4, "C": 0.2},
        {CASH_ID: 0.2, "A": 0.2, "B": 0.5, "C": 0.1},
        {CASH_ID: 0.25, "A": 0.25, "C": 0.25, "D": 0.25},  # B leaves, D joins: slot 2 reused
        {CASH_ID: 0.0, "A": 0.6, "C": 0.0, "D": 0.4},
    ]
    for k, raw in enumerate(plan):
        if k == 2:
            held_b = by_id(env, env.drifted)["B"]
            previous = by_id(env, env.executed)
            _, info = env.change_universe(["C", "D", "A"])
            assert env.asset_names == ("A", "C", "D")
            assert info["liquidation_turnover"] == pytest.approx(held_b)
            holdings = by_id(env, env.drifted)
            assert holdings[CASH_ID] == pytest.approx(book.holdings[CASH_ID] + held_b)
            assert holdings["D"] == 0.0
            carried = by_id(env, env.executed)
            assert carried == {
                CASH_ID: previous[CASH_ID],
                "A": previous["A"],
                "C": previous["C"],
                "D": 0.0,
            }
        want = book.step(raw, env.t, small)
        weights = np.zeros(4)
        weights[: len(raw)] = [raw[a] for a in (CASH_ID, *env.asset_names)]
        _, _, _, _, info = env.step_weights(weights)
        assert info["liquidation_turnover"] == pytest.approx(want["sold"], abs=1e-15)
        assert info["turnover"] == pytest.approx(want["turnover"], rel=1e-12)
        assert info["cost"] == pytest.approx(want["cost"], rel=1e-12)
        assert info["nav"] == pytest.approx(book.nav, rel=1e-12)
        executed = dict(zip((CASH_ID, *env.asset_names), info["executed_weights"], strict=False))
        assert executed == pytest.approx(want["smoothed"], rel=1e-12)
        sales.append(want["sold"])
    # B, about a third of the book, was sold at the change and nowhere else.
    assert sales[2] > 0.3
    assert sales[0] == sales[1] == sales[3] == 0.0


def test_a_change_before_the_first_decision_only_relabels_cash(small) -> None:
    env = PortfolioEnv(small, SMALL)
    env.reset(options={"assets": ["A", "B"], "start": START})
    obs, info = env.change_universe(["B", "C"])
    assert env.asset_names == ("B", "C")
    assert info["liquidation_turnover"] == 0.0
    np.testing.assert_allclose(obs, contract_observation(env, small), atol=1e-6)
    _, _, _, _, info = env.step_weights([0.0, 0.5, 0.5, 0.0])
    np.testing.assert_array_equal(info["executed_weights"], [0.0, 0.5, 0.5, 0.0])  # s_0 = w_0
    assert info["turnover"] == pytest.approx(1.0)


# --- errors ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("assets", "message"),
    [
        (["A", "ZZ"], "unknown asset.*ZZ"),
        (["A", "C", "A"], "duplicate asset"),
        (["A", "B", "C", "D"], "4 assets exceed max_assets=3"),
        ([], "at least one asset"),
        ("A", "list of asset names"),
        (["A", "E"], "asset E has no prices over rows 1..6"),  # delisted before the end
        (["A", "F"], "asset F has no prices over rows 1..6"),  # listed too late for a window
    ],
)
def test_a_bad_universe_is_refused_and_leaves_the_env_unchanged(small, assets, message) -> None:
    env = PortfolioEnv(small, SMALL)
    env.reset(options={"assets": ["A", "B", "C"], "start": START})
    env.step_weights([0.1, 0.3, 0.4, 0.2])
    before = copy.deepcopy(env)
    with pytest.raises(ValueError, match=message):
        env.change_universe(assets)
    assert env.asset_names == before.asset_names
    np.testing.assert_array_equal(env.mask, before.mask)
    weights = [0.2, 0.2, 0.2, 0.4]
    got, want = env.step_weights(weights), before.step_weights(weights)
    np.testing.assert_array_equal(got[0], want[0])
    assert got[1:4] == want[1:4]
    for key in ("executed_weights", "turnover", "cost", "nav"):
        np.testing.assert_array_equal(got[4][key], want[4][key])


def test_a_finished_episode_has_no_universe_to_change(small) -> None:
    env = PortfolioEnv(small, SMALL)
    with pytest.raises(ValueError, match="episode is over"):
        env.change_universe(["A"])  # before the first reset
    env.reset(options={"assets": ["A"], "start": START})
    done = False
    while not done:
        *_, term, trunc, _ = env.step_weights([0.0, 1.0, 0.0, 0.0])
        done = term or trunc
    with pytest.raises(ValueError, match="episode is over"):
        env.change_universe(["B"])


def test_a_schedule_lets_assets_list_and_delist_mid_episode(small) -> None:
    env = PortfolioEnv(small, SMALL)
    # E's last close is row 4: it leaves at decision 2 (row 4), sold at that close. F lists on
    # row 3: with a window of 2 returns it can join at decision 3 (row 5).
    schedule = {2: ["A"], 3: ["A", "F"]}
    env.reset(options={"assets": ["A", "E"], "start": START, "universe_changes": schedule})
    env.step_weights([0.0, 0.5, 0.5, 0.0])
    _, _, _, _, info = env.step_weights([0.0, 0.5, 0.5, 0.0])
    assert info["assets"] == ("A",)
    _, _, _, _, info = env.step_weights([0.0, 1.0, 0.0, 0.0])
    assert info["liquidation_turnover"] > 0.4  # E was about half the book
    assert info["assets"] == ("A", "F")
    *_, truncated, info = env.step_weights([0.0, 0.5, 0.5, 0.0])
    assert truncated
    assert info["liquidation_turnover"] == 0.0


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"universe_changes": {0: ["A"]}}, "step 0 is not a decision after the first"),
        ({"universe_changes": {4: ["A"]}}, "step 4 is not"),
        ({"universe_changes": {2: "A"}}, "must be a list of asset names"),
        ({"universe_changes": {2: []}}, "names no asset"),
        ({"universe_changes": [["A"]]}, "must map a step"),
        ({"universe_changes": {1: ["A", "ZZ"]}}, "unknown asset"),
        ({"universe_changes": {1: ["A", "E"]}}, "asset E has no prices over rows 1..6"),
        ({"universe_changes": {3: ["A", "F"]}}, None),  # F's window starts on row 3: fine
        ({"assets": ["A", "E"]}, "asset E has no prices over the whole episode"),
        ({"assets": ["A", "E"], "universe_changes": {3: ["A"]}}, "E has no prices over rows 0..5"),
    ],
)
def test_a_bad_schedule_is_refused_at_reset(small, options, message) -> None:
    env = PortfolioEnv(small, SMALL)
    options = {"assets": ["A"], "start": START} | options
    if message is None:
        env.reset(options=options)
        return
    with pytest.raises(ValueError, match=message):
        env.reset(options=options)


# --- rewards and the gymnasium contract --------------------------------------------------


def test_the_history_moves_by_asset_id_and_a_joiner_counts_from_its_join(small) -> None:
    env = PortfolioEnv(small, SMALL)
    env.reset(options={"assets": ["A", "B", "C"], "start": START})
    env.step_weights([0.1, 0.3, 0.4, 0.2])
    env.step_weights([0.1, 0.3, 0.4, 0.2])
    env.change_universe(["C", "D", "A"])  # B leaves; slots: A, C, D
    h = env.history
    np.testing.assert_array_equal(h.prices[:3, 1], CLOSES["A"][2:5])
    np.testing.assert_array_equal(h.prices[:3, 2], CLOSES["C"][2:5])
    np.testing.assert_array_equal(h.prices[:3, 3], [CLOSES["D"][4]] * 3)  # flat until it joined
    assert np.all(h.weights[:3, 3] == 0.0)
    np.testing.assert_array_equal(h.mask, env.mask)
    env.step_weights([0.1, 0.3, 0.3, 0.3])
    _, returns, _ = window_credit_inputs(h, window=30)
    d = CLOSES["D"]
    assert returns[3] == pytest.approx(d[5] / d[4] - 1.0)  # D's move since it joined, not B's
    assert returns[2] == pytest.approx(CLOSES["C"][5] / CLOSES["C"][2] - 1.0)


@pytest.mark.parametrize("kind", list(RewardKind))
def test_every_reward_runs_across_universe_changes(market, kind) -> None:
    penalties = PenaltySettings(turnover=0.1, jitter=0.1, total_variation=0.1)
    reward = RewardConfig(kind=kind, penalties=penalties)
    env = PortfolioEnv(market, EnvConfig(max_assets=5, window=5, episode_length=25, reward=reward))
    schedule = {5: ["A3", "A4"], 12: ["A4", "A0", "A1", "A2", "A6"], 20: ["A7"]}
    env.reset(seed=2, options={"assets": ["A0", "A1", "A2"], "universe_changes": schedule})
    rng = np.random.default_rng(1)
    rewards = []
    done = False
    while not done:
        _, r, term, trunc, info = env.step(rng.uniform(-1, 1, 6).astype(np.float32))
        rewards.append(r)
        done = term or trunc
        np.testing.assert_allclose(info["executed_weights"].sum(), 1.0)
    assert len(rewards) == 25
    assert np.all(np.isfinite(rewards))
    assert env.asset_names == ("A7",)


class ChangingEnv(PortfolioEnv):
    """Every episode changes its universe twice (what ``check_env`` cannot ask for)."""

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        schedule = {2: ["A1", "A5"], 4: ["A5", "A6", "A2", "A0"]}
        defaults = {"assets": ["A0", "A1", "A2"], "universe_changes": schedule}
        return super().reset(seed=seed, options=defaults | (options or {}))


@pytest.mark.parametrize("changes", REPRESENTATIONS.values(), ids=REPRESENTATIONS.keys())
def test_the_gymnasium_checker_passes_with_universe_changes(market, changes) -> None:
    env = ChangingEnv(market, EnvConfig(max_assets=4, window=5, episode_length=8, **changes))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_env(env, skip_render_check=True)
    assert [str(w.message) for w in caught] == []
    env.reset(seed=0)
    for _ in range(8):
        obs, *_ = env.step(env.action_space.sample())
        assert env.observation_space.contains(obs)
        assert env.drifted.sum() == pytest.approx(1.0)
        assert env.drifted[~env.mask].sum() == 0.0
