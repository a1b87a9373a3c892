"""``allocator backtest``: run a policy through the environment's mechanics."""

from __future__ import annotations

import importlib
from typing import Any

import click

from allocator.cli.options import (
    cost_bps_option,
    emit_json,
    failing,
    json_options,
    period_options,
)


def load_policy(spec: str) -> Any:
    """A baseline name, or ``module:attribute`` naming a policy (a class is instantiated)."""
    if ":" not in spec:
        return spec
    module, _, attr = spec.partition(":")
    try:
        obj = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise click.BadParameter(f"cannot load policy {spec!r}: {exc}") from exc
    return obj() if isinstance(obj, type) else obj


@click.command()
@click.option(
    "--policy",
    "policy_spec",
    default="equal-weight",
    show_default=True,
    help="equal-weight, buy-and-hold, cash, min-variance, hrp, momentum, or module:callable",
)
@period_options
@click.option(
    "--dataset",
    default="sp500",
    show_default=True,
    help="'sp500', 'database' ($DATABASE_URL's prices) or a file path",
)
@click.option("--assets", help="comma-separated asset ids (default: all)")
@cost_bps_option
@click.option("--beta", default=0.0, show_default=True, type=float, help="EMA smoothing")
@json_options
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False))
def backtest(
    policy_spec: str,
    start: str,
    end: str,
    dataset: str,
    assets: str | None,
    cost_bps: float,
    beta: float,
    as_json: bool,
    json_out: str | None,
    plot_path: str | None,
) -> None:
    """Backtest a policy with the environment's mechanics; print metrics, write JSON/plot."""
    # heavy (pandas): imported when the command runs, so `allocator --help` stays instant
    from allocator.trainer.market.data import DataError, load_dataset
    from allocator.trainer.sim.backtest import run_backtest
    from allocator.trainer.sim.performance import format_table

    policy = load_policy(policy_spec)
    names = [a.strip() for a in assets.split(",") if a.strip()] if assets else None
    with failing(DataError, ValueError):
        md = load_dataset(dataset)
        result = run_backtest(policy, md, start, end, assets=names, cost_bps=cost_bps, beta=beta)
    if not as_json:
        click.echo(
            f"{result.name} on {md.source}, {result.nav.index[0].date()} .. "
            f"{result.nav.index[-1].date()}, {cost_bps:g} bps"
        )
        click.echo(format_table({result.name: result.metrics()}))
    emit_json(result.to_dict(), as_json, json_out)
    if plot_path:
        # heavy (matplotlib): imported only when a plot is asked for
        from allocator.trainer.sim.plots import plot_backtest

        plot_backtest(result, plot_path)
        click.echo(f"wrote {plot_path}", err=as_json)
