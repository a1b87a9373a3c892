"""``allocator data ingest``: price files into the trade database, one transaction per file, all
or nothing unless ``keep_valid`` (a hole would refuse every later training run, and a bad row
often means a cut or shifted file)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy.exc import SQLAlchemyError

from allocator.recording.settings import shown_url
from allocator.trainer.market.data import (
    DataError,
    RowProblem,
    check_rows,
    load_database,
    read_long_frame,
)
from allocator.trainer.market.store import (
    PriceStoreError,
    UpsertCounts,
    price_engine,
    require_table,
    upsert_prices,
)

PRICE_SUFFIXES = (".csv", ".csv.gz", ".parquet", ".pq")
"""The files a directory contributes (others, such as a README, are skipped)."""


@dataclass
class FileReport:
    """What ingesting one file did, or why it stored nothing."""

    path: Path
    rows: int = 0
    counts: UpsertCounts = field(default_factory=lambda: UpsertCounts(0, 0, 0))
    rejected: list[RowProblem] = field(default_factory=list)
    stored: bool = False
    error: str | None = None  # the whole file was unreadable (no rows could be checked)

    @property
    def ok(self) -> bool:
        """Nothing refused: every row stored or already equal."""
        return self.error is None and not self.rejected

    def lines(self) -> list[str]:
        name = self.path.name
        if self.error is not None:
            return [f"{name}: not ingested: {self.error}"]
        c = self.counts
        summary = (
            f"{name}: {self.rows} rows: {c.added} added, {c.changed} changed, "
            f"{c.unchanged} unchanged, {len(self.rejected)} rejected"
        )
        if self.rejected and not self.stored:
            summary += " (nothing from this file stored: fix the rows below and ingest it again)"
        return [summary, *(f"rejected: {p.describe(name)}" for p in self.rejected)]


def price_files(paths: Iterable[str | Path]) -> list[Path]:
    """Each path as given when it is a file; a directory's price files, sorted by name."""
    found: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            found.extend(
                sorted(p for p in path.iterdir() if p.is_file() and p.name.endswith(PRICE_SUFFIXES))
            )
        elif path.exists():
            found.append(path)
        else:
            raise DataError(f"{path}: no such file or directory")
    return found


def ingest_file(path: Path, url: str, *, keep_valid: bool = False) -> FileReport:
    """Check every row of ``path`` and store it in one transaction (see the module docstring)."""
    report = FileReport(path)
    try:
        rows, report.rejected = check_rows(read_long_frame(path), source=str(path))
    except DataError as exc:
        report.error = str(exc).removeprefix(f"{path}: ")
        return report
    report.rows = len(rows) + len(report.rejected)
    if report.rejected and not keep_valid:
        return report
    try:
        with price_engine(url) as engine, engine.begin() as conn:
            require_table(conn, url)
            report.counts = upsert_prices(conn, rows, source=path.name)
    except SQLAlchemyError as exc:
        raise PriceStoreError(
            f"{shown_url(url)}: storing {path} failed, nothing from it stored ({exc})"
        ) from exc
    report.stored = True
    return report


def stored_state(url: str) -> str:
    """One line on what ``dataset: database`` would now read: the calendar, or the first problem."""
    try:
        data = load_database(url, min_history=1)
    except DataError as exc:
        return f"warning: the stored prices do not load as they are: {exc}"
    return (
        f"stored: {data.n_assets} assets, {data.dates[0].date()} .. {data.dates[-1].date()} "
        f"({data.n_dates} dates)"
    )


def ingest(paths: Iterable[str | Path], url: str, *, keep_valid: bool = False) -> list[FileReport]:
    """One report per price file named (or in a directory named); ``PriceStoreError`` stops all."""
    files = price_files(paths)
    if not files:
        raise DataError(
            f"no price files found (looked for {', '.join(PRICE_SUFFIXES)} in the given paths)"
        )
    return [ingest_file(path, url, keep_valid=keep_valid) for path in files]
