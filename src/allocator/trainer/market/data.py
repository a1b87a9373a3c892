"""Market data, validated on load, as a dense ``(dates, assets)`` array the environment indexes
on its hot path. An asset may start late or end early (NaN outside its span), never have a hole.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TypeAlias

import numpy as np
import pandas as pd
from numpy.typing import NDArray

from allocator.portfolio import check_id
from allocator.recording.settings import database_url, shown_url
from allocator.trainer.market.generated import market, parse_generated
from allocator.trainer.market.store import PriceStoreError, read_price_frame
from allocator.typed_config import ConfigError

REQUIRED_COLUMNS = ("date", "asset", "close")
DEFAULT_MIN_HISTORY = 60
SP500 = "sp500"
DATABASE = "database"
"""``dataset: database``: the prices ``allocator data ingest`` stored in the trade database."""
DateLike: TypeAlias = str | dt.date | pd.Timestamp


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

    def date_index(self, date: DateLike, side: Literal["left", "right"] = "left") -> int:
        """Position of the first date on or after ``date`` (``side='right'``: last on/before)."""
        i = int(self.dates.searchsorted(pd.Timestamp(date), side=side))
        return i if side == "left" else i - 1

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
        keep = np.asarray(np.isfinite(prices).any(axis=0))
        return MarketData(
            prices[:, keep],
            self.dates[lo : hi + 1],
            tuple(a for a, k in zip(self.assets, keep, strict=True) if k),
            self.source,
        )

    def summary(self) -> pd.DataFrame:
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
    # skfolio.datasets brings scikit-learn (~1.5 s): only the sp500 dataset needs it
    from skfolio.datasets import load_sp500_dataset

    frame = load_sp500_dataset()
    frame.index = pd.DatetimeIndex(frame.index).as_unit("ns")
    return from_wide(frame, source="skfolio:sp500")


def load_dataset(
    name_or_path: str | Path, min_history: int = DEFAULT_MIN_HISTORY, as_of: DateLike | None = None
) -> MarketData:
    """``'sp500'``, ``'database'`` (``$DATABASE_URL``), ``'generated:KIND:DRAW'`` or a long
    CSV or Parquet file, without dates after ``as_of`` (the database's default: today)."""
    name = str(name_or_path)
    if name == DATABASE:
        return load_database(database_url(), as_of=as_of, min_history=min_history)
    try:
        generated = parse_generated(name)
    except ValueError as exc:
        raise DataError(str(exc)) from exc
    if generated is not None:
        data = from_wide(market(generated[0]).generate(generated[1]), source=name)
    else:
        data = load_sp500() if name == SP500 else load_prices(name_or_path, min_history)
    return data if as_of is None else data.between(None, as_of)


def check_price_database(dataset: str, job_url: str | None) -> None:
    """Refuse ``dataset: database`` (read from ``$DATABASE_URL``) for a job whose own
    ``database_url`` names another database, rather than mix the two."""
    if dataset == DATABASE and job_url and job_url != database_url():
        raise ConfigError(
            "trainer.data.dataset: 'database' reads the prices from $DATABASE_URL "
            f"({shown_url(database_url())}), but database_url names {shown_url(job_url)}: set "
            "DATABASE_URL to that database and leave database_url unset"
        )


def load_database(
    url: str, as_of: DateLike | None = None, min_history: int = DEFAULT_MIN_HISTORY
) -> MarketData:
    """The stored prices up to ``as_of`` (default: today), checked as a price file is."""
    cutoff = dt.date.today() if as_of is None else pd.Timestamp(as_of).date()
    source = f"database {shown_url(url)} (as of {cutoff})"
    try:
        frame = read_price_frame(url, cutoff)
    except PriceStoreError as exc:
        raise DataError(str(exc)) from exc
    if frame.empty:
        raise DataError(
            f"{source}: no prices stored on or before {cutoff}; "
            "load some with `allocator data ingest FILE|DIR`"
        )
    return validate_long_frame(frame, source=source, min_history=min_history)


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


@dataclass(frozen=True)
class RowProblem:
    """Why one row of a price file is refused; ``row`` counts data rows from 1 (no header)."""

    row: int
    asset: str
    date: str
    reason: str

    def describe(self, source: str) -> str:
        asset = self.asset or "''"
        return f"{source} row {self.row} ({asset} {self.date}): {self.reason}"


def check_rows(frame: pd.DataFrame, source: str) -> tuple[pd.DataFrame, list[RowProblem]]:
    """The rows that pass every check (id, date, close, repeated pair; indexed by file position)
    and the others' problems; a missing column or an empty file raises ``DataError``."""
    columns = {str(c).strip().lower(): c for c in frame.columns}
    missing = [c for c in REQUIRED_COLUMNS if c not in columns]
    if missing:
        raise DataError(
            f"{source}: missing column(s) {', '.join(missing)}; "
            f"expected long format with columns {', '.join(REQUIRED_COLUMNS)}"
        )
    df = frame.rename(columns={v: k for k, v in columns.items()})[list(REQUIRED_COLUMNS)]
    df = df.reset_index(drop=True)
    if df.empty:
        raise DataError(f"{source}: no rows")

    df["asset"] = df["asset"].astype(str).str.strip()
    raw_dates = df["date"]
    # Integers such as 20210104 would otherwise be read as nanoseconds since 1970.
    text = raw_dates.astype(str) if not pd.api.types.is_datetime64_any_dtype(raw_dates) else None
    dates = pd.to_datetime(text if text is not None else raw_dates, errors="coerce", format="mixed")
    df["date"] = dates.dt.tz_localize(None) if dates.dt.tz is not None else dates
    close = pd.to_numeric(df["close"], errors="coerce").to_numpy(dtype=float)
    good_close = np.isfinite(close) & (close > 0)

    id_problems = {a: id_problem(a) for a in df["asset"].unique()}
    reasons = {i: p for i, a in enumerate(df["asset"]) if (p := id_problems[a])}
    for row in np.flatnonzero(df["date"].isna().to_numpy()).tolist():
        reasons.setdefault(row, f"unparseable date {raw_dates.iloc[row]!r}")
    for row in np.flatnonzero(~good_close).tolist():
        value = df["close"].iloc[row]  # as the file gave it, a numpy scalar as its Python value
        value = value.item() if isinstance(value, np.generic) else value
        reasons.setdefault(row, f"close must be a finite positive number, got {value!r}")
    valid = df.drop(index=list(reasons))
    first = valid.index.to_series().groupby([valid["date"], valid["asset"]]).transform("min")
    for i, f in first[first != first.index].items():
        d, a = df.at[i, "date"], df.at[i, "asset"]
        reasons[int(i)] = f"duplicate date {d.date()} for asset {a} (first given on row {f + 1})"

    shown = df["date"].dt.strftime("%Y-%m-%d").fillna(raw_dates.astype(str))
    problems = [
        RowProblem(i + 1, str(df.at[i, "asset"]), shown.iloc[i], reason)
        for i, reason in sorted(reasons.items())
    ]
    clean = df.drop(index=list(reasons))
    clean["close"] = close[clean.index.to_numpy()]
    return clean, problems


def id_problem(asset: str) -> str | None:
    """What the id rule (``portfolio.check_id``) says about an asset id; None when it is fine."""
    try:
        check_id(asset, "asset id", error=lambda field, problem: DataError(f"{field} {problem}"))
    except DataError as exc:
        return str(exc)
    return None


def validate_long_frame(
    frame: pd.DataFrame, source: str, min_history: int = DEFAULT_MIN_HISTORY
) -> MarketData:
    """A checked long-format frame as ``MarketData``; the first problem (a ``check_rows`` one,
    too short a history, a hole in a span) raises."""
    df, problems = check_rows(frame, source)
    if problems:
        raise DataError(problems[0].describe(source))

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
