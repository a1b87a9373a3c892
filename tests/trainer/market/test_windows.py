"""Walk-forward windows: no train/test overlap, purge gaps, edge windows, rolling vs expanding,
and the same splits as skfolio's ``WalkForward`` wherever the two define the same thing."""

from __future__ import annotations

import datetime as dt
import itertools

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numpy.typing import NDArray
from pydantic import ValidationError
from skfolio.model_selection import WalkForward

from allocator.trainer.market.data import load_sp500
from allocator.trainer.market.windows import (
    Window,
    WindowError,
    WindowSpec,
    make_windows,
)

CALENDAR = pd.bdate_range("2001-01-01", "2012-12-31")  # 2001-01-01 is a Monday


def spec(**kw: object) -> WindowSpec:
    base: dict[str, object] = {"start": "2001-01-01", "end": "2012-12-31"}
    return WindowSpec.model_validate({**base, **kw})


def check_disjoint(dates: pd.DatetimeIndex, windows: list[Window], purge: int) -> None:
    """Train before test, exactly ``purge`` trading days between them, nothing shared."""
    for w in windows:
        rows = window_positions(dates, w)
        train, test = rows["train"], rows["test"]
        assert len(train) >= 2
        assert len(test) >= 2
        assert not set(train) & set(test)
        assert train[-1] + purge + 1 == test[0]  # the purge gap, in trading days
        assert np.all(np.diff(train) == 1)
        assert np.all(np.diff(test) == 1)
        assert w.train_start <= w.train_end < w.test_start <= w.test_end


def window_positions(dates: pd.DatetimeIndex, window: Window) -> dict[str, NDArray[np.int64]]:
    """Row positions of a window's train and test days in ``dates``."""
    d = pd.DatetimeIndex(dates)

    def rows(lo: dt.date, hi: dt.date) -> NDArray[np.int64]:
        return np.flatnonzero((d >= pd.Timestamp(lo)) & (d <= pd.Timestamp(hi)))

    return {
        "train": rows(window.train_start, window.train_end),
        "test": rows(window.test_start, window.test_end),
    }


def test_rolling_years_cover_the_span_without_overlap() -> None:
    windows = make_windows(CALENDAR, spec(train_periods=3, purge_days=5))
    assert [w.index for w in windows] == list(range(9))
    years = range(2004, 2013)
    assert [w.test_start for w in windows] == [
        CALENDAR[CALENDAR.year == y][0].date() for y in years
    ]
    assert [w.test_end for w in windows] == [CALENDAR[CALENDAR.year == y][-1].date() for y in years]
    # Rolling: each training span starts three years before its test.
    assert [w.train_start.year for w in windows] == list(range(2001, 2010))
    check_disjoint(CALENDAR, windows, purge=5)
    # Step = test length: test spans tile the range, each test day tested once.
    for a, b in itertools.pairwise(windows):
        assert CALENDAR.get_loc(pd.Timestamp(b.test_start)) == (
            CALENDAR.get_loc(pd.Timestamp(a.test_end)) + 1
        )
    assert windows[3].label == "w03"


def test_expanding_spans_start_at_the_first_date_and_grow() -> None:
    windows = make_windows(CALENDAR, spec(train_periods=3, purge_days=2, expanding=True))
    assert {w.train_start for w in windows} == {dt.date(2001, 1, 1)}
    ends = [w.train_end for w in windows]
    assert ends == sorted(ends)
    assert len(set(ends)) == len(ends)
    check_disjoint(CALENDAR, windows, purge=2)
    rolling = make_windows(CALENDAR, spec(train_periods=3, purge_days=2))
    assert [(w.test_start, w.test_end, w.train_end) for w in windows] == [
        (w.test_start, w.test_end, w.train_end) for w in rolling
    ]


@pytest.mark.parametrize("expanding", [False, True])
@pytest.mark.parametrize(("freq", "train", "test", "purge"), [("YS", 2, 1, 0), ("QS", 4, 2, 3)])
def test_same_splits_as_skfolio_walk_forward(
    expanding: bool, freq: str, train: int, test: int, purge: int
) -> None:
    """Data starting on a period boundary and step = test: skfolio's definition exactly."""
    frame = pd.DataFrame(np.zeros((len(CALENDAR), 1)), index=CALENDAR)
    cv = WalkForward(
        test_size=test,
        train_size=train,
        freq=freq,
        purged_size=purge,
        expand_train=expanding,
        reduce_test=True,
    )
    theirs = [(tr[0], tr[-1], te[0], te[-1]) for tr, te in cv.split(frame)]
    ours = make_windows(
        CALENDAR,
        spec(
            freq=freq,
            train_periods=train,
            test_periods=test,
            purge_days=purge,
            expanding=expanding,
            min_test_days=2,
        ),
    )
    positions = [
        (r["train"][0], r["train"][-1], r["test"][0], r["test"][-1])
        for r in (window_positions(CALENDAR, w) for w in ours)
    ]
    assert positions == theirs


def test_a_span_starting_after_a_boundary_keeps_its_first_period_only_when_expanding() -> None:
    """skfolio anchors on the first date and would drop 2005 here; calendar anchors keep it."""
    dates = load_sp500().dates
    rolling = make_windows(dates, WindowSpec(start="2005-01-01", end="2022-12-31"))
    assert [w.test_start.year for w in rolling] == list(range(2010, 2023))  # 13 windows
    assert rolling[0].train_start == dt.date(2005, 1, 3)  # the first trading day
    assert rolling[-1].test_end == dates[-1].date()  # the data ends 2022-12-28
    mid = make_windows(dates, WindowSpec(start="2005-06-15", end="2022-12-31"))
    assert mid[0].train_start == dt.date(2006, 1, 3)  # the partial 2005 is not a period
    assert mid[0].test_start.year == 2011
    expanding = make_windows(
        dates, WindowSpec(start="2005-06-15", end="2022-12-31", expanding=True)
    )
    assert expanding[0].train_start == dt.date(2005, 6, 15)
    assert expanding[0].test_start.year == 2010
    check_disjoint(dates, rolling, purge=5)


def test_a_short_last_test_span_is_kept_or_dropped_by_min_test_days() -> None:
    cut = CALENDAR[CALENDAR <= "2012-02-15"]  # 2012 has 33 trading days here
    kept = make_windows(cut, spec(train_periods=3, min_test_days=20))
    assert kept[-1].test_start == dt.date(2012, 1, 2)
    assert kept[-1].test_end == dt.date(2012, 2, 15)
    dropped = make_windows(cut, spec(train_periods=3, min_test_days=40))
    assert dropped[-1].test_end == dt.date(2011, 12, 30)
    assert len(dropped) == len(kept) - 1


def test_steps_longer_or_shorter_than_the_test_span() -> None:
    sparse = make_windows(CALENDAR, spec(train_periods=3, step_periods=2))
    assert [w.test_start.year for w in sparse] == [2004, 2006, 2008, 2010, 2012]
    overlapping = make_windows(
        CALENDAR, spec(freq="QS", train_periods=4, test_periods=4, step_periods=2, purge_days=5)
    )
    first, second = overlapping[0], overlapping[1]
    assert second.test_start < first.test_end  # test spans overlap by two quarters
    check_disjoint(CALENDAR, overlapping, purge=5)  # but never a window with itself
    assert overlapping[-1].test_end == dt.date(2012, 12, 31)


def test_impossible_specifications_fail_clearly() -> None:
    with pytest.raises(WindowError, match="no walk-forward window fits"):
        make_windows(CALENDAR, spec(train_periods=20))
    with pytest.raises(WindowError, match="lengthen train_periods or shorten purge_days"):
        make_windows(CALENDAR, spec(freq="MS", train_periods=1, purge_days=30))
    with pytest.raises(WindowError, match="no trading dates"):
        make_windows(CALENDAR, spec(start="2020-01-01", end="2021-01-01"))
    with pytest.raises(ValidationError, match="not a pandas offset alias"):
        spec(freq="fortnightly")
    with pytest.raises(ValidationError, match="must be before end"):
        spec(start="2010-01-01", end="2009-01-01")
    with pytest.raises(WindowError, match="sorted"):
        make_windows(CALENDAR[::-1], spec())


@settings(max_examples=60, deadline=None)
@given(
    freq=st.sampled_from(["YS", "QS", "MS"]),
    train=st.integers(1, 4),
    test=st.integers(1, 3),
    step=st.integers(1, 3),
    purge=st.integers(0, 10),
    expanding=st.booleans(),
    start_offset=st.integers(0, 400),
    end_offset=st.integers(0, 400),
)
def test_every_window_keeps_train_and_test_apart(
    freq: str,
    train: int,
    test: int,
    step: int,
    purge: int,
    expanding: bool,
    start_offset: int,
    end_offset: int,
) -> None:
    s = WindowSpec(
        start=CALENDAR[start_offset].date(),
        end=CALENDAR[-1 - end_offset].date(),
        freq=freq,
        train_periods=train,
        test_periods=test,
        step_periods=step,
        purge_days=purge,
        expanding=expanding,
        min_test_days=5,
    )
    try:
        windows = make_windows(CALENDAR, s)
    except WindowError:
        return  # a short training span with a long purge: refused, never cut silently
    check_disjoint(CALENDAR, windows, purge)
    assert [w.index for w in windows] == list(range(len(windows)))
    assert all(pd.Timestamp(s.start) <= pd.Timestamp(w.train_start) for w in windows)
    assert all(pd.Timestamp(w.test_end) <= pd.Timestamp(s.end) for w in windows)
    starts = [w.test_start for w in windows]
    assert starts == sorted(starts)
    assert len(set(starts)) == len(starts)
    if expanding:
        assert len({w.train_start for w in windows}) == 1
