"""Market data: the embedded S&P 500 set, loading users' long-format files, and validation."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from allocator.trainer.market.data import (
    DataError,
    MarketData,
    load_dataset,
    load_prices,
    load_sp500,
    validate_long_frame,
)
from tests.markets import to_long_frame

DATES = pd.bdate_range("2021-01-04", periods=8)  # Mon 4 Jan .. Wed 13 Jan 2021
ASSETS = ("AAA", "BBB", "CCC")


def small_frame() -> pd.DataFrame:
    """Long frame: 3 assets x 8 business days, distinct positive closes, sorted by date/asset."""
    rows = [
        {"date": d, "asset": a, "close": 10.0 * (j + 1) + 0.25 * i}
        for i, d in enumerate(DATES)
        for j, a in enumerate(ASSETS)
    ]
    return pd.DataFrame(rows)


def write(frame: pd.DataFrame, path: Path) -> Path:
    if path.suffix == ".parquet":
        frame.to_parquet(path, index=False)
    else:
        frame.to_csv(path, index=False)
    return path


def expected_prices() -> np.ndarray:
    return np.array(
        [[10.0 * (j + 1) + 0.25 * i for j in range(len(ASSETS))] for i in range(len(DATES))]
    )


@pytest.fixture(scope="module")
def sp500() -> MarketData:
    return load_sp500()


# ---------------------------------------------------------------------------------------------
# embedded S&P 500


def test_sp500_has_twenty_stocks_from_1990_to_2022(sp500: MarketData) -> None:
    assert sp500.n_assets == 20
    assert len(set(sp500.assets)) == 20
    assert {"AAPL", "MSFT"} <= set(sp500.assets)
    assert sp500.dates[0].year == 1990
    assert sp500.dates[-1].year == 2022
    assert sp500.dates.is_monotonic_increasing
    assert sp500.dates.is_unique
    assert sp500.prices.shape == (sp500.n_dates, 20)
    assert np.all(np.isfinite(sp500.prices))
    assert np.all(sp500.prices > 0)


def test_load_dataset_by_name_is_the_embedded_set(sp500: MarketData) -> None:
    data = load_dataset("sp500")
    assert data.assets == sp500.assets
    np.testing.assert_array_equal(data.prices, sp500.prices)


def test_load_dataset_by_path_reads_the_file(tmp_path: Path) -> None:
    path = write(small_frame(), tmp_path / "prices.csv")
    data = load_dataset(path, min_history=8)
    assert data.assets == ASSETS
    np.testing.assert_array_equal(data.prices, expected_prices())


# ---------------------------------------------------------------------------------------------
# round trips and accepted variations


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_sp500_slice_round_trips_exactly(tmp_path: Path, sp500: MarketData, suffix: str) -> None:
    original = sp500.between("2020-01-01", "2020-06-30")
    path = write(to_long_frame(original), tmp_path / f"sp500{suffix}")
    loaded = load_prices(path, min_history=60)
    assert loaded.assets == original.assets
    assert loaded.dates.equals(original.dates)
    np.testing.assert_array_equal(loaded.prices, original.prices)
    assert loaded.source == str(path)


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_small_frame_loads_to_the_expected_dense_array(tmp_path: Path, suffix: str) -> None:
    data = load_prices(write(small_frame(), tmp_path / f"p{suffix}"), min_history=8)
    assert data.assets == ASSETS
    assert data.dates.equals(pd.DatetimeIndex(DATES))
    assert data.prices.dtype == np.float64
    np.testing.assert_array_equal(data.prices, expected_prices())


def test_round_trip_keeps_late_listing_as_nan(tmp_path: Path) -> None:
    frame = small_frame()
    # CCC lists from the third date on: NaN before its span, not a hole.
    frame = frame[~((frame["asset"] == "CCC") & (frame["date"] < DATES[2]))]
    data = load_prices(write(frame, tmp_path / "late.csv"), min_history=6)
    expected = expected_prices()
    expected[:2, 2] = np.nan
    np.testing.assert_array_equal(data.prices, expected)
    np.testing.assert_array_equal(data.first_valid(), [0, 0, 2])
    path = write(to_long_frame(data), tmp_path / "again.parquet")
    np.testing.assert_array_equal(load_prices(path, min_history=6).prices, expected)


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_extra_ohlcv_columns_are_accepted(tmp_path: Path, suffix: str) -> None:
    frame = small_frame()
    frame["open"] = frame["close"] - 0.1
    frame["high"] = frame["close"] + 0.5
    frame["low"] = frame["close"] - 0.5
    frame["volume"] = 1000
    data = load_prices(write(frame, tmp_path / f"ohlcv{suffix}"), min_history=8)
    np.testing.assert_array_equal(data.prices, expected_prices())


def test_uppercase_column_names_are_accepted(tmp_path: Path) -> None:
    frame = small_frame().rename(columns={"date": "DATE", "asset": "Asset", "close": " CLOSE "})
    frame["Volume"] = 5
    data = load_prices(write(frame, tmp_path / "upper.csv"), min_history=8)
    assert data.assets == ASSETS
    np.testing.assert_array_equal(data.prices, expected_prices())


def test_asset_ids_do_not_depend_on_header_case(tmp_path: Path) -> None:
    frame = small_frame().replace({"asset": {"AAA": "0001", "BBB": "0002", "CCC": "0003"}})
    lower = load_prices(write(frame, tmp_path / "lower.csv"), min_history=8)
    assert lower.assets == ("0001", "0002", "0003")
    upper = frame.rename(columns={"date": "Date", "asset": "ASSET", "close": "Close"})
    assert load_prices(write(upper, tmp_path / "upper.csv"), min_history=8).assets == lower.assets


def test_integer_dates_are_not_silently_read_as_epoch_offsets(tmp_path: Path) -> None:
    frame = small_frame()
    frame["date"] = [int(d.strftime("%Y%m%d")) for d in frame["date"]]
    data = load_prices(write(frame, tmp_path / "intdates.csv"), min_history=8)
    assert data.dates.equals(pd.DatetimeIndex(DATES))


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_shuffled_rows_are_accepted(tmp_path: Path, suffix: str) -> None:
    frame = small_frame().sample(frac=1.0, random_state=7).reset_index(drop=True)
    assert not frame["date"].is_monotonic_increasing  # the shuffle did reorder
    data = load_prices(write(frame, tmp_path / f"shuffled{suffix}"), min_history=8)
    assert data.assets == ASSETS
    assert data.dates.equals(pd.DatetimeIndex(DATES))
    np.testing.assert_array_equal(data.prices, expected_prices())


def test_to_long_frame_is_sorted_long_format() -> None:
    data = validate_long_frame(small_frame(), source="mem", min_history=8)
    long = to_long_frame(data)
    assert list(long.columns) == ["date", "asset", "close"]
    assert len(long) == len(DATES) * len(ASSETS)
    assert list(long["asset"][:3]) == list(ASSETS)
    assert long["date"].is_monotonic_increasing


# ---------------------------------------------------------------------------------------------
# bad data: one test per failure, each naming the file (and asset/date where they apply)


def load_bad(frame: pd.DataFrame, path: Path, min_history: int = 3) -> str:
    """Write ``frame`` to ``path``, expect ``DataError`` on load, return its message."""
    write(frame, path)
    with pytest.raises(DataError) as info:
        load_prices(path, min_history=min_history)
    message = str(info.value)
    assert str(path) in message
    return message


@pytest.mark.parametrize("column", ["date", "asset", "close"])
def test_missing_column_is_named(tmp_path: Path, column: str) -> None:
    message = load_bad(small_frame().drop(columns=[column]), tmp_path / "missing.csv")
    assert f"missing column(s) {column}" in message


def test_unparseable_date_names_value_and_asset(tmp_path: Path) -> None:
    frame = small_frame().astype({"date": object})
    frame.loc[4, "date"] = "not-a-date"  # row 4 is BBB on the second date
    assert frame.loc[4, "asset"] == "BBB"
    message = load_bad(frame, tmp_path / "dates.csv")
    assert "not-a-date" in message
    assert "BBB" in message


def test_duplicate_date_names_date_and_asset(tmp_path: Path) -> None:
    frame = small_frame()
    extra = pd.DataFrame([{"date": DATES[5], "asset": "CCC", "close": 99.0}])
    message = load_bad(pd.concat([frame, extra], ignore_index=True), tmp_path / "dup.parquet")
    assert "duplicate" in message
    assert "2021-01-11" in message  # DATES[5]
    assert "CCC" in message


@pytest.mark.parametrize("bad", [0.0, -5.0])
def test_non_positive_close_names_asset_and_date(tmp_path: Path, bad: float) -> None:
    frame = small_frame()
    row = (frame["asset"] == "BBB") & (frame["date"] == DATES[3])
    frame.loc[row, "close"] = bad
    message = load_bad(frame, tmp_path / "nonpos.csv")
    assert "BBB" in message
    assert "2021-01-07" in message  # DATES[3]
    assert "finite positive" in message


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, "abc"])
@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_non_finite_close_names_asset_and_date(tmp_path: Path, bad: object, suffix: str) -> None:
    frame = small_frame()
    if isinstance(bad, str):
        frame["close"] = frame["close"].astype(str)  # parquet needs one type per column
    frame.loc[(frame["asset"] == "AAA") & (frame["date"] == DATES[6]), "close"] = bad
    message = load_bad(frame, tmp_path / f"nonfinite{suffix}")
    assert "AAA" in message
    assert "2021-01-12" in message  # DATES[6]
    assert "finite positive" in message


def test_too_little_history_names_the_asset(tmp_path: Path) -> None:
    frame = small_frame()
    frame = frame[~((frame["asset"] == "BBB") & (frame["date"] < DATES[6]))]  # BBB: 2 closes
    message = load_bad(frame, tmp_path / "short.csv", min_history=3)
    assert "asset BBB" in message
    assert "2 closes" in message
    # With a lower requirement the same file loads.
    assert load_prices(tmp_path / "short.csv", min_history=2).n_assets == 3


def test_too_little_history_uses_the_default_of_sixty(tmp_path: Path) -> None:
    message = load_bad(small_frame(), tmp_path / "default.csv", min_history=60)
    assert "fewer than the 60 required" in message


def test_hole_inside_history_names_asset_and_date(tmp_path: Path) -> None:
    frame = small_frame()
    frame = frame[~((frame["asset"] == "CCC") & (frame["date"] == DATES[4]))]
    message = load_bad(frame, tmp_path / "hole.csv")
    assert "asset CCC" in message
    assert "2021-01-08" in message  # DATES[4]


def test_missing_file_is_named(tmp_path: Path) -> None:
    path = tmp_path / "nowhere.csv"
    with pytest.raises(DataError, match="file not found") as info:
        load_prices(path)
    assert str(path) in str(info.value)


def test_unsupported_extension_is_named(tmp_path: Path) -> None:
    path = tmp_path / "prices.xlsx"
    path.write_text("date,asset,close\n")
    with pytest.raises(DataError, match="unsupported file type") as info:
        load_prices(path)
    assert str(path) in str(info.value)
    assert ".xlsx" in str(info.value)


def test_data_error_is_a_value_error() -> None:
    assert issubclass(DataError, ValueError)


# ---------------------------------------------------------------------------------------------
# MarketData: select, between, valid spans, summary


@pytest.fixture
def small() -> MarketData:
    return validate_long_frame(small_frame(), source="small", min_history=8)


def test_select_keeps_the_requested_order(small: MarketData) -> None:
    picked = small.select(["CCC", "AAA"])
    assert picked.assets == ("CCC", "AAA")
    assert picked.dates.equals(small.dates)
    np.testing.assert_array_equal(picked.prices, expected_prices()[:, [2, 0]])


def test_select_unknown_asset_raises_naming_it(small: MarketData) -> None:
    with pytest.raises(DataError, match="unknown asset\\(s\\) ZZZ"):
        small.select(["AAA", "ZZZ"])


def test_select_duplicate_asset_raises(small: MarketData) -> None:
    with pytest.raises(DataError, match="duplicate"):
        small.select(["AAA", "AAA"])


def test_between_is_inclusive_on_both_ends(small: MarketData) -> None:
    part = small.between("2021-01-05", "2021-01-08")
    assert part.dates.equals(pd.DatetimeIndex(DATES[1:5]))
    np.testing.assert_array_equal(part.prices, expected_prices()[1:5])


def test_between_snaps_to_trading_days_inside_the_range(small: MarketData) -> None:
    # Sat 9 Jan .. Sun 10 Jan hold nothing; Fri 8 .. Mon 11 are the nearest dates inside.
    part = small.between("2021-01-09", "2021-01-11")
    assert list(part.dates) == [pd.Timestamp("2021-01-11")]
    part = small.between("2021-01-02", "2021-01-10")
    assert part.dates[0] == DATES[0]
    assert part.dates[-1] == DATES[4]


def test_between_open_ended(small: MarketData) -> None:
    assert small.between(start="2021-01-12").dates.equals(pd.DatetimeIndex(DATES[6:]))
    assert small.between(end="2021-01-05").dates.equals(pd.DatetimeIndex(DATES[:2]))
    assert small.between().n_dates == len(DATES)


def test_between_with_no_dates_raises(small: MarketData) -> None:
    with pytest.raises(DataError, match="no dates between"):
        small.between("2021-01-09", "2021-01-10")  # a weekend
    with pytest.raises(DataError, match="no dates between"):
        small.between("2022-01-01", "2022-12-31")


def test_between_drops_assets_without_prices_in_range() -> None:
    frame = small_frame()
    frame = frame[~((frame["asset"] == "CCC") & (frame["date"] < DATES[5]))]
    data = validate_long_frame(frame, source="late", min_history=3)
    assert data.between(end=DATES[4]).assets == ("AAA", "BBB")
    assert data.between(start=DATES[4]).assets == ASSETS


def test_first_and_last_valid_bound_each_asset_span() -> None:
    nan = np.nan
    prices = np.array(
        [
            [1.0, nan, 1.0],
            [1.0, 2.0, 1.0],
            [1.0, 2.0, nan],
            [1.0, nan, nan],
        ]
    )
    data = MarketData(prices, pd.DatetimeIndex(DATES[:4]), ("A", "B", "C"), "mem")
    np.testing.assert_array_equal(data.first_valid(), [0, 1, 0])
    np.testing.assert_array_equal(data.last_valid(), [3, 2, 1])


def test_market_data_rejects_mismatched_shape() -> None:
    with pytest.raises(ValueError, match="shape"):
        MarketData(np.ones((3, 2)), pd.DatetimeIndex(DATES[:4]), ("A", "B"), "mem")


def test_summary_reports_span_and_growth() -> None:
    growth = 1.001
    n = 6
    prices = np.array([[100.0 * growth**i, np.nan if i < 2 else 50.0] for i in range(n)])
    data = MarketData(prices, pd.DatetimeIndex(DATES[:n]), ("G", "F"), "mem")
    table = data.summary()
    assert list(table.index) == ["G", "F"]
    assert table.loc["G", "days"] == n
    assert table.loc["F", "days"] == n - 2
    assert table.loc["F", "first"] == DATES[2].date()
    assert table.loc["G", "last"] == DATES[n - 1].date()
    assert table.loc["G", "last_close"] == pytest.approx(100.0 * growth ** (n - 1))
    # Constant daily log return ln(1.001) compounds to 1.001**252 - 1 a year, with zero vol.
    assert table.loc["G", "ann_return"] == pytest.approx(growth**252 - 1.0, rel=1e-9)
    assert table.loc["G", "ann_vol"] == pytest.approx(0.0, abs=1e-12)
    assert table.loc["F", "ann_return"] == pytest.approx(0.0, abs=1e-12)
