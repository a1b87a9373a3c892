"""PortfolioEnv on small synthetic markets: accounting, smoothing, sampling, observations, errors.

Expected values are rebuilt from the raw data prices with plain numpy (shares times price moves,
drifted weights, EMA blends), never read back from the environment's own internals.
"""

from __future__ import annotations

import warnings
from typing import Any

import gymnasium as gym
import numpy as np
import pandas as pd
import pytest
from gymnasium.utils.env_checker import check_env
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from allocator.portfolio import build_observation, ema_smooth
from allocator.trainer.market.data import MarketData, from_wide, load_sp500
from allocator.trainer.sim.env import ENV_ID, EnvConfig, PortfolioEnv
from allocator.trainer.sim.rewards import PenaltySettings, RewardConfig, RewardKind

M, W, LENGTH, BETA, BPS = 4, 5, 50, 0.3, 10.0
CFG = EnvConfig(max_assets=M, window=W, episode_length=LENGTH, cost_bps=BPS, beta=BETA)


def config(**changes: Any) -> EnvConfig:
    """CFG with some fields changed, validated again (``model_copy`` would skip validation)."""
    return EnvConfig(**(CFG.model_dump() | changes))


def synthetic(
    n_dates: int = 300, n_assets: int = 5, seed: int = 0, spans: dict[int, slice] | None = None
) -> MarketData:
    """Geometric random walks on business days; ``spans`` lists some assets only on a slice."""
    rng = np.random.default_rng(seed)
    steps = rng.normal(0.0003, 0.015, size=(n_dates, n_assets))
    prices = 20.0 * rng.uniform(1, 5, n_assets) * np.exp(np.cumsum(steps, axis=0))
    for j, span in (spans or {}).items():
        listed = np.zeros(n_dates, dtype=bool)
        listed[span] = True
        prices[~listed, j] = np.nan
    dates = pd.bdate_range("2019-01-01", periods=n_dates)
    frame = pd.DataFrame(prices, index=dates, columns=[f"A{j}" for j in range(n_assets)])
    return from_wide(frame, source="synthetic")


@pytest.fixture(scope="module")
def data() -> MarketData:
    return synthetic()


@pytest.fixture
def env(data: MarketData) -> PortfolioEnv:
    return PortfolioEnv(data, CFG)


def weights_block(obs: np.ndarray) -> np.ndarray:
    return obs[M * W : M * W + M + 1]


def mask_block(obs: np.ndarray) -> np.ndarray:
    return obs[M * W + M + 1 :]


def features_block(obs: np.ndarray) -> np.ndarray:
    return obs[: M * W].reshape(M, W)


def play(
    env: PortfolioEnv, rng: np.random.Generator, seed: int | None = None, **options: Any
) -> list[dict[str, Any]]:
    """One episode with uniform random actions; what was known before and after each step."""
    obs, info = env.reset(seed=seed, options=options or None)
    out = []
    done = False
    while not done:
        before = {
            "t": env.t,
            "idx": env.asset_index.copy(),
            "mask": env.mask.copy(),
            "nav": env.nav,
            "obs": obs,
        }
        action = rng.uniform(-1, 1, env.n_slots).astype(np.float32)
        obs, reward, term, trunc, info = env.step(action)
        out.append(
            {
                **before,
                "action": action,
                "next_obs": obs,
                "reward": reward,
                "term": term,
                "trunc": trunc,
                "info": info,
            }
        )
        done = term or trunc
    return out


def slot_prices(data: MarketData, idx: np.ndarray, t: int) -> np.ndarray:
    """Closes of the env's slots at row t: cash 1, live assets from the data, empty slots 1."""
    p = np.ones(M + 1)
    p[1 : idx.size + 1] = data.prices[t, idx]
    return p


# --- the gymnasium contract -------------------------------------------------------------


def test_check_env_passes_without_any_warning(data):
    env = gym.make(ENV_ID, data=data, config=CFG)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_env(env.unwrapped)
    assert [str(w.message) for w in caught] == []
    assert isinstance(env.unwrapped, PortfolioEnv)
    assert env.unwrapped.config == CFG


def test_observations_lie_in_the_observation_space_for_a_small_obs_clip(data):
    env = PortfolioEnv(data, config(obs_clip=0.5))  # a valid config: obs_clip > 0
    obs, _ = env.reset(seed=0)
    assert env.observation_space.contains(obs)


def test_spaces_have_the_policy_contract_shapes(env):
    assert env.action_space.shape == (M + 1,)
    assert env.observation_space.shape == (M * W + 2 * (M + 1),)
    obs, _ = env.reset(seed=3)
    assert obs.dtype == np.float32
    assert env.observation_space.contains(obs)


# --- accounting -------------------------------------------------------------------------


def test_nav_change_is_holdings_gain_minus_cost(env, data):
    rng = np.random.default_rng(11)
    for seed in range(6):
        drifted = np.eye(M + 1)[0]  # all cash before the first decision
        for s in play(env, rng, seed=seed):
            info, nav = s["info"], s["nav"]
            k = s["idx"].size
            p_now = slot_prices(data, s["idx"], s["t"])
            p_next = slot_prices(data, s["idx"], s["t"] + 1)
            shares = info["shares"]
            assert np.all(shares[k + 1 :] == 0.0)
            # holdings are bought after costs: their value at t is NAV - cost
            assert shares @ p_now == pytest.approx(nav - info["cost"], rel=1e-12)
            gain = float(np.sum(shares[1 : k + 1] * (p_next[1 : k + 1] - p_now[1 : k + 1])))
            assert info["nav"] - nav == pytest.approx(gain - info["cost"], abs=1e-12 * nav)
            # turnover: traded value over NAV, assets only (cash is the counterpart)
            exe = info["executed_weights"]
            turnover = float(np.sum(np.abs(exe[1:] - drifted[1:])))
            assert info["turnover"] == pytest.approx(turnover, rel=1e-12, abs=1e-15)
            assert info["cost"] == pytest.approx(BPS / 1e4 * turnover * nav, rel=1e-12, abs=1e-18)
            # weights drift with prices: value of each holding at t+1 over the new NAV
            value = shares * p_next
            assert value.sum() == pytest.approx(info["nav"], rel=1e-12)
            drifted = value / info["nav"]
            np.testing.assert_allclose(weights_block(s["next_obs"]), drifted, atol=1e-7)


def test_executed_weights_are_the_ema_of_mapped_actions(env):
    rng = np.random.default_rng(5)
    for seed in range(4):
        prev = None
        for s in play(env, rng, seed=seed):
            live = s["mask"]
            # affine map to preferences in [0, 1], masked slots dropped, renormalized
            pref = (s["action"].astype(np.float64) + 1.0) / 2.0 * live
            raw = pref / pref.sum()
            np.testing.assert_allclose(s["info"]["raw_weights"], raw, rtol=1e-12, atol=1e-15)
            exe = s["info"]["executed_weights"]
            if prev is None:
                np.testing.assert_allclose(exe, raw, rtol=1e-12, atol=1e-15)
            else:
                # both are distributions on the same mask, so the blend needs no renormalizing
                np.testing.assert_allclose(exe, BETA * prev + (1 - BETA) * raw, atol=1e-12)
                np.testing.assert_allclose(exe, ema_smooth(prev, raw, live, BETA), atol=1e-15)
            assert exe.sum() == pytest.approx(1.0, abs=1e-12)
            assert np.all(exe[~live] == 0.0)
            prev = exe


def test_costs_reduce_nav_by_exactly_the_compounded_cost_factors(data):
    free = PortfolioEnv(data, config(cost_bps=0.0))
    costly = PortfolioEnv(data, config(cost_bps=50.0))
    pin = {"assets": ["A1", "A3", "A4"], "start": 60, "episode_length": 40}
    a = play(free, np.random.default_rng(9), **pin)
    b = play(costly, np.random.default_rng(9), **pin)
    # executed weights and hence turnover do not depend on NAV, so they match step for step
    turnover = np.array([s["info"]["turnover"] for s in b])
    np.testing.assert_allclose([s["info"]["turnover"] for s in a], turnover, rtol=1e-12)
    assert all(s["info"]["cost"] == 0.0 for s in a)
    assert sum(s["info"]["cost"] for s in b) > 0
    # NAV' = NAV (1 - c * turnover) then grows by the same factor in both runs
    assert b[-1]["info"]["nav"] < a[-1]["info"]["nav"]
    ratio = float(np.prod(1.0 - 50.0 / 1e4 * turnover))
    assert b[-1]["info"]["nav"] / a[-1]["info"]["nav"] == pytest.approx(ratio, rel=1e-12)


@settings(max_examples=25, deadline=None)
@given(
    actions=st.lists(
        st.lists(st.floats(-1, 1, width=32), min_size=M + 1, max_size=M + 1),
        min_size=6,
        max_size=6,
    ),
    seed=st.integers(0, 1000),
)
def test_any_action_sequence_keeps_a_valid_portfolio(data, actions, seed):
    env = PortfolioEnv(data, config(episode_length=6))
    obs, _ = env.reset(seed=seed)
    nav = env.nav
    for a in actions:
        obs, reward, term, trunc, info = env.step(np.array(a, dtype=np.float32))
        assert env.observation_space.contains(obs)
        assert np.isfinite(reward)
        for w in (info["raw_weights"], info["executed_weights"], weights_block(obs)):
            assert np.all(w >= 0)
            assert float(np.sum(w)) == pytest.approx(1.0, abs=1e-6)
            assert np.all(w[~env.mask] == 0)
        # costs can never exceed the whole NAV: at most 2 * cost_bps of it per step
        assert info["cost"] <= 2 * BPS / 1e4 * nav * (1 + 1e-12)
        assert info["nav"] > 0
        nav = info["nav"]
    assert trunc
    assert not term


# --- determinism and sampling -----------------------------------------------------------


def test_same_seed_replays_the_same_episode(data):
    runs = [play(PortfolioEnv(data, CFG), np.random.default_rng(2), seed=42) for _ in range(2)]
    other = play(PortfolioEnv(data, CFG), np.random.default_rng(2), seed=43)
    for x, y in zip(*runs, strict=True):
        assert x["t"] == y["t"]
        assert np.array_equal(x["idx"], y["idx"])
        assert np.array_equal(x["obs"], y["obs"])
        assert x["reward"] == y["reward"]
    first, alt = runs[0][0], other[0]
    assert (first["t"], tuple(first["idx"])) != (alt["t"], tuple(alt["idx"]))


def test_random_subsets_vary_in_size_and_fill_the_first_slots(env):
    env.reset(seed=0)
    sizes = set()
    for _ in range(200):
        obs, info = env.reset()
        k = env.asset_index.size
        sizes.add(k)
        assert len(set(env.asset_index.tolist())) == k  # no asset twice
        assert info["assets"] == tuple(f"A{i}" for i in env.asset_index)
        assert env.mask.tolist() == [True] * (k + 1) + [False] * (M - k)
        assert mask_block(obs).tolist() == env.mask.astype(float).tolist()
        assert weights_block(obs).tolist() == [1.0] + [0.0] * M  # starts in cash
        assert np.all(features_block(obs)[k:] == 0.0)
        assert np.all(np.any(features_block(obs)[:k] != 0.0, axis=1))
        assert W <= env.t <= 300 - 1 - LENGTH
    assert sizes == {1, 2, 3, 4}


def test_min_assets_bounds_the_subset_size(data):
    env = PortfolioEnv(data, config(min_assets=3))
    env.reset(seed=1)
    sizes = {len(env.reset()[1]["assets"]) for _ in range(100)}
    assert sizes == {3, 4}


def test_sampled_assets_trade_over_the_whole_episode():
    # A3 lists from row 150, A4 delists after row 120: each is eligible for only some starts
    late = synthetic(spans={3: slice(150, None), 4: slice(0, 121)})
    env = PortfolioEnv(late, CFG)
    env.reset(seed=4)
    seen = set()
    for _ in range(300):
        env.reset()
        t0 = env.t
        for i in env.asset_index:
            seen.add(int(i))
            window_and_episode = late.prices[t0 - W : t0 + LENGTH + 1, i]
            assert np.all(np.isfinite(window_and_episode))
    assert seen == {0, 1, 2, 3, 4}


def test_observation_matches_build_observation_from_raw_prices(env, data):
    rng = np.random.default_rng(8)
    spec = CFG.feature_spec

    def expected(t: int, idx: np.ndarray, weights: np.ndarray, mask: np.ndarray) -> np.ndarray:
        window = np.full((M, W + 1), np.nan)  # masked rows stay NaN: they must be ignored
        window[: idx.size] = data.prices[t - W : t + 1, idx].T  # closes t-W .. t
        return build_observation(window, weights, mask, spec, env.stats)

    for seed in range(3):
        drifted = np.eye(M + 1)[0]
        for s in play(env, rng, seed=seed):
            obs = expected(s["t"], s["idx"], drifted, s["mask"])
            np.testing.assert_allclose(s["obs"], obs, rtol=1e-6, atol=1e-6)
            info = s["info"]
            drifted = info["shares"] * slot_prices(data, s["idx"], s["t"] + 1) / info["nav"]
        final = expected(s["t"] + 1, s["idx"], drifted, s["mask"])
        np.testing.assert_allclose(s["next_obs"], final, rtol=1e-6, atol=1e-6)


# --- pinned episodes and errors ---------------------------------------------------------


def test_pinned_episode_by_date_holds_the_named_assets_in_order(env, data):
    # 2019-06-01 is a Saturday: the episode starts on the next trading day
    _, info = env.reset(
        options={"assets": ["A3", "A1"], "start": "2019-06-01", "episode_length": 10}
    )
    t0 = data.dates.get_loc(pd.Timestamp("2019-06-03"))
    assert env.t == t0
    assert info["date"] == pd.Timestamp("2019-06-03")
    assert info["assets"] == ("A3", "A1")
    assert env.mask.tolist() == [True, True, True, False, False]
    # all in slot 1 (A3): one unit of turnover, then the position just rides the price
    a3 = data.assets.index("A3")
    for k in range(10):
        _, _, term, trunc, info = env.step_weights([0.0, 1.0, 0.0, 0.0, 0.0])
        assert not term
        assert trunc == (k == 9)
    # NAV = 1 * (1 - 10bp) * P_end / P_start, whatever the EMA (it blends A3 with A3)
    expected = (1 - BPS / 1e4) * data.prices[t0 + 10, a3] / data.prices[t0, a3]
    assert info["nav"] == pytest.approx(expected, rel=1e-12)
    assert env.date == data.dates[t0 + 10]
    with pytest.raises(RuntimeError, match="episode is over"):
        env.step(np.zeros(M + 1, np.float32))


def test_pinned_start_by_index_and_clipped_length(env, data):
    _, info = env.reset(options={"start": 100, "episode_length": 7})
    assert env.t == 100
    assert info["date"] == data.dates[100]
    n = len(play(env, np.random.default_rng(0), start=100, episode_length=7))
    assert n == 7
    # three closes left after the start: the episode shortens to 3 steps
    assert len(play(env, np.random.default_rng(0), start=data.n_dates - 4)) == 3


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"assets": ["A0", "ZZZ"]}, "unknown asset.*ZZZ"),
        ({"assets": ["A0", "A1", "A2", "A3", "A4"]}, "5 assets exceed max_assets=4"),
        ({"start": W - 1}, f"start needs {W} earlier closes"),
        ({"start": "2018-01-01"}, f"start needs {W} earlier closes"),
        ({"start": 299}, "no steps"),
        ({"episode_length": 300}, "cannot hold a window of 5 and an episode of 300"),
    ],
)
def test_reset_rejects_impossible_episodes(env, options, message):
    with pytest.raises(ValueError, match=message):
        env.reset(options=options)


def test_reset_rejects_an_asset_not_listed_over_the_episode():
    late = synthetic(spans={2: slice(150, None)})
    env = PortfolioEnv(late, CFG)
    with pytest.raises(ValueError, match="asset A2 has no prices over the whole episode"):
        env.reset(options={"assets": ["A0", "A2"], "start": 120})
    env.reset(options={"assets": ["A0", "A2"], "start": 150 + W})  # listed long enough


def test_step_after_the_end_raises(env):
    play(env, np.random.default_rng(0), seed=0)
    with pytest.raises(RuntimeError, match="call reset"):
        env.step_weights([1.0, 0.0, 0.0, 0.0, 0.0])


@pytest.mark.parametrize(
    "weights",
    [
        [0.5, 0.4, 0.0, 0.0, 0.0],  # sums to 0.9
        [1.2, -0.2, 0.0, 0.0, 0.0],  # negative
        [0.5, 0.0, 0.0, 0.0, 0.5],  # mass on a masked slot
        [0.5, 0.5, 0.0, 0.0],  # wrong length
        [np.nan, 1.0, 0.0, 0.0, 0.0],
    ],
)
def test_step_weights_rejects_non_distributions(env, weights):
    env.reset(options={"assets": ["A0", "A1"], "start": 50})
    with pytest.raises(ValueError, match="distribution over the live slots"):
        env.step_weights(weights)
    # a valid distribution over the live slots is accepted
    env.step_weights([0.2, 0.3, 0.5, 0.0, 0.0])


# --- rewards through the environment ----------------------------------------------------


@pytest.mark.parametrize("kind", list(RewardKind))
def test_every_reward_kind_runs_a_full_episode(data, kind):
    reward = RewardConfig(
        kind=kind, penalties=PenaltySettings(turnover=0.01, jitter=0.1, total_variation=0.01)
    )
    env = PortfolioEnv(data, config(reward=reward))
    steps = play(env, np.random.default_rng(3), seed=7)
    rewards = np.array([s["reward"] for s in steps])
    assert rewards.size == LENGTH
    assert np.all(np.isfinite(rewards))
    assert np.unique(rewards).size > 1
    assert steps[-1]["trunc"]
    assert not any(s["term"] for s in steps)


def test_transaction_cost_reward_is_the_step_return_through_the_env(data):
    reward = RewardConfig(transaction_cost={"long_weight": 0.0})
    env = PortfolioEnv(data, config(reward=reward))
    for s in play(env, np.random.default_rng(4), seed=1):
        assert s["reward"] == pytest.approx(s["info"]["nav"] / s["nav"] - 1, rel=1e-12)


# --- the embedded S&P 500 ---------------------------------------------------------------


def test_sp500_buy_and_hold_earns_the_price_return_less_one_entry_cost():
    data = load_sp500()
    env = PortfolioEnv(data)  # default config: 20 slots, window 30, 10bp, beta 0.5
    _, info = env.reset(
        options={"assets": ["AAPL", "BAC"], "start": "2020-03-02", "episode_length": 20}
    )
    t0 = env.t
    assert data.dates[t0] == pd.Timestamp("2020-03-02")
    target = np.zeros(21)
    target[2] = 1.0  # all in BAC
    turnovers = []
    for _ in range(20):
        *_, info = env.step_weights(target)
        turnovers.append(info["turnover"])
    assert turnovers[0] == 1.0
    assert turnovers[1:] == pytest.approx([0.0] * 19, abs=1e-12)
    bac = data.assets.index("BAC")
    expected = (1 - 10 / 1e4) * data.prices[t0 + 20, bac] / data.prices[t0, bac]
    assert info["nav"] == pytest.approx(expected, rel=1e-12)


def test_costs_can_never_exceed_nav(data):
    """The worst trade (turnover 2) at the highest allowed cost still leaves NAV positive."""
    with pytest.raises(ValidationError, match="cost_bps"):
        config(cost_bps=5000)
    env = PortfolioEnv(data, config(cost_bps=4999, beta=0.0))
    env.reset(options={"assets": ["A0", "A1"], "start": 50})
    env.step_weights([0.0, 1.0, 0.0, 0.0, 0.0])
    _, _, terminated, _, info = env.step_weights([0.0, 0.0, 1.0, 0.0, 0.0])
    assert info["turnover"] == pytest.approx(2.0, abs=0.05)
    assert info["nav"] > 0.0
    assert not terminated


def test_stepping_a_finished_episode_raises(data):
    env = PortfolioEnv(data, config(episode_length=2))
    with pytest.raises(RuntimeError, match="reset"):
        env.step(np.zeros(M + 1, np.float32))  # never reset
    env.reset(seed=0)
    env.step(np.zeros(M + 1, np.float32))
    _, _, _, truncated, _ = env.step(np.zeros(M + 1, np.float32))
    assert truncated
    with pytest.raises(RuntimeError, match="episode is over"):
        env.step(np.zeros(M + 1, np.float32))


def test_duplicate_assets_are_refused(data):
    env = PortfolioEnv(data, CFG)
    with pytest.raises(ValueError, match="duplicate asset"):
        env.reset(options={"assets": ["A0", "A0"], "start": 50})
