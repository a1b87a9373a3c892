"""The suite's generated markets: each a pure function of its draw, each with the known answer
its kind promises, and the draw sets that keep held-out draws away from every choice."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from allocator.trainer.jobs.tuning.config import load_tune_config
from allocator.trainer.market.data import DataError, load_dataset
from allocator.trainer.market.draws import (
    DRAWS,
    SP500_DEV,
    HeldOutDrawError,
    first_draws,
    refuse_held_out,
    require_development,
    require_development_dataset,
)
from allocator.trainer.market.generated import (
    MARKETS,
    listing_drifters,
    market,
    rotating_schedule,
)

DRAWS_CHECKED = range(100, 106)
TUNE = Path(__file__).resolve().parents[3] / "configs" / "tune.yaml"


def log_returns(kind: str, draw: int) -> np.ndarray:
    return np.diff(np.log(market(kind).generate(draw).to_numpy()), axis=0)


@pytest.mark.parametrize("kind", list(MARKETS))
def test_a_draw_is_the_same_market_every_time_and_another_draw_is_not(kind):
    m = market(kind)
    first, again, other = m.generate(100), m.generate(100), m.generate(101)
    assert first.equals(again)
    assert not np.allclose(first.to_numpy(), other.to_numpy(), equal_nan=True)
    loaded = load_dataset(m.dataset(100))
    assert loaded.assets == tuple(first.columns)
    np.testing.assert_array_equal(loaded.prices, first.to_numpy())


def test_the_drifting_asset_out_earns_the_others_on_every_draw():
    for draw in DRAWS_CHECKED:
        mean = log_returns("drift", draw).mean(axis=0)
        assert mean[0] > mean[1:].max() + 0.0003, (draw, mean)


def test_mean_reversion_returns_have_negative_lag_one_autocorrelation():
    for draw in DRAWS_CHECKED:
        r = log_returns("mean_reversion", draw)
        lag1 = [np.corrcoef(r[1:, j], r[:-1, j])[0, 1] for j in range(r.shape[1])]
        assert max(lag1) < -0.2, (draw, lag1)
    walk = log_returns("random_walk", 100)
    assert abs(np.corrcoef(walk[1:, 0], walk[:-1, 0])[0, 1]) < 0.08


def test_the_long_rotation_has_irregular_regimes_of_about_sixty_days():
    params = market("rotating_long").params
    lengths = []
    for draw in DRAWS_CHECKED:
        leader = rotating_schedule(1500, 4, params["period"], draw, irregular=True).to_numpy()
        changes = np.flatnonzero(leader[1:] != leader[:-1])
        lengths += np.diff(changes).tolist()
    # a redraw may repeat the leader (1 in 4), so a change comes every 60 / (3/4) = 80 days
    assert 60 < np.mean(lengths) < 100
    assert np.std(lengths) > 30  # irregular: geometric lengths, not a fixed period


def test_the_long_rotations_leader_out_earns_the_others_on_its_days():
    params = market("rotating_long").params
    r = log_returns("rotating_long", 100)
    leader = rotating_schedule(1500, 4, params["period"], 100, irregular=True).to_numpy()[1:]
    lead = r[np.arange(len(r)), [int(x[1:]) for x in leader]]
    assert lead.mean() > r.mean() + params["drift"] / 2


def test_assets_of_one_sector_move_together_more_than_across_sectors():
    r = log_returns("sectors", 100)
    corr = np.corrcoef(r.T)
    within = [corr[0, 1], corr[2, 3], corr[4, 5]]
    across = [corr[0, 2], corr[1, 4], corr[3, 5]]
    assert min(within) > max(across) + 0.2


def test_entering_and_leaving_assets_have_no_price_outside_their_listing():
    frame = market("entering_leaving").generate(100)
    assert frame["L4"].iloc[:250].isna().all()
    assert frame["L4"].iloc[250:].notna().all()
    assert frame["L1"].iloc[:601].notna().all()
    assert frame["L1"].iloc[601:].isna().all()
    data = load_dataset(market("entering_leaving").dataset(100))
    assert data.last_valid()[1] == 600
    up = listing_drifters(seed=100)
    assert len(up) == 3
    assert any(a in up for a in ("L0", "L3", "L4", "L5", "L6"))
    r = np.diff(np.log(frame.to_numpy()), axis=0)
    means = {a: np.nanmean(r[:, j]) for j, a in enumerate(frame.columns)}
    assert min(means[a] for a in up) > -0.0005


def test_development_and_held_out_draws_are_disjoint_and_refused_where_they_must_be():
    for kind, sets in DRAWS.items():
        if kind != SP500_DEV:
            assert not set(sets.development) & set(sets.held_out)
            assert not set(sets.development) & set(range(60))  # the learning tests' draws
    require_development("rotating_short", first_draws("rotating_short", 3, held_out=False))
    with pytest.raises(HeldOutDrawError, match=r"rotating_short draw 1000 is a held-out draw"):
        require_development("rotating_short", [100, 1000], "allocator tune")
    with pytest.raises(HeldOutDrawError, match=r"draw 5 is not a development draw"):
        require_development("rotating_short", [5])
    with pytest.raises(HeldOutDrawError, match=r"sp500_dev draw 2012"):
        require_development(SP500_DEV, [2009, 2012])
    refuse_held_out("rotating_short", [1, 2, 3, 4])  # the learning tests' development draws
    with pytest.raises(HeldOutDrawError, match="draw 1003 is a held-out draw"):
        refuse_held_out("rotating_short", [1, 1003], "rotation_dev_sweep")
    require_development_dataset("sp500")
    with pytest.raises(HeldOutDrawError, match="draw 1500"):
        require_development_dataset("generated:drift:1500")


def test_tune_refuses_a_held_out_draw_as_its_data():
    overrides = ["trainer.data.dataset=generated:rotating_long:1001"]
    with pytest.raises(HeldOutDrawError, match="allocator tune chooses something"):
        load_tune_config(TUNE, overrides)
    load_tune_config(TUNE, ["trainer.data.dataset=generated:rotating_long:101"])


def test_a_malformed_or_unknown_generated_name_is_a_data_error():
    with pytest.raises(DataError, match="unknown generated market 'nope'"):
        load_dataset("generated:nope:1")
    with pytest.raises(DataError, match="expected generated:KIND:DRAW"):
        load_dataset("generated:drift")
