"""The serving-path replay against the trainer's backtest (``PortfolioEnv``), and with a changing
universe. The test may use the trainer; ``allocator.serving.replay`` itself may not.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from allocator.portfolio import (
    CASH_ID,
    FeatureSpec,
    NormalizationStats,
    build_raw_observation,
    normalize_observation,
    renormalize,
)
from allocator.serving import LoadedModel
from allocator.serving.replay import live_assets, replay
from allocator.serving.state import MemoryStateStore
from allocator.serving.step import DecisionStep
from allocator.trainer.sim.backtest import run_backtest
from allocator.trainer.sim.baselines import DecisionContext
from tests.markets import random_walk_market
from tests.serving.conftest import TINY, items_for

SPEC = FeatureSpec(max_assets=TINY.max_assets, window=TINY.window)


class OnnxPolicy:
    """The exported policy as a backtest policy: the env's price window -> raw observation."""

    name = "onnx"

    def __init__(self, model: LoadedModel) -> None:
        self.model = model
        self.max_observation_gap = 0.0

    def __call__(self, ctx: DecisionContext) -> np.ndarray:
        k = len(ctx.assets)
        prices = np.ones((SPEC.max_assets, SPEC.prices_per_asset))
        prices[:k] = ctx.prices[-SPEC.prices_per_asset :].T
        raw = build_raw_observation(prices, ctx.weights, ctx.mask, SPEC)
        stats = self.model.manifest.normalization
        # The raw observation is the env's own observation before normalization.
        env_like = normalize_observation(raw, SPEC, NormalizationStats(stats.mean, stats.std))
        self.max_observation_gap = max(
            self.max_observation_gap, float(np.max(np.abs(env_like - ctx.observation)))
        )
        _, weights = self.model.run(raw[None], ctx.mask[None].astype(np.float32))
        return renormalize(weights[0].astype(np.float64), ctx.mask)


def test_constant_universe_matches_the_backtest_environment(tiny_model: LoadedModel) -> None:
    data = random_walk_market(n_dates=80, n_assets=3, seed=3)
    policy = OnnxPolicy(tiny_model)
    manifest = tiny_model.manifest
    mean, std = manifest.normalization.mean, manifest.normalization.std
    bt = run_backtest(
        policy,
        data,
        start=data.dates[10],
        cost_bps=manifest.cost_bps,
        beta=manifest.beta,
        window=SPEC.window,
        max_assets=SPEC.max_assets,
        stats=NormalizationStats(mean, std),
    )
    assert policy.max_observation_gap < 1e-5
    frame = data.to_frame()
    result = replay(tiny_model, frame, start=data.dates[10])
    n = len(bt.turnover)
    assert len(result.outputs) == n
    assert result.dates[:-1] == list(bt.raw_weights.index)  # the decision dates
    columns = [c for c in bt.raw_weights.columns if not c.startswith("empty")]
    assert [CASH_ID, *result.assets] == ["CASH", *columns[1:]]
    np.testing.assert_allclose(result.wide("raw_weights"), bt.raw_weights[columns], atol=1e-6)
    np.testing.assert_allclose(
        result.wide("smoothed_weights"), bt.executed_weights[columns], atol=1e-6
    )
    np.testing.assert_allclose(result.turnover, bt.turnover, atol=1e-6)
    np.testing.assert_allclose(result.costs, bt.costs, atol=1e-9)
    np.testing.assert_allclose(result.nav, bt.nav, rtol=1e-6)
    assert result.nav[-1] != pytest.approx(1.0, abs=1e-3)  # something happened
    # The smoothing mattered: executed != raw.
    assert np.max(np.abs(result.wide("raw_weights") - result.wide("smoothed_weights"))) > 1e-3


def changing_market() -> pd.DataFrame:
    """Four assets: D lists at row 25, B delists after row 40."""
    frame = random_walk_market(n_dates=70, n_assets=4, seed=5).to_frame()
    frame.columns = ["A", "B", "C", "D"]
    frame.loc[frame.index[:25], "D"] = np.nan
    frame.loc[frame.index[41:], "B"] = np.nan
    return frame


def test_changing_universe_keeps_distributions_over_the_live_assets(
    tiny_model: LoadedModel,
) -> None:
    frame = changing_market()
    w = SPEC.window
    result = replay(tiny_model, frame, cost_bps=25)
    live = live_assets(frame.to_numpy(), w)
    t0 = result.settings["start_row"]
    requested = [set(inp.asset_ids) for inp in result.inputs]
    assert requested[0] == {"A", "B", "C"}
    assert {"A", "B", "C", "D"} in requested
    assert requested[-1] == {"A", "C", "D"}
    d_from = 25 + w  # D needs a full window of closes
    for k, (inp, out) in enumerate(zip(result.inputs, result.outputs, strict=True)):
        t = t0 + k
        assert set(inp.asset_ids) == {a for a, ok in zip(result.assets, live[t], strict=True) if ok}
        assert ("D" in inp.asset_ids) == (t >= d_from)
        assert ("B" in inp.asset_ids) == (t <= 39)  # B's close at t + 1 must exist
        assert out.asset_ids == (CASH_ID, *inp.asset_ids)
        for vec in (out.raw_weights, out.smoothed_weights, out.current_weights):
            assert np.all(vec >= 0)
            assert vec.sum() == pytest.approx(1.0, abs=1e-9)
    for name in ("raw_weights", "smoothed_weights", "current_weights"):
        wide = result.wide(name)
        np.testing.assert_allclose(wide.sum(axis=1), 1.0, atol=1e-9)
        not_live = ~live[t0 : t0 + len(result.outputs)]
        assert np.all(wide[:, 1:][not_live] == 0.0)
    # B's holding (drifted to the close of row 40) is sold into cash when it leaves the request:
    # counted in the step's turnover and cost, and the current weights sent hold it as cash.
    k_out = 40 - t0
    before = result.outputs[k_out - 1]
    ids = before.asset_ids[1:]
    p = frame[list(ids)].to_numpy()
    grown = before.smoothed_weights * np.r_[1.0, p[40] / p[39]]
    drifted = dict(zip(before.asset_ids, grown / grown.sum(), strict=True))
    assert drifted["B"] > 0.01
    assert result.turnover[k_out] == pytest.approx(
        result.outputs[k_out].turnover + drifted["B"], abs=1e-12
    )
    sent = dict(
        zip(result.outputs[k_out].asset_ids, result.inputs[k_out].current_weights, strict=True)
    )
    assert sent[CASH_ID] == pytest.approx(drifted[CASH_ID] + drifted["B"], abs=1e-12)
    others = [k for k in range(len(result.outputs)) if k != k_out]
    np.testing.assert_array_equal(
        result.turnover[others], [result.outputs[k].turnover for k in others]
    )
    assert np.all(np.isfinite(result.nav))
    assert np.all(result.nav > 0)
    np.testing.assert_allclose(result.costs, 25e-4 * result.turnover * result.nav[:-1], rtol=1e-12)


def test_replayed_requests_reproduce_the_answers(tiny_model: LoadedModel) -> None:
    """``inputs`` are the requests to send a server: deciding them again gives the same answers."""
    result = replay(tiny_model, changing_market())
    step = DecisionStep(MemoryStateStore())
    for inp, out in zip(result.inputs, result.outputs, strict=True):
        (answer,) = step.run(items_for(tiny_model, [replace(inp, portfolio_id="other")]))
        again = answer.output
        assert again is not None
        np.testing.assert_array_equal(again.raw_weights, out.raw_weights)
        np.testing.assert_array_equal(again.smoothed_weights, out.smoothed_weights)
        assert again.icm_reward == out.icm_reward
    icm = [o.icm_reward for o in result.outputs]
    assert icm[0] is None
    assert sum(r is None for r in icm) == 3  # first decision, D listing, B leaving


def test_arrays_dates_and_model_directories_are_accepted(
    tiny_model_dir, tiny_model: LoadedModel
) -> None:
    frame = changing_market()
    by_frame = replay(tiny_model, frame, start=frame.index[12], end=frame.index[30])
    assert by_frame.dates[0] == frame.index[12]
    assert by_frame.dates[-1] == frame.index[30]
    by_array = replay(
        tiny_model_dir, frame.to_numpy(), assets=list(frame.columns), start=12, end=30
    )
    assert by_array.dates == list(range(12, 31))
    np.testing.assert_array_equal(by_array.nav, by_frame.nav)
    assert by_frame.assets == ("A", "B", "C", "D")
    assert by_frame.wide("raw_weights").shape == (18, 5)  # cash, then every column
    with pytest.raises(ValueError, match="needs 5 earlier closes"):
        replay(tiny_model, frame, start=2)
    with pytest.raises(ValueError, match="assets are required"):
        replay(tiny_model, frame.to_numpy())
