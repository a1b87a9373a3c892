"""PortfolioEnv with the per-asset feature set and the anchor-tilt mapping.

Expected observations and weights are rebuilt with the ``portfolio`` contract functions from
the raw closes of the data, never read back from the environment's precomputed arrays.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env
from pydantic import ValidationError

from allocator.portfolio import (
    AnchorKind,
    AnchorSpec,
    anchor_weights,
    build_asset_observation,
    fit_feature_normalization,
    tilt_weights,
)
from allocator.trainer.market.data import MarketData
from allocator.trainer.sim.backtest import run_backtest
from allocator.trainer.sim.baselines import ActionPolicy
from allocator.trainer.sim.env import EnvConfig, PortfolioEnv
from tests.markets import random_walk_market

M = 6
BASE = {"max_assets": M, "window": 8, "episode_length": 40, "horizons": [3, 12], "vol_window": 6}
TILT = {"mapping": "tilt", "k": 1.5, "anchor": {"kind": "inverse_volatility", "vol_window": 15}}


def config(**changes: Any) -> EnvConfig:
    return EnvConfig(**(BASE | changes))


@pytest.fixture(scope="module")
def data() -> MarketData:
    return random_walk_market(n_dates=220, n_assets=5, seed=3)


def slot_prices(env: PortfolioEnv, data: MarketData, n_prices: int) -> np.ndarray:
    """The live slots' last ``n_prices`` closes at the next decision, (M, P), NaN when empty."""
    out = np.full((env.config.max_assets, n_prices), np.nan)
    rows = data.prices[env.t - n_prices + 1 : env.t + 1][:, env.asset_index]
    out[: env.asset_index.size] = rows.T
    return out


def test_defaults_are_the_return_window_with_the_affine_mapping() -> None:
    cfg = EnvConfig()
    assert cfg.features == "returns"
    assert cfg.action.mapping == "affine"
    assert cfg.is_default_representation
    assert cfg.n_features == cfg.window
    assert cfg.history == cfg.window


@pytest.mark.parametrize("action", [None, TILT], ids=["affine", "tilt-longer-anchor-window"])
def test_asset_v1_observation_is_the_contract_observation_of_the_raw_prices(data, action) -> None:
    """With the tilt, the anchor needs more history (15 returns) than the features (12): the
    features must still end at the decision date, not lag by the difference."""
    extra = {} if action is None else {"action": action}
    env = PortfolioEnv(data, config(features="asset_v1", **extra))
    spec = env.config.asset_feature_spec
    assert env.n_features == spec.n_features == 8 + 3 * 2 + 2
    obs, _ = env.reset(seed=4, options={"assets": ["A3", "A0", "A4"]})
    rng = np.random.default_rng(0)
    for _ in range(5):
        expected = build_asset_observation(
            slot_prices(env, data, spec.prices_per_asset),
            env.drifted,
            env.mask,
            spec,
            env.feature_norm,
        )
        np.testing.assert_array_equal(obs, expected)
        assert env.observation_space.contains(obs)
        obs, *_ = env.step(rng.uniform(-1, 1, M + 1).astype(np.float32))


def test_feature_normalization_defaults_to_the_env_data_and_a_given_one_is_used(data) -> None:
    cfg = config(features="asset_v1")
    env = PortfolioEnv(data, cfg)
    assert env.feature_norm == fit_feature_normalization(data.prices, cfg.asset_feature_spec)
    early = fit_feature_normalization(data.prices[:100], cfg.asset_feature_spec)
    assert early != env.feature_norm
    assert PortfolioEnv(data, cfg, feature_norm=early).feature_norm is early


def test_tilt_mapping_steps_with_the_tilt_of_the_decision_anchor(data) -> None:
    env = PortfolioEnv(data, config(action=TILT))
    anchor_spec = AnchorSpec(AnchorKind.INVERSE_VOLATILITY, cash_share=0.05, vol_window=15)
    env.reset(seed=1, options={"assets": ["A1", "A2", "A0"]})
    rng = np.random.default_rng(2)
    for step in range(6):
        anchor = anchor_weights(slot_prices(env, data, 16), env.mask, anchor_spec)
        np.testing.assert_array_equal(env.anchor, anchor)
        action = rng.uniform(-1, 1, M + 1).astype(np.float32) * (step > 0)
        _, _, _, _, info = env.step(action)
        expected = anchor if step == 0 else tilt_weights(action, anchor, env.mask, 1.5)
        np.testing.assert_array_equal(info["raw_weights"], expected)
        assert info["raw_weights"][4:].sum() == 0.0  # empty slots stay empty


@pytest.mark.parametrize("kind", ["min_variance", "hrp"])
def test_risk_anchors_reset_and_step_with_the_contract_anchor(data, kind) -> None:
    action = {"mapping": "tilt", "k": 1.5, "anchor": {"kind": kind, "vol_window": 15}}
    env = PortfolioEnv(data, config(action=action))
    anchor_spec = AnchorSpec(AnchorKind(kind), cash_share=0.05, vol_window=15)
    env.reset(seed=2, options={"assets": ["A3", "A1", "A4", "A0"]})
    for _ in range(3):
        anchor = anchor_weights(slot_prices(env, data, 16), env.mask, anchor_spec)
        np.testing.assert_array_equal(env.anchor, anchor)
        _, _, _, _, info = env.step(np.zeros(M + 1, np.float32))
        np.testing.assert_array_equal(info["raw_weights"], anchor)
    equal = anchor_weights(slot_prices(env, data, 16), env.mask, AnchorSpec())
    assert np.abs(env.anchor - equal).max() > 1e-3  # a risk allocation, not equal weight


def test_history_covers_the_longest_of_features_and_anchor(data) -> None:
    assert config(features="asset_v1").history == 12  # the longest horizon
    assert config(action=TILT).history == 15  # the anchor's volatility window
    env = PortfolioEnv(data, config(action=TILT))
    with pytest.raises(ValueError, match="15 earlier closes"):
        env.reset(options={"start": 14})
    env.reset(options={"start": 15})


@pytest.mark.parametrize("changes", [{"features": "asset_v1"}, {"action": TILT}])
def test_new_representations_pass_the_gymnasium_checker(data, changes) -> None:
    check_env(PortfolioEnv(data, config(**changes)), skip_render_check=True)


@pytest.mark.parametrize(
    ("changes", "key"),
    [
        ({"features": "prices"}, "features"),
        ({"horizons": [5, 5]}, "horizons"),
        ({"horizons": []}, "horizons"),
        ({"action": {"mapping": "softmax"}}, "mapping"),
        ({"action": {"mapping": "tilt", "k": 0}}, "k"),
        ({"action": {"anchor": {"kind": "risk_parity"}}}, "kind"),
        ({"action": {"anchor": {"cash_share": 1.0}}}, "cash_share"),
    ],
)
def test_bad_representation_settings_are_refused(changes, key) -> None:
    with pytest.raises(ValidationError, match=key):
        config(**changes)


def test_backtest_of_a_zero_actor_under_tilt_holds_the_anchor(data) -> None:
    """An untrained (zero) actor under the tilt mapping is the anchor, not a frozen book."""
    cfg = config(features="asset_v1", action={"mapping": "tilt", "anchor": {"cash_share": 0.2}})
    zero = ActionPolicy(lambda obs: np.zeros(M + 1, np.float32), name="zero")
    result = run_backtest(
        zero, data, start=data.dates[60], end=data.dates[90], max_assets=M, env_config=cfg
    )
    raw = result.raw_weights.to_numpy()
    expected = np.array([0.2] + [0.16] * 5 + [0.0])
    np.testing.assert_allclose(raw, np.tile(expected, (len(raw), 1)), atol=1e-15)
    affine = run_backtest(zero, data, start=data.dates[60], end=data.dates[90], max_assets=M)
    np.testing.assert_allclose(affine.raw_weights.iloc[0, :6], 1 / 6)  # (0 + 1) / 2, cash too


def test_an_asset_listed_late_gets_the_contract_features_once_it_trades() -> None:
    """The dataset's feature table holds NaN before a listing; episodes that include the asset
    start after it and must see exactly the contract features of its closes."""
    market = random_walk_market(n_dates=200, n_assets=4, seed=8)
    prices = market.prices.copy()
    prices[:90, 2] = np.nan  # A2 lists on row 90
    late = MarketData(prices=prices, dates=market.dates, assets=market.assets, source="late")
    env = PortfolioEnv(late, config(features="asset_v1", max_assets=4))
    spec = env.config.asset_feature_spec
    obs, _ = env.reset(options={"assets": ["A2", "A0"], "start": 90 + spec.lookback})
    for _ in range(3):
        expected = build_asset_observation(
            slot_prices(env, late, spec.prices_per_asset),
            env.drifted,
            env.mask,
            spec,
            env.feature_norm,
        )
        np.testing.assert_array_equal(obs, expected)
        assert np.all(np.isfinite(obs))
        obs, *_ = env.step(np.zeros(5, dtype=np.float32))
    with pytest.raises(ValueError, match="A2 has no prices"):
        env.reset(options={"assets": ["A2"], "start": 90})
