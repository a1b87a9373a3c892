"""Market data: the embedded S&P 500 default and users' own price files, validated on load.

Prices are held as a dense ``(dates, assets)`` float64 array so the environment indexes arrays,
never pandas, on its hot path. An asset may start late or end early (NaN outside its span), but
never has a hole inside its span.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from numpy.typing import NDArray

REQUIRED_COLUMNS = ("date", "asset", "close")
OPTIONAL_COLUMNS = ("open", "high", "low", "volume")
DEFAULT_MIN_HISTORY = 60
SP500 = "sp500"
DateLike = str | dt.date | pd.Timestamp


class DataError(ValueError):
    """Bad market data; the message names the file and, where it applies, asset and date."""


@dataclass(frozen=True)
class MarketData:
    """Daily closes of a set of assets on a common calendar."""

    prices: NDArray[np.float64]  # (n_dates, n_assets), NaN where an asset is not listed
    dates: pd.DatetimeIndex
    assets: tuple[str, ...]
    source: str

    def __post_init__(self) -> None:
        if self.prices.shape != (len(self.dates), len(self.assets)):
            raise ValueError(
                f"prices shape {self.prices.shape} != (dates, assets) "
                f"{(len(self.dates), len(self.assets))}"
            )

    @property
    def n_dates(self) -> int:
        return len(self.dates)

    @property
    def n_assets(self) -> int:
        return len(self.assets)

    def first_valid(self) -> NDArray[np.int64]:
        """Index of each asset's first listed date."""
        return np.argmax(np.isfinite(self.prices), axis=0)

    def last_valid(self) -> NDArray[np.int64]:
        """Index of each asset's last listed date."""
        return self.n_dates - 1 - np.argmax(np.isfinite(self.prices[::-1]), axis=0)

    def to_frame(self) -> pd.DataFrame:
        return pd.DataFrame(self.prices, index=self.dates, columns=list(self.assets))

    def date_index(self, date: DateLike, side: str = "left") -> int:
        """Position of the first date on or after ``date`` (``side='right'``: last on/before)."""
        ts = pd.Timestamp(date)
        if side == "left":
            return int(self.dates.searchsorted(ts, side="left"))
        return int(self.dates.searchsorted(ts, side="right")) - 1

    def select(self, assets: Sequence[str]) -> MarketData:
        """The same calendar restricted to ``assets`` (in the order given)."""
        missing = [a for a in assets if a not in self.assets]
        if missing:
            raise DataError(f"{self.source}: unknown asset(s) {', '.join(missing)}")
        if len(set(assets)) != len(assets):
            raise DataError(f"{self.source}: duplicate asset ids in selection")
        idx = [self.assets.index(a) for a in assets]
        return MarketData(self.prices[:, idx], self.dates, tuple(assets), self.source)

    def between(self, start: DateLike | None = None, end: DateLike | None = None) -> MarketData:
        """Dates in ``[start, end]`` (inclusive), dropping assets with no price there."""
        lo = 0 if start is None else self.date_index(start, "left")
        hi = self.n_dates - 1 if end is None else self.date_index(end, "right")
        if hi < lo:
            raise DataError(f"{self.source}: no dates between {start} and {end}")
        prices = self.prices[lo : hi + 1]
        keep = np.isfinite(prices).any(axis=0)
        return MarketData(
            prices[:, keep],
            self.dates[lo : hi + 1],
            tuple(a for a, k in zip(self.assets, keep, strict=True) if k),
            self.source,
        )

    def summary(self) -> pd.DataFrame:
        """One row per asset: first and last date, observations, last close, annual return/vol."""
        rows = []
        first, last = self.first_valid(), self.last_valid()
        for j, name in enumerate(self.assets):
            p = self.prices[first[j] : last[j] + 1, j]
            r = np.diff(np.log(p))
            rows.append(
                {
                    "asset": name,
                    "first": self.dates[first[j]].date(),
                    "last": self.dates[last[j]].date(),
                    "days": len(p),
                    "last_close": float(p[-1]),
                    "ann_return": float(np.expm1(r.mean() * 252)) if len(r) else float("nan"),
                    "ann_vol": float(r.std(ddof=1) * np.sqrt(252)) if len(r) > 1 else float("nan"),
                }
            )
        return pd.DataFrame(rows).set_index("asset")


def load_sp500() -> MarketData:
    """skfolio's embedded S&P 500 dataset: 20 stocks, daily closes 1990-2022, no download."""
    from skfolio.datasets import load_sp500_dataset

    frame = load_sp500_dataset()
    frame.index = pd.DatetimeIndex(frame.index).as_unit("ns")
    return from_wide(frame, source="skfolio:sp500")


def load_dataset(name_or_path: str | Path, min_history: int = DEFAULT_MIN_HISTORY) -> MarketData:
    """``'sp500'`` for the embedded data, else a CSV or Parquet file in long format."""
    if str(name_or_path) == SP500:
        return load_sp500()
    return load_prices(name_or_path, min_history=min_history)


def read_long_frame(path: str | Path) -> pd.DataFrame:
    """Read a CSV or Parquet file as-is (validation is separate)."""
    p = Path(path)
    if not p.exists():
        raise DataError(f"{p}: file not found")
    suffix = p.suffix.lower()
    try:
        if suffix in (".parquet", ".pq"):
            return pd.read_parquet(p)
        if suffix in (".csv", ".txt") or p.name.endswith(".csv.gz"):
            # Everything as text: asset ids keep leading zeros whatever the header's case;
            # dates and closes are parsed (and their failures reported) by validation.
            return pd.read_csv(p, dtype=str, keep_default_na=False)
    except (OSError, ValueError, pd.errors.ParserError) as exc:
        raise DataError(f"{p}: cannot read file: {exc}") from exc
    raise DataError(f"{p}: unsupported file type {suffix!r} (use .csv or .parquet)")


def load_prices(path: str | Path, min_history: int = DEFAULT_MIN_HISTORY) -> MarketData:
    """Load and validate a long-format price file: date, asset, close (OHLCV accepted)."""
    return validate_long_frame(read_long_frame(path), source=str(path), min_history=min_history)


def validate_long_frame(
    frame: pd.DataFrame, source: str, min_history: int = DEFAULT_MIN_HISTORY
) -> MarketData:
    """Check a long-format frame and pivot it to ``MarketData``; the first problem raises.

    Rows may come in any order. Refused: a missing required column, an unparseable date, a
    repeated (date, asset) pair, a close that is not a finite positive number, an asset with
    fewer than ``min_history`` closes, and a hole inside an asset's span (a date on which other
    assets trade but it does not, between its first and last close).
    """
    columns = {str(c).strip().lower(): c for c in frame.columns}
    missing = [c for c in REQUIRED_COLUMNS if c not in columns]
    if missing:
        raise DataError(
            f"{source}: missing column(s) {', '.join(missing)}; "
            f"expected long format with columns {', '.join(REQUIRED_COLUMNS)}"
        )
    df = frame.rename(columns={v: k for k, v in columns.items()})
    df = df[[c for c in (*REQUIRED_COLUMNS, *OPTIONAL_COLUMNS) if c in df.columns]].copy()
    if df.empty:
        raise DataError(f"{source}: no rows")

    df["asset"] = df["asset"].astype(str).str.strip()
    raw_dates = df["date"]
    # Integers such as 20210104 would otherwise be read as nanoseconds since 1970.
    text = raw_dates.astype(str) if not pd.api.types.is_datetime64_any_dtype(raw_dates) else None
    dates = pd.to_datetime(text if text is not None else raw_dates, errors="coerce", format="mixed")
    bad = dates.isna()
    if bad.any():
        i = int(np.flatnonzero(bad.to_numpy())[0])
        raise DataError(
            f"{source}: unparseable date {raw_dates.iloc[i]!r} for asset "
            f"{df['asset'].iloc[i]} (row {i + 1})"
        )
    df["date"] = dates.dt.tz_localize(None) if dates.dt.tz is not None else dates

    close = pd.to_numeric(df["close"], errors="coerce")
    bad = ~(np.isfinite(close.to_numpy(dtype=float)) & (close.to_numpy(dtype=float) > 0))
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise DataError(
            f"{source}: close must be a finite positive number, got {df['close'].iloc[i]!r} "
            f"for asset {df['asset'].iloc[i]} on {df['date'].iloc[i].date()}"
        )
    df["close"] = close.astype(float)

    dup = df.duplicated(subset=["date", "asset"], keep="first")
    if dup.any():
        i = int(np.flatnonzero(dup.to_numpy())[0])
        raise DataError(
            f"{source}: duplicate date {df['date'].iloc[i].date()} for asset {df['asset'].iloc[i]}"
        )

    wide = df.pivot(index="date", columns="asset", values="close").sort_index()
    wide = wide[sorted(wide.columns)]
    counts = wide.notna().sum()
    short = counts[counts < min_history]
    if not short.empty:
        name = str(short.index[0])
        last = wide[name].last_valid_index()
        raise DataError(
            f"{source}: asset {name} has {int(short.iloc[0])} closes (last on "
            f"{pd.Timestamp(last).date()}), fewer than the {min_history} required"
        )
    for name in wide.columns:
        col = wide[name]
        span = col.loc[col.first_valid_index() : col.last_valid_index()]
        holes = span.index[span.isna()]
        if len(holes):
            raise DataError(
                f"{source}: asset {name} has no close on {holes[0].date()} inside its history "
                f"({len(holes)} missing date(s) in all); fill or drop them before loading"
            )
    return from_wide(wide, source=source)


def from_wide(frame: pd.DataFrame, source: str) -> MarketData:
    """Wrap a validated wide frame (dates x assets)."""
    return MarketData(
        prices=frame.to_numpy(dtype=np.float64, copy=True),
        dates=pd.DatetimeIndex(frame.index),
        assets=tuple(str(c) for c in frame.columns),
        source=source,
    )


def to_long_frame(data: MarketData) -> pd.DataFrame:
    """Long-format frame (date, asset, close) of ``data``; the inverse of loading."""
    frame = data.to_frame()
    frame.index.name = "date"
    long = frame.reset_index().melt(id_vars="date", var_name="asset", value_name="close")
    return long.dropna(subset=["close"]).sort_values(["date", "asset"]).reset_index(drop=True)
