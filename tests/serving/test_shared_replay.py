"""A shared policy replayed through the serving path against the training environment itself.

Constant universe: the environment's backtest (``PortfolioEnv`` with the per-asset features
and the tilt mapping) of the torch actor equals the serving replay of its exported graph, with
fewer and with more assets than the 6 training slots. Changing universe (assets listing and
delisting midway, the mask changing under the smoothing): the environment, its universe changed
as the replay's listing calendar says, equals the serving replay step by step; and the
environment driving the server decision by decision (its holdings sent as the current weights,
assets in another order than its slots) gets the server's raw and smoothed weights as its own.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch as th

from allocator.portfolio import CASH_ID
from allocator.serving import LoadedModel, load_model
from allocator.serving.proto.v1 import allocator_pb2 as pb
from allocator.serving.replay import live_assets, replay
from allocator.serving.state import MemoryStateStore
from allocator.serving.step import DecisionStep
from allocator.trainer.market.data import MarketData
from allocator.trainer.sim.backtest import run_backtest
from allocator.trainer.sim.baselines import DecisionContext
from allocator.trainer.sim.env import EnvConfig, PortfolioEnv
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


def actor_action(fixture: SharedFixture, obs: np.ndarray, n_slots: int) -> np.ndarray:
    """The torch actor's action on an environment observation (normalized features)."""
    f, m = fixture.n_features, n_slots - 1
    features = obs[: m * f].reshape(1, m, f)
    weights = obs[m * f : m * f + n_slots][None]
    mask = obs[m * f + n_slots :][None]
    return reference_action(fixture, features, weights, mask)[0]


class TorchPolicy:
    """The torch actor on the environment's own observation, mapped by the environment."""

    name = "torch-shared"

    def __init__(self, fixture: SharedFixture) -> None:
        self.fixture = fixture

    def __call__(self, ctx: DecisionContext) -> np.ndarray:
        action = actor_action(self.fixture, ctx.observation, ctx.n_slots)
        assert ctx.to_weights is not None
        return ctx.to_weights(action)


def env_config(fixture: SharedFixture, max_assets: int, length: int) -> EnvConfig:
    """The fixture's representation with more slots than the model's 6 training slots."""
    changes = {"max_assets": max_assets, "episode_length": length}
    return EnvConfig(**(fixture.config.model_dump() | changes))


def by_id(ids: tuple[str, ...], vector: np.ndarray) -> dict[str, float]:
    return {a: float(vector[j]) for j, a in enumerate(ids)}


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


def test_changing_universe_matches_the_environment(
    shared: LoadedModel, fixture: SharedFixture
) -> None:
    """The replay's listing calendar becomes the environment's universe schedule: the serving
    replay and the environment then agree on every decision, turnover and NAV."""
    frame = changing_frame(fixture)
    result = replay(shared, frame, start=START, end=END)
    history = shared.prices_per_asset - 1
    names = tuple(frame.columns)
    live = live_assets(frame.to_numpy(), history)
    universes = [tuple(names[j] for j in np.flatnonzero(live[t])) for t in range(START, END)]
    schedule = {k: u for k, u in enumerate(universes) if k and u != universes[k - 1]}
    assert {len(u) for u in universes} == {8, 9}  # above the 6 training slots, changing
    assert len(schedule) == 2  # A8 lists, then A2 delists
    data = MarketData(prices=frame.to_numpy(), dates=frame.index, assets=names, source="changing")
    env = PortfolioEnv(data, env_config(fixture, 9, END - START), feature_norm=fixture.norm)
    assert env.config.history == history
    obs, _ = env.reset(
        options={"assets": universes[0], "start": START, "universe_changes": schedule}
    )
    nav = [env.nav]
    for k, out in enumerate(result.outputs):
        ids = (CASH_ID, *env.asset_names)
        assert set(out.asset_ids) == set(ids)
        obs, _, _, _, info = env.step(actor_action(fixture, obs, env.n_slots))
        raw, smoothed = by_id(ids, info["raw_weights"]), by_id(ids, info["executed_weights"])
        for j, a in enumerate(out.asset_ids):
            assert out.raw_weights[j] == pytest.approx(raw[a], abs=1e-6), (k, a)
            assert out.smoothed_weights[j] == pytest.approx(smoothed[a], abs=1e-6), (k, a)
        assert result.turnover[k] == pytest.approx(info["turnover"], abs=1e-6)
        nav.append(info["nav"])
    np.testing.assert_allclose(result.nav, nav, rtol=1e-6)
    assert all(out.icm_reward is None for out in result.outputs)


def test_the_environment_drives_the_server_across_universe_changes(
    shared: LoadedModel, fixture: SharedFixture
) -> None:
    """Decision by decision, the server answers the environment's own decision: the env's
    holdings as current weights, its universe changing twice (from 5 assets to 8, past the
    6 training slots, then to 4), the request's assets in another order than the env's slots."""
    data, history, length = fixture.data, shared.prices_per_asset - 1, 15
    env = PortfolioEnv(data, env_config(fixture, 10, length), feature_norm=fixture.norm)
    obs, _ = env.reset(options={"assets": ["A0", "A1", "A2", "A3", "A4"], "start": START})
    changes = {
        5: ["A1", "A3", "A4", "A0", "A9", "A11", "A7", "A12"],  # A2 leaves, four join
        10: ["A12", "A5", "A9", "A3"],  # five leave, A5 joins
    }
    step = DecisionStep(MemoryStateStore())
    sizes, sold = [], []
    for k in range(length):
        if k in changes:
            obs, info = env.change_universe(changes[k])
            sold.append(info["liquidation_turnover"])
        ids = (CASH_ID, *env.asset_names)
        holdings = by_id(ids, env.drifted)
        order = sorted(env.asset_names, reverse=True)  # not the env's slot order
        col = [data.assets.index(a) for a in order]
        request = pb.AllocateRequest(
            portfolio_id="env",
            request_id=f"env-{k}",
            asset_ids=order,
            prices=data.prices[env.t - history : env.t + 1, col].T.ravel().tolist(),
            current_weights=[holdings[a] for a in (CASH_ID, *order)],
        )
        out = step.allocate(request, lambda name, version: shared).output
        assert out is not None
        assert out.asset_ids == (CASH_ID, *order)
        obs, _, _, _, info = env.step(actor_action(fixture, obs, env.n_slots))
        raw, smoothed = by_id(ids, info["raw_weights"]), by_id(ids, info["executed_weights"])
        np.testing.assert_allclose(out.raw_weights, [raw[a] for a in out.asset_ids], atol=1e-6)
        np.testing.assert_allclose(
            out.smoothed_weights, [smoothed[a] for a in out.asset_ids], atol=1e-6
        )
        assert out.turnover + info["liquidation_turnover"] == pytest.approx(
            info["turnover"], abs=1e-6
        )
        sizes.append(len(order))
    assert sizes == [5] * 5 + [8] * 5 + [4] * 5
    assert min(sold) > 0.0  # every change sold something into cash


def test_replay_of_a_model_directory_uses_its_history_needs(
    fixture: SharedFixture, tmp_path: Path
) -> None:
    d = write_shared_model(tmp_path / "shared" / "2", fixture)
    result = replay(d, changing_frame(fixture), start=START, end=START + 3)
    assert result.settings["window"] == 8
    with pytest.raises(ValueError, match="needs 8 earlier closes"):
        replay(d, changing_frame(fixture), start=7)
