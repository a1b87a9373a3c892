"""Walk-forward windows: a train span, a purge gap, then an unseen test span, on ``freq``
boundaries rolled back from ``start`` (skfolio's ``WalkForward`` anchors on the data's first
date, so its periods are not calendar-aligned).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import pandas as pd
from pandas.tseries.frequencies import to_offset
from pydantic import Field, model_validator

from allocator.typed_config import StrictModel


class WindowError(ValueError):
    """A window specification that yields no usable window for the data."""


@dataclass(frozen=True)
class Window:
    """One walk-forward split; all dates are trading days in the data, ends inclusive."""

    index: int
    train_start: dt.date
    train_end: dt.date
    test_start: dt.date
    test_end: dt.date

    @property
    def label(self) -> str:
        """Short stable id (``w03``), used in registry versions and metric labels."""
        return f"w{self.index:02d}"

    def to_dict(self) -> dict[str, Any]:
        return {k: (str(v) if isinstance(v, dt.date) else v) for k, v in asdict(self).items()}


class WindowSpec(StrictModel):
    """How to cut a date range into walk-forward windows (periods are ``freq`` units)."""

    start: dt.date = Field(description="first date any training span may use")
    end: dt.date = Field(description="last date any test span may use")
    freq: str = Field("YS", description="pandas offset alias of one period: YS, QS, MS, ...")
    train_periods: int = Field(5, ge=1)
    test_periods: int = Field(1, ge=1)
    step_periods: int | None = Field(None, ge=1, description="default: test_periods")
    purge_days: int = Field(5, ge=0, description="trading days dropped from training's end")
    expanding: bool = Field(False, description="train from start (True) or rolling spans")
    min_test_days: int = Field(20, ge=2, description="shortest last test span kept")

    @model_validator(mode="after")
    def _check(self) -> WindowSpec:
        if self.start >= self.end:
            raise ValueError(f"start {self.start} must be before end {self.end}")
        try:
            to_offset(self.freq)
        except ValueError as exc:
            raise ValueError(f"freq {self.freq!r} is not a pandas offset alias: {exc}") from None
        return self

    @property
    def step(self) -> int:
        return self.step_periods or self.test_periods


def make_windows(dates: Sequence[Any] | pd.DatetimeIndex, spec: WindowSpec) -> list[Window]:
    """Windows over the trading calendar ``dates`` (sorted); raises when none fits."""
    cal = pd.DatetimeIndex(dates)
    if not cal.is_monotonic_increasing:
        raise WindowError("dates must be sorted")
    cal = cal[(cal >= pd.Timestamp(spec.start)) & (cal <= pd.Timestamp(spec.end))]
    if len(cal) < 2:
        raise WindowError(f"no trading dates between {spec.start} and {spec.end}")
    # Period boundaries from ``start`` rolled back, to one test length past the last date.
    offset = to_offset(spec.freq)
    last = cal[-1] + (spec.test_periods + 1) * offset
    anchors = pd.date_range(offset.rollback(pd.Timestamp(spec.start)), last, freq=offset)
    pos = cal.searchsorted(anchors, side="left")  # first trading day of each period
    windows: list[Window] = []
    for i in range(spec.train_periods, len(anchors), spec.step):
        test_lo = int(pos[i])
        if test_lo >= len(cal):
            break
        test_hi = int(pos[i + spec.test_periods])  # exclusive; anchors reach past the data
        if test_hi - test_lo < spec.min_test_days:
            continue  # only the last span, cut short by ``end``, can be this short
        if not spec.expanding and anchors[i - spec.train_periods] < pd.Timestamp(spec.start):
            continue  # a partial first period: the rolling span would be short
        train_lo = 0 if spec.expanding else int(pos[i - spec.train_periods])
        train_hi = test_lo - spec.purge_days  # exclusive
        if train_hi - train_lo < 2:
            raise WindowError(
                f"window {len(windows)}: the training span before {cal[test_lo].date()} has "
                f"{max(train_hi - train_lo, 0)} trading days after a purge of "
                f"{spec.purge_days}; lengthen train_periods or shorten purge_days"
            )
        windows.append(
            Window(
                index=len(windows),
                train_start=cal[train_lo].date(),
                train_end=cal[train_hi - 1].date(),
                test_start=cal[test_lo].date(),
                test_end=cal[test_hi - 1].date(),
            )
        )
    if not windows:
        raise WindowError(
            f"no walk-forward window fits between {spec.start} and {spec.end} with "
            f"{spec.train_periods} training and {spec.test_periods} test period(s) of "
            f"{spec.freq!r}"
        )
    return windows
