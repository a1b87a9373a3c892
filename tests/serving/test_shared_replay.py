"""A shared policy replayed through the serving path against the training side's own results.

Constant universe: the environment's backtest (``PortfolioEnv`` with the per-asset features
and the tilt mapping) of the torch actor equals the serving replay of its exported graph, with
fewer and with more assets than the 6 training slots. Changing universe (assets listing and
delisting midway, the mask changing under the smoothing): the replay equals a decision-by-
decision simulation built from the contract functions the environment uses and the torch
actor, tracked by asset id like the environment's accounting.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch as th

from allocator.portfolio import (
    CASH_ID,
    anchor_weights,
    asset_features,
    ema_smooth,
    normalize_features,
    tilt_weights,
)
from allocator.serving import LoadedModel, load_model
from allocator.serving.replay import live_assets, replay
from allocator.trainer.sim.backtest import run_backtest
from allocator.trainer.sim.baselines import DecisionContext
from tests.serving.shared_models import (
    COST_BPS,
    SLOTS,
    SharedFixture,
    build_fixture,
    reference_action,
    write_shared_model,
)

th.set_num_threads(1)
START, END = 90, 125


@pytest.fixture(scope="module")
def fixture() -> SharedFixture:
    return build_fixture()


@pytest.fixture(scope="module")
def shared(fixture: SharedFixture, tmp_path_factory: pytest.TempPathFactory) -> LoadedModel:
    d = write_shared_model(tmp_path_factory.mktemp("replay") / "shared" / "1", fixture)
    return load_model(d, prefer_cuda=False)


class TorchPolicy:
    """The torch actor on the environment's own observation, mapped by the environment."""

    name = "torch-shared"

    def __init__(self, fixture: SharedFixture) -> None:
        self.fixture = fixture

    def __call__(self, ctx: DecisionContext) -> np.ndarray:
        n_slots, f = ctx.n_slots, self.fixture.n_features
        m = n_slots - 1
        obs = ctx.observation
        features = obs[: m * f].reshape(1, m, f)
        weights = obs[m * f : m * f + n_slots][None]
        mask = obs[m * f + n_slots :][None]
        action = reference_action(self.fixture, features, weights, mask)[0]
        assert ctx.to_weights is not None
        return ctx.to_weights(action)


@pytest.mark.parametrize("n_assets", [4, 11])
def test_constant_universe_matches_the_environments_backtest(
    shared: LoadedModel, fixture: SharedFixture, n_assets: int
) -> None:
    data = fixture.data
    names = list(data.assets[:n_assets])
    bt = run_backtest(
        TorchPolicy(fixture),
        data,
        start=data.dates[START],
        end=data.dates[END],
        assets=names,
        cost_bps=COST_BPS,
        beta=fixture.config.beta,
        max_assets=SLOTS,
        env_config=fixture.config,
        feature_norm=fixture.norm,
    )
    frame = data.to_frame()[names]
    result = replay(shared, frame, start=data.dates[START], end=data.dates[END])
    assert len(result.outputs) == len(bt.turnover) == END - START
    columns = ["cash", *names]  # the backtest names its cash column in lower case
    np.testing.assert_allclose(result.wide("raw_weights"), bt.raw_weights[columns], atol=1e-6)
    np.testing.assert_allclose(
        result.wide("smoothed_weights"), bt.executed_weights[columns], atol=1e-6
    )
    np.testing.assert_allclose(result.turnover, bt.turnover, atol=1e-6)
    np.testing.assert_allclose(result.nav, bt.nav, rtol=1e-6)
    # The policy did something: not the anchor, and the smoothing mattered.
    raw = result.wide("raw_weights")
    assert np.max(np.abs(raw - raw.mean(axis=0))) > 1e-2
    assert np.max(np.abs(raw - result.wide("smoothed_weights"))) > 1e-3


def changing_frame(fixture: SharedFixture) -> pd.DataFrame:
    """Nine assets: A8 lists at row 100, A2 delists after row 110 (more than 6 live always)."""
    frame = fixture.data.to_frame().iloc[:, :9].copy()
    frame.iloc[:100, 8] = np.nan
    frame.iloc[111:, 2] = np.nan
    return frame


def simulate(fixture: SharedFixture, frame: pd.DataFrame, history: int) -> dict[str, list]:
    """The environment's step rule over a changing universe, by asset id: features, anchor and
    tilt from the contract, the torch action, EMA smoothing from the previous executed weights
    of the assets still present, departed holdings sold into cash, costs, drift."""
    config, spec = fixture.config, fixture.config.asset_feature_spec
    p = frame.to_numpy()
    live = live_assets(p, history)
    names = list(frame.columns)
    holdings: dict[str, float] = {CASH_ID: 1.0}
    previous: dict[str, float] | None = None
    nav, rate = 1.0, COST_BPS / 1e4
    out: dict[str, list] = {"ids": [], "raw": [], "smoothed": [], "nav": [nav]}
    for t in range(START, END):
        cols = np.flatnonzero(live[t])
        ids = [CASH_ID, *(names[j] for j in cols)]
        sold = sum(w for a, w in holdings.items() if a not in ids)
        current = np.array([holdings.get(a, 0.0) for a in ids])
        current[0] += sold
        window = p[t - history : t + 1, cols].T
        mask = np.ones(len(ids), dtype=bool)
        z = normalize_features(asset_features(window, mask, spec), fixture.norm, 10.0, mask)
        action = reference_action(fixture, z[None], current[None], mask[None])[0]
        anchor = anchor_weights(window, mask, config.action.anchor.spec)
        raw = tilt_weights(action, anchor, mask, config.action.k)
        before = None if previous is None else np.array([previous.get(a, 0.0) for a in ids])
        smoothed = ema_smooth(before, raw, mask, config.beta)
        turnover = float(np.abs(smoothed[1:] - current[1:]).sum()) + sold
        invested = nav - rate * turnover * nav
        grown = smoothed * np.r_[1.0, p[t + 1, cols] / p[t, cols]]
        nav = invested * float(grown.sum())
        holdings = dict(zip(ids, grown / grown.sum(), strict=True))
        previous = dict(zip(ids, smoothed, strict=True))
        for key, value in (("ids", tuple(ids)), ("raw", raw), ("smoothed", smoothed)):
            out[key].append(value)
        out["nav"].append(nav)
    return out


def test_changing_universe_matches_the_environments_step_rule(
    shared: LoadedModel, fixture: SharedFixture
) -> None:
    frame = changing_frame(fixture)
    result = replay(shared, frame, start=START, end=END)
    want = simulate(fixture, frame, shared.prices_per_asset - 1)
    sizes = {len(ids) - 1 for ids in want["ids"]}
    assert sizes == {8, 9}  # more assets than the 6 training slots, and a mask that changes
    for k, out in enumerate(result.outputs):
        assert out.asset_ids == want["ids"][k]
        np.testing.assert_allclose(out.raw_weights, want["raw"][k], atol=1e-6)
        np.testing.assert_allclose(out.smoothed_weights, want["smoothed"][k], atol=1e-6)
    np.testing.assert_allclose(result.nav, want["nav"], rtol=1e-6)
    assert all(out.icm_reward is None for out in result.outputs)


def test_replay_of_a_model_directory_uses_its_history_needs(
    fixture: SharedFixture, tmp_path: Path
) -> None:
    d = write_shared_model(tmp_path / "shared" / "2", fixture)
    result = replay(d, changing_frame(fixture), start=START, end=START + 3)
    assert result.settings["window"] == 8
    with pytest.raises(ValueError, match="needs 8 earlier closes"):
        replay(d, changing_frame(fixture), start=7)
