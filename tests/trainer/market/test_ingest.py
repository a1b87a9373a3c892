"""Ingesting price files into the trade database and reading them back as ``dataset: database``.

Every test runs on SQLite and on a real Postgres, both migrated by alembic as in production.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import sqlalchemy as sa
from click.testing import CliRunner
from sqlalchemy.pool import NullPool

from allocator.cli import main
from allocator.recording.migrations import upgrade
from allocator.trainer.market.data import DataError, load_database, load_dataset
from allocator.trainer.market.ingest import ingest, ingest_file
from allocator.trainer.training.config import DataSettings
from tests.postgres import reset_schema, temporary_database

DATES = pd.bdate_range("2023-01-02", periods=6)  # Mon 2 Jan .. Mon 9 Jan 2023
ASSETS = ("AAPL", "MSFT")


def frame(dates: pd.DatetimeIndex = DATES, offset: float = 0.0) -> pd.DataFrame:
    """Long frame, distinct positive closes: asset j on day i closes at 100 (j + 1) + i."""
    return pd.DataFrame(
        [
            {"date": d.date().isoformat(), "asset": a, "close": 100.0 * (j + 1) + i + offset}
            for i, d in enumerate(dates)
            for j, a in enumerate(ASSETS)
        ]
    )


def write(data: pd.DataFrame, path: Path) -> Path:
    if path.suffix == ".parquet":
        data.to_parquet(path, index=False)
    else:
        data.to_csv(path, index=False)
    return path


def stored(url: str) -> dict[tuple[str, dt.date], float]:
    engine = sa.create_engine(url, poolclass=NullPool)
    try:
        with engine.connect() as conn:
            rows = conn.execute(sa.text("SELECT asset, date, close FROM prices")).all()
    finally:
        engine.dispose()
    return {(a, d if isinstance(d, dt.date) else dt.date.fromisoformat(d)): c for a, d, c in rows}


@pytest.fixture(scope="module")
def postgres_server_db() -> Iterator[str]:
    with temporary_database("allocator_prices") as url:
        yield url


@pytest.fixture(params=["sqlite", "postgres"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A trade database migrated to head: a new SQLite file, or the module's emptied Postgres."""
    if request.param == "sqlite":
        db = f"sqlite:///{tmp_path / 'trade.db'}"
    else:
        db = request.getfixturevalue("postgres_server_db")
        reset_schema(db)
    upgrade(db)
    return db


def test_ingest_is_an_idempotent_upsert_and_reads_back_as_the_file(
    url: str, tmp_path: Path
) -> None:
    path = write(frame(), tmp_path / "prices.parquet")
    first = ingest_file(path, url)
    assert (first.counts.added, first.counts.changed, first.counts.unchanged) == (12, 0, 0)
    again = ingest_file(path, url)
    assert (again.counts.added, again.counts.changed, again.counts.unchanged) == (0, 0, 12)
    assert len(stored(url)) == 12

    moved = frame()
    moved.loc[(moved["asset"] == "MSFT") & (moved["date"] == "2023-01-04"), "close"] = 7.5
    later = frame(pd.bdate_range("2023-01-10", periods=2), offset=6.0)
    update = write(pd.concat([moved, later]), tmp_path / "update.csv")
    report = ingest_file(update, url)
    assert (report.counts.added, report.counts.changed, report.counts.unchanged) == (4, 1, 11)
    assert stored(url)[("MSFT", dt.date(2023, 1, 4))] == 7.5

    data = load_database(url, as_of="2023-01-10", min_history=2)
    assert data.assets == ASSETS
    assert data.dates[-1] == pd.Timestamp("2023-01-10")  # 11 Jan is after as_of
    expected = frame(pd.bdate_range("2023-01-02", periods=7))
    expected.loc[(expected["asset"] == "MSFT") & (expected["date"] == "2023-01-04"), "close"] = 7.5
    wide = expected.pivot(index="date", columns="asset", values="close")
    np.testing.assert_array_equal(data.prices, wide.to_numpy())


def test_a_file_with_a_bad_row_reports_it_and_stores_nothing_from_that_file(
    url: str, tmp_path: Path
) -> None:
    write(frame(), tmp_path / "a_good.csv")
    assert ingest([tmp_path / "a_good.csv"], url)[0].ok
    before = stored(url)

    bad = frame(offset=1.0)  # would change every stored close ...
    bad.loc[5, "close"] = -3.0  # ... but row 6 (MSFT 2023-01-04) is refused
    bad.loc[7, "date"] = "2023-02-30"
    write(bad, tmp_path / "b_bad.csv")
    write(frame(pd.bdate_range("2023-01-10", periods=1), offset=6.0), tmp_path / "c_new.csv")

    reports = ingest([tmp_path], url)
    assert [r.path.name for r in reports] == ["a_good.csv", "b_bad.csv", "c_new.csv"]
    bad_report = reports[1]
    assert not bad_report.stored
    assert [(p.row, p.asset, p.date) for p in bad_report.rejected] == [
        (6, "MSFT", "2023-01-04"),
        (8, "MSFT", "2023-02-30"),
    ]
    lines = bad_report.lines()
    assert (
        "rejected: b_bad.csv row 6 (MSFT 2023-01-04): close must be a finite positive" in (lines[1])
    )
    assert "unparseable date '2023-02-30'" in lines[2]
    assert "nothing from this file stored" in lines[0]
    # Nothing stored was changed by the bad file; the file after it still went in.
    after = stored(url)
    assert {k: after[k] for k in before} == before
    assert len(after) == len(before) + 2

    kept = ingest_file(tmp_path / "b_bad.csv", url, keep_valid=True)
    assert kept.stored
    assert (kept.counts.added, kept.counts.changed, len(kept.rejected)) == (0, 10, 2)
    assert stored(url)[("MSFT", dt.date(2023, 1, 4))] == before[("MSFT", dt.date(2023, 1, 4))]


def test_cli_ingest_reports_and_exits_by_outcome(url: str, tmp_path: Path) -> None:
    runner = CliRunner()
    good = write(frame(), tmp_path / "prices.csv")
    result = runner.invoke(main, ["data", "ingest", str(good), "--database-url", url])
    assert result.exit_code == 0, result.output
    assert "prices.csv: 12 rows: 12 added, 0 changed, 0 unchanged, 0 rejected" in result.output
    assert "stored: 2 assets, 2023-01-02 .. 2023-01-09 (6 dates)" in result.output

    bad = frame().astype({"close": object})
    bad.loc[2, "close"] = "abc"
    write(bad, tmp_path / "prices.csv")
    result = runner.invoke(main, ["data", "ingest", str(good), "--database-url", url])
    assert result.exit_code == 1, result.output
    assert "rejected: prices.csv row 3 (AAPL 2023-01-03): close must be" in result.output

    write(bad.drop(columns=["close"]), tmp_path / "prices.csv")
    result = runner.invoke(main, ["data", "ingest", str(good), "--database-url", url])
    assert result.exit_code == 1
    assert "prices.csv: not ingested: missing column(s) close" in result.output
    assert len(stored(url)) == 12

    # Kept valid rows that leave a hole: stored as asked, and the report says what it broke.
    later = frame(pd.bdate_range("2023-01-10", periods=2), offset=6.0).astype({"close": object})
    later.loc[1, "close"] = "n/a"  # MSFT 2023-01-10
    write(later, tmp_path / "later.csv")
    argv = ["data", "ingest", str(tmp_path / "later.csv"), "--keep-valid", "--database-url", url]
    result = runner.invoke(main, argv)
    assert result.exit_code == 1
    assert "later.csv: 4 rows: 3 added, 0 changed, 0 unchanged, 1 rejected\n" in result.output
    assert "warning: the stored prices do not load as they are: " in result.output
    assert "asset MSFT has no close on 2023-01-10" in result.output


def test_an_unmigrated_database_or_no_files_exit_2_naming_the_fix(tmp_path: Path) -> None:
    runner = CliRunner()
    path = write(frame(), tmp_path / "prices.csv")
    url = f"sqlite:///{tmp_path / 'empty.db'}"
    result = runner.invoke(main, ["data", "ingest", str(path), "--database-url", url])
    assert result.exit_code == 2
    assert "no prices table: run `allocator db upgrade`" in result.output
    (tmp_path / "empty").mkdir()
    result = runner.invoke(main, ["data", "ingest", str(tmp_path / "empty"), "--database-url", url])
    assert result.exit_code == 2
    assert "no price files found" in result.output


def test_dataset_database_reads_database_url_up_to_as_of_and_validates_like_a_file(
    url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DATABASE_URL", url)
    with pytest.raises(DataError, match=r"no prices stored on or before .*allocator data ingest"):
        load_dataset("database")
    ingest_file(write(frame(), tmp_path / "prices.csv"), url)
    assert load_dataset("database", min_history=2).n_dates == len(DATES)  # as_of: today
    assert load_dataset("database", min_history=2, as_of="2023-01-03").n_dates == 2
    # MSFT misses 10 Jan but trades on 11 Jan: the same hole check as a file.
    later = frame(pd.bdate_range("2023-01-10", periods=2), offset=6.0).drop(index=1)
    ingest_file(write(later, tmp_path / "later.csv"), url)
    with pytest.raises(DataError, match="asset MSFT has no close on 2023-01-10"):
        load_dataset("database", min_history=2)


def test_as_of_cuts_every_source_and_may_not_cut_into_the_validation_span() -> None:
    assert load_dataset("sp500", as_of="2021-06-30").dates[-1] == pd.Timestamp("2021-06-30")
    data = {"dataset": "database", "validation_end": "2017-12-31"}
    assert DataSettings.model_validate({**data, "as_of": "2018-01-02"}).as_of == dt.date(2018, 1, 2)
    with pytest.raises(ValueError, match="as_of 2017-12-01 is before validation_end 2017-12-31"):
        DataSettings.model_validate({**data, "as_of": "2017-12-01"})
