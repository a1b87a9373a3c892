"""``allocator data``: inspect and validate market data.

pandas is imported inside each command (it loads the data), so ``allocator --help`` stays instant.
"""

from __future__ import annotations

import click

from allocator.cli.options import fail


@click.group()
def data() -> None:
    """Inspect and validate market data."""


@data.command("info")
@click.option("--dataset", default="sp500", show_default=True, help="'sp500' or a CSV/Parquet path")
def data_info(dataset: str) -> None:
    """Summarize a dataset: calendar, assets, per-asset history and annual figures."""
    # heavy (pandas): imported when the command runs, so `allocator --help` stays instant
    from allocator.trainer.market.data import DataError, load_dataset

    try:
        md = load_dataset(dataset)
    except DataError as exc:
        fail(str(exc))
    click.echo(f"source: {md.source}")
    click.echo(f"dates:  {md.dates[0].date()} .. {md.dates[-1].date()} ({md.n_dates} days)")
    click.echo(f"assets: {md.n_assets}")
    click.echo(md.summary().to_string(float_format=lambda v: f"{v:.4f}"))


@data.command("check")
@click.argument("path", type=click.Path(dir_okay=False))
@click.option("--min-history", default=60, show_default=True, help="fewest closes per asset")
def data_check(path: str, min_history: int) -> None:
    """Validate a long-format price file (date, asset, close); exit 2 naming the first problem."""
    # heavy (pandas): imported when the command runs, so `allocator --help` stays instant
    from allocator.trainer.market.data import DataError, load_prices

    try:
        md = load_prices(path, min_history=min_history)
    except DataError as exc:
        fail(str(exc))
    click.echo(
        f"ok: {path}: {md.n_assets} assets, {md.n_dates} dates "
        f"({md.dates[0].date()} .. {md.dates[-1].date()})"
    )
