"""The learning tests' yardsticks, fast: the rotating market's known schedule and the switching
lag measured against it (the slow tests in this folder use both on trained policies)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from allocator.trainer.jobs.suite.job import held_out_ensemble
from allocator.trainer.market.data import load_dataset
from allocator.trainer.sim.baselines import TopKMomentum
from allocator.trainer.training.policy_eval import SeedEnsemble
from allocator.trainer.training.run import train
from tests.learning.recipes import SHARED, config
from tests.learning.rotation import interval, verdict
from tests.learning.yardsticks import RotationFilter, regime_switch_lag, switch_lags
from tests.markets import rotating_market, rotating_schedule, write_market


@pytest.mark.parametrize(
    "kwargs", [{"period": 20}, {"n_days": 900, "n_assets": 6, "period": 7, "seed": 3}]
)
def test_schedule_is_the_leader_the_market_was_drawn_with(kwargs):
    frame, leader = rotating_market(**kwargs), rotating_schedule(**kwargs)
    assert leader.index.equals(frame.index)
    period, n = kwargs["period"], frame.shape[1]
    changes = np.flatnonzero(leader.to_numpy()[1:] != leader.to_numpy()[:-1]) + 1
    assert changes.size > 0
    assert np.all(changes % period == 0)
    # Day t's log return is its leader's drift (+0.4%) or the others' (-0.4% / (n - 1)), plus
    # N(0, 0.6%) noise: the means on either side sit within 5 standard errors of the drift.
    returns = np.log(frame).diff().iloc[1:]
    is_leader = returns.columns.to_numpy()[None, :] == leader.iloc[1:].to_numpy()[:, None]
    for mask, drift in ((is_leader, 0.004), (~is_leader, -0.004 / (n - 1))):
        values = returns.to_numpy()[mask]
        assert abs(values.mean() - drift) < 5 * 0.006 / np.sqrt(values.size), (drift, kwargs)
    # A schedule of another seed does not fit: the check above can fail.
    other = rotating_schedule(**(kwargs | {"seed": kwargs.get("seed", 0) + 1}))
    wrong = returns.columns.to_numpy()[None, :] == other.iloc[1:].to_numpy()[:, None]
    assert returns.to_numpy()[wrong].mean() < 0.002


DAYS = pd.bdate_range("2020-01-06", periods=12)
# A leads the returns of days 0-3, B of days 4-7, C of days 8-11. A decision earns the next
# day's return, so decisions 0-2 should hold A, 3-6 B and 7-10 C.
LEADER = pd.Series(["A"] * 4 + ["B"] * 4 + ["C"] * 4, index=DAYS)


def book(holdings: list[str]) -> pd.DataFrame:
    """Executed weights over decisions 0-10: 70% in the named holding (or all cash), 10% else."""
    rows = []
    for h in holdings:
        row = {"cash": 1.0, "A": 0.0, "B": 0.0, "C": 0.0}
        if h != "cash":
            row = {"cash": 0.0, "A": 0.1, "B": 0.1, "C": 0.1} | {h: 0.7}
        rows.append(row)
    return pd.DataFrame(rows, index=DAYS[:11])


def test_lag_counts_decisions_until_the_new_leader_is_the_largest_holding():
    # Follows B one decision late, then never follows C: that regime counts its full 4.
    late = book(["A"] * 4 + ["B"] * 7)
    assert switch_lags(late, LEADER) == [1, 4]
    assert regime_switch_lag(late, LEADER) == 2.5
    # Moved before any evidence: 0; three decisions late: 3.
    early = book(["A"] * 3 + ["B"] * 4 + ["A"] * 3 + ["C"])
    assert switch_lags(early, LEADER) == [0, 3]
    # A book in cash holds no asset: it has not followed anyone.
    cash = book(["A"] * 3 + ["cash"] * 2 + ["B"] * 6)
    assert switch_lags(cash, LEADER) == [2, 4]


def test_a_repeated_leader_is_no_change_and_gaps_are_errors():
    same = pd.Series(["A"] * 8 + ["B"] * 4, index=DAYS)
    assert switch_lags(book(["A"] * 11), same) == [4]
    with pytest.raises(ValueError, match="no regime change"):
        regime_switch_lag(book(["A"] * 11), pd.Series("A", index=DAYS))
    with pytest.raises(ValueError, match="no leader for the day after"):
        switch_lags(book(["A"] * 11), LEADER.iloc[:-1])


def test_rotation_filter_names_the_leader_more_often_than_momentum():
    """The Bayes filter of the market's own model is the ceiling the rotating-market tests are
    read against: at each close its most probable leader is the true one on more days than the
    best momentum rule's pick, and on most days."""
    frame, leader = rotating_market(period=20), rotating_schedule(period=20)
    prices, truth = frame.to_numpy(), leader.to_numpy()
    rule, bayes = TopKMomentum(lookback=10, k=1), RotationFilter()
    days = range(40, len(frame))
    picks = {
        "filter": [frame.columns[np.argmax(bayes.update(prices[: t + 1]))] for t in days],
        "momentum": [frame.columns[rule.chosen(prices[: t + 1])[0]] for t in days],
    }
    hits = {name: float(np.mean(np.array(p) == truth[40:])) for name, p in picks.items()}
    assert hits["filter"] > hits["momentum"], hits
    assert hits["filter"] > 0.8, hits


def test_rotation_filter_starts_again_on_a_new_backtest_and_holds_its_posterior():
    frame = rotating_market(n_days=200, period=20)
    prices = frame.to_numpy()
    bayes = RotationFilter(book="posterior")
    first = bayes.update(prices[:150]).copy()
    assert first.sum() == pytest.approx(1.0)
    assert first.max() > 0.5
    # A shorter history is a new backtest: the posterior restarts, so it equals a fresh filter's.
    again = bayes.update(prices[:100]).copy()
    np.testing.assert_allclose(again, RotationFilter(book="posterior").update(prices[:100]))
    with pytest.raises(ValueError, match="book"):
        RotationFilter(book="top2")


def test_seed_ensemble_averages_its_members_and_one_member_is_the_run_itself(tmp_path):
    """Two shared-policy runs of 600 steps (seeds 0 and 1; nothing learned, the check is the
    plumbing): an ensemble of one reproduces that run's own held-out backtest, an ensemble of
    both acts on the mean of their actions and trades otherwise than either."""
    path = write_market(rotating_market(period=20), tmp_path / "rotating.csv")
    runs = [
        train(
            config(path, 600, [*SHARED, "algorithm.learning_starts=100", f"seed={seed}"]),
            tmp_path / f"s{seed}",
        )
        for seed in (0, 1)
    ]
    data = load_dataset(str(path))
    alone, _ = held_out_ensemble(runs[:1], data)
    pd.testing.assert_series_equal(alone.nav, runs[0].validation["td3"].nav, check_names=False)
    both, _ = held_out_ensemble(runs, data)
    for run in runs:
        assert not np.allclose(both.nav.to_numpy(), run.validation["td3"].nav.to_numpy())
    obs = runs[0].model.observation_space.sample()
    members = [run.model.predict(obs, deterministic=True)[0] for run in runs]
    np.testing.assert_allclose(
        SeedEnsemble([run.model for run in runs]).predict(obs)[0], np.mean(members, axis=0)
    )
    with pytest.raises(ValueError, match="at least one member"):
        SeedEnsemble([])


def test_many_draws_interval_covers_the_mean_and_reads_its_sign():
    """The many-draws verdict is the sign of the mean-excess interval, which moves with the
    draws: shifted up by 1 it clears zero, down by 1 it falls below."""
    excess = [0.63, 0.76, -0.08, -0.55, -0.11, 0.2, 0.05, -0.3]
    low, high = interval(excess)
    assert low < np.mean(excess) < high
    assert verdict(low, high) == "matches"
    assert verdict(*interval([e + 1 for e in excess])) == "beats"
    assert verdict(*interval([e - 1 for e in excess])) == "loses"
