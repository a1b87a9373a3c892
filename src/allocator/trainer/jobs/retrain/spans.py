"""The retraining spans, in trading days back from ``as_of``: train, a purge gap, then the
held-out span (the most recent data, never trained on)."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

import pandas as pd

from allocator.trainer.market.data import DataError, DateLike


@dataclass(frozen=True)
class RetrainSpans:
    """Inclusive trading-date spans: train, then a purge gap, then the held-out span."""

    train_start: dt.date
    train_end: dt.date
    holdout_start: dt.date
    holdout_end: dt.date


def retrain_spans(
    dates: pd.DatetimeIndex,
    as_of: DateLike | None,
    *,
    train_days: int,
    purge_days: int,
    holdout_days: int,
    source: str = "data",
) -> RetrainSpans:
    """The spans ending on the last trading date on or before ``as_of`` (None: the last date)."""
    if as_of is None:
        end = len(dates) - 1
    else:
        try:
            stamp = pd.Timestamp(as_of)
        except ValueError as exc:
            raise DataError(f"as-of date {as_of!r} is not a date: {exc}") from exc
        end = int(dates.searchsorted(stamp, "right")) - 1
    if end < 0:
        raise DataError(
            f"{source}: no trading date on or before {as_of} (data starts {dates[0].date()})"
        )
    holdout_start = end - holdout_days + 1
    train_end = holdout_start - purge_days - 1
    train_start = train_end - train_days + 1
    if train_start < 0:
        need = train_days + purge_days + holdout_days
        raise DataError(
            f"{source}: {end + 1} trading dates up to {dates[end].date()}, but retraining needs "
            f"train_days + purge_days + holdout_days = {need}"
        )
    return RetrainSpans(
        dates[train_start].date(),
        dates[train_end].date(),
        dates[holdout_start].date(),
        dates[end].date(),
    )
