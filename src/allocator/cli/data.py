"""``allocator data``: inspect, validate and ingest market data."""

from __future__ import annotations

import sys

import click

from allocator.cli.options import database_url_option, emit_json, failing, json_options
from allocator.recording.settings import shown_url


@click.group()
def data() -> None:
    """Inspect, validate and ingest market data."""


@data.command("info")
@click.option(
    "--dataset",
    default="sp500",
    show_default=True,
    help="'sp500', 'database' ($DATABASE_URL's prices, up to today) or a CSV/Parquet path",
)
@json_options
def data_info(dataset: str, as_json: bool, json_out: str | None) -> None:
    """Summarize a dataset: calendar, assets, per-asset history and annual figures."""
    # heavy (pandas): imported when the command runs, so `allocator --help` stays instant
    from allocator.trainer.market.data import DataError, load_dataset

    with failing(DataError):
        md = load_dataset(dataset)
    summary = md.summary()
    if not as_json:
        click.echo(f"source: {md.source}")
        click.echo(f"dates:  {md.dates[0].date()} .. {md.dates[-1].date()} ({md.n_dates} days)")
        click.echo(f"assets: {md.n_assets}")
        click.echo(summary.to_string(float_format=lambda v: f"{v:.4f}"))
    report = {
        "source": md.source,
        "first": md.dates[0].date().isoformat(),
        "last": md.dates[-1].date().isoformat(),
        "days": md.n_dates,
        "assets": {
            str(asset): {k: v.isoformat() if hasattr(v, "isoformat") else v for k, v in row.items()}
            for asset, row in summary.to_dict(orient="index").items()
        },
    }
    emit_json(report, as_json, json_out)


@data.command("check")
@click.argument("path", type=click.Path(dir_okay=False))
@click.option("--min-history", default=60, show_default=True, help="fewest closes per asset")
def data_check(path: str, min_history: int) -> None:
    """Validate a long-format price file (date, asset, close); exit 2 naming the first problem."""
    # heavy (pandas): imported when the command runs, so `allocator --help` stays instant
    from allocator.trainer.market.data import DataError, load_prices

    with failing(DataError):
        md = load_prices(path, min_history=min_history)
    click.echo(
        f"ok: {path}: {md.n_assets} assets, {md.n_dates} dates "
        f"({md.dates[0].date()} .. {md.dates[-1].date()})"
    )


@data.command("ingest")
@click.argument("paths", nargs=-1, required=True, type=click.Path())
@database_url_option
@click.option(
    "--keep-valid",
    is_flag=True,
    help="store a file's valid rows even when some of its rows are rejected "
    "(default: a file with a rejected row stores nothing)",
)
def data_ingest(paths: tuple[str, ...], database_url: str | None, keep_valid: bool) -> None:
    """Store price files (CSV/Parquet, long format; a directory: its price files) in the trade
    database, upserting on (asset, date). Prints rows added, changed, unchanged and rejected
    (with why), then what the stored prices now hold (or why they would not load); exits 1 when
    a row or a file was rejected, 2 when the job could not run (no files, no prices table)."""
    # heavy (pandas, sqlalchemy): imported when the command runs, so `allocator --help` stays
    # instant
    from allocator.recording.settings import database_url as default_database_url
    from allocator.trainer.market.data import DataError
    from allocator.trainer.market.ingest import ingest, stored_state
    from allocator.trainer.market.store import PriceStoreError

    url = database_url or default_database_url()
    click.echo(f"database: {shown_url(url)}")
    with failing(DataError, PriceStoreError):
        reports = ingest(paths, url, keep_valid=keep_valid)
    for report in reports:
        for line in report.lines():
            click.echo(line)
    click.echo(stored_state(url))
    if not all(r.ok for r in reports):
        sys.exit(1)
