"""``allocator demo``, end to end on the embedded data: baselines, then (with ``--train``) train
-> export -> serve -> a tiny walk-forward -> paper trading over the validation days."""

from __future__ import annotations

import datetime as dt
import json
import shutil
from pathlib import Path

import click

from allocator.artifacts.files import write_json
from allocator.cli.options import cost_bps_option, period_options

WALK_FORWARD_CONFIG = Path("configs/walk_forward_tiny.yaml")
"""The demo's walk-forward: two tiny windows; skipped when run outside the checkout."""


@click.command()
@click.option("--out", default="runs/demo", show_default=True, type=click.Path(file_okay=False))
@period_options
@cost_bps_option
@click.option(
    "--train/--no-train",
    "do_train",
    default=True,
    show_default=True,
    help="also train the demo config and export it to a local registry",
)
@click.option(
    "--config",
    "config_path",
    default="configs/td3_shared_demo.yaml",
    show_default=True,
    help="training config for the demo (defaults are used if the file is absent)",
)
def demo(out: str, start: str, end: str, cost_bps: float, do_train: bool, config_path: str) -> None:
    """The first run on a new machine: baselines, then train -> export on the embedded data."""
    # heavy (pandas, matplotlib): imported when the command runs, keeps --help instant
    from allocator.trainer.market.data import load_sp500
    from allocator.trainer.sim.backtest import run_backtest
    from allocator.trainer.sim.baselines import NEEDS_RECIPE, BaselineName
    from allocator.trainer.sim.performance import format_table
    from allocator.trainer.sim.plots import plot_allocations, plot_performance

    md = load_sp500()
    click.echo(
        f"data: {md.source}, {md.n_assets} assets; backtest {start} .. {end}, "
        f"{cost_bps:g} bps costs"
    )
    results = {}
    for name in (b for b in BaselineName if b not in NEEDS_RECIPE):
        click.echo(f"  running {name.value} ...")
        results[name.value] = run_backtest(name.value, md, start, end, cost_bps=cost_bps)
    table = {name: r.metrics() for name, r in results.items()}
    click.echo("")
    click.echo(format_table(table))
    out_dir = Path(out)
    written = [
        write_json(out_dir / "metrics.json", table),
        plot_performance(results, out_dir / "equity.png"),
        plot_allocations(results[BaselineName.MIN_VARIANCE.value], out_dir / "allocations.png"),
    ]
    click.echo("")
    for path in written:
        click.echo(f"wrote {path}")
    if do_train:
        validation = _train_and_export(out_dir, config_path)
        # heavy (onnxruntime, grpc, sqlalchemy): imported only when the demo goes on to serve
        from allocator.serving.demo import serve_demo
        from allocator.trading.demo import paper_trade_demo

        click.echo("")
        serve_demo(out_dir / "models", out_dir, md.prices, md.assets, echo=click.echo)
        _walk_forward(out_dir)
        click.echo("")
        paper_trade_demo(  # the exported model over the validation days, live NAV vs backtest
            out_dir / "models",
            out_dir,
            [d.date() for d in md.dates],
            md.prices,
            md.assets,
            *validation,
            echo=click.echo,
        )


def _train_and_export(out_dir: Path, config_path: str) -> tuple[dt.date, dt.date]:
    """Train the demo config, export it to ``out_dir/models`` and print the ONNX parity;
    returns the validation span."""
    # heavy (torch, onnx): imported when the demo trains, keeps --help instant
    from allocator.artifacts.manifest import read_manifest
    from allocator.trainer.export.parity import PARITY_TOLERANCE, format_parity
    from allocator.trainer.export.run import export_run
    from allocator.trainer.sim.performance import format_allocation, format_table
    from allocator.trainer.training.audit import SATURATION_FILE
    from allocator.trainer.training.config import load_config
    from allocator.trainer.training.run import train as run_training
    from allocator.trainer.training.saturation import collapse_warnings

    path = config_path if Path(config_path).is_file() else None
    config = load_config(path, [])
    click.echo("")
    click.echo(
        f"training {config.algorithm.name} ({path or 'default config'}), "
        f"{config.total_timesteps} steps ..."
    )
    run_dir = out_dir / "run"
    if run_dir.exists():
        shutil.rmtree(run_dir)
    run = run_training(config, run_dir)
    click.echo(f"validation {config.data.validation_start} .. {config.data.validation_end}:")
    click.echo(format_table(run.summary["validation"]))
    agent = run.validation[config.algorithm.name]
    validation = json.loads((run.run_dir / "validation.json").read_text())
    excess = validation["excess_sharpe_vs_equal_weight"]
    click.echo(
        f"excess Sharpe over equal weight: {excess['estimate']:+.2f} "
        f"[{excess['low']:+.2f}, {excess['high']:+.2f}] ({excess['level']:.0%} stationary "
        f"bootstrap over {excess['days']} days; an interval that holds 0 is no evidence either way)"
    )
    over_anchor = validation.get("excess_sharpe_vs_anchor")
    if over_anchor:
        click.echo(
            f"excess Sharpe over its anchor (the portfolio a zero tilt holds): "
            f"{over_anchor['estimate']:+.2f} [{over_anchor['low']:+.2f}, "
            f"{over_anchor['high']:+.2f}]: what the learned tilt adds"
        )
    click.echo("")
    click.echo(format_allocation(agent.allocation_summary()))
    saturation = json.loads((run.run_dir / SATURATION_FILE).read_text())
    click.echo(
        f"action saturation: {saturation['near_bound_ratio']:.1%} of live action values near "
        f"the bound, mean kappa {saturation['mean_kappa']:.2f} ({SATURATION_FILE})"
    )
    for line in collapse_warnings(run.summary):
        click.echo(line)
    version_dir = export_run(run.run_dir, out_dir / "models", name="demo")
    exported = read_manifest(version_dir)
    click.echo("")
    click.echo(f"exported to {version_dir}")
    parity = (exported.export or {}).get("parity", {})
    click.echo(f"ONNX vs torch, max abs difference (export fails above {PARITY_TOLERANCE:g}):")
    click.echo(format_parity(parity))
    return config.data.validation_start, config.data.validation_end


def _walk_forward(out_dir: Path) -> None:
    """Two tiny walk-forward windows, recorded in the demo's SQLite file, with a report."""
    # heavy (torch, sqlalchemy): imported when the demo runs it, keeps --help instant
    from allocator.trainer.jobs.walk_forward.config import load_walk_forward_config
    from allocator.trainer.jobs.walk_forward.report import format_summary
    from allocator.trainer.jobs.walk_forward.runner import run_walk_forward

    path = WALK_FORWARD_CONFIG
    if not path.is_file():
        click.echo(f"(skipping the walk-forward: {path} is not here)")
        return
    wf_dir = out_dir / "walk_forward"
    config = load_walk_forward_config(
        path,
        [
            f"registry={wf_dir / 'models'}",
            f"output_dir={wf_dir}",
            f"database_url=sqlite:///{out_dir / 'trades.db'}",
        ],
    )
    click.echo("")
    click.echo(f"walk-forward ({path}): train, export, backtest vs baselines per window ...")
    result = run_walk_forward(config, out_dir=str(wf_dir), progress=False)
    click.echo(format_summary(result.summary))
    click.echo(f"report: {result.files['report']}")
