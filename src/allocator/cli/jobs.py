"""``allocator retrain`` and ``allocator walk-forward``: the scheduled jobs.

Both read a job YAML (``--config``, adjusted by ``--set``) and exit 0 when the job reached its
result, 2 on a bad config or data, 1 when it could not finish. The jobs (torch, sqlalchemy,
onnxruntime) are imported inside the commands, so ``allocator --help`` stays instant.
"""

from __future__ import annotations

import sys

import click

from allocator.cli.options import config_option, config_options, fail, overrides_option, shown_url


@click.command()
@config_options(
    "retraining YAML (see configs/retrain.yaml)",
    "override a key, e.g. --set gates.max_turnover=0.05 --set trainer.seed=1",
    required=True,
)
@click.option("--as-of", default=None, help="retrain as of this date (default: the data's last)")
def retrain(config_path: str, overrides: tuple[str, ...], as_of: str | None) -> None:
    """Train on the latest window; promote the candidate only if every gate passes.

    Exit 0 when a decision was made (promoted or not), 2 on a bad config or data, 1 when the
    job could not reach a decision (database, registry, export).
    """
    # heavy (torch, onnxruntime, sqlalchemy): imported when the command runs, keeps --help instant
    from allocator.artifacts.manifest import ManifestError
    from allocator.registry.errors import ModelLoadError
    from allocator.trainer.export.errors import ExportError
    from allocator.trainer.jobs.retrain.config import RetrainError, load_retrain_config
    from allocator.trainer.jobs.retrain.runner import retrain as run_retrain
    from allocator.trainer.market.data import DataError
    from allocator.trainer.training.config import ConfigError

    try:
        config = load_retrain_config(config_path, list(overrides))
    except ConfigError as exc:
        fail(str(exc))
    try:
        decision = run_retrain(config, as_of, echo=click.echo)
    except (ConfigError, DataError) as exc:
        fail(str(exc))
    except (RetrainError, ExportError, ModelLoadError, ManifestError, OSError) as exc:
        click.echo(f"error: retraining failed, production unchanged: {exc}", err=True)
        sys.exit(1)
    click.echo("")
    click.echo(decision.summary())
    if decision.push_error:
        click.echo(f"warning: {decision.push_error}", err=True)


@click.command("walk-forward")
@config_option("walk-forward YAML (see configs/walk_forward.yaml)", required=True)
@click.option(
    "--executor",
    type=click.Choice(["local", "ray"]),
    default=None,
    help="run windows in this process or as Ray tasks (default: the config's)",
)
@click.option("--ray-address", default=None, help="join this Ray cluster (implies --executor ray)")
@overrides_option(
    "override a key, e.g. --set trainer.total_timesteps=1000 --set windows.purge_days=10"
)
@click.option(
    "--out",
    default=None,
    type=click.Path(file_okay=False),
    help="write runs, summary.json and report/ here (default: output_dir/name-label)",
)
@click.option("--progress/--no-progress", default=True, show_default=True)
def walk_forward(
    config_path: str,
    executor: str | None,
    ray_address: str | None,
    overrides: tuple[str, ...],
    out: str | None,
    progress: bool,
) -> None:
    """Walk-forward validation: per window train, export, backtest the export vs baselines.

    Exit 0 when every window ran and was recorded, 2 on a bad config or data, 1 when a window
    or the recording failed, or when the Pushgateway push failed (rows and report are written).
    """
    # heavy (torch, onnxruntime, sqlalchemy): imported when the command runs, keeps --help instant
    from allocator.artifacts.manifest import ManifestError
    from allocator.registry.errors import ModelLoadError
    from allocator.trainer.export.errors import ExportError
    from allocator.trainer.jobs.walk_forward.config import (
        WalkForwardError,
        load_walk_forward_config,
    )
    from allocator.trainer.jobs.walk_forward.report import format_summary
    from allocator.trainer.jobs.walk_forward.runner import run_walk_forward
    from allocator.trainer.market.data import DataError
    from allocator.trainer.market.windows import WindowError
    from allocator.trainer.training.config import ConfigError

    extra = list(overrides)
    if ray_address:
        extra += ["executor=ray", f"ray_address={ray_address}"]
    elif executor:
        extra.append(f"executor={executor}")
    try:
        config = load_walk_forward_config(config_path, extra)
    except ConfigError as exc:
        fail(str(exc))
    try:
        result = run_walk_forward(config, out_dir=out, progress=progress)
    except (ConfigError, DataError, WindowError) as exc:
        fail(str(exc))
    except (WalkForwardError, ExportError, ModelLoadError, ManifestError, OSError) as exc:
        click.echo(f"error: walk-forward failed: {exc}", err=True)
        sys.exit(1)
    click.echo(f"{len(result.windows)} windows in {result.seconds:.1f} s ({config.executor})")
    click.echo(format_summary(result.summary))
    if result.run_id is not None:
        shown = shown_url(str(result.database_url))
        click.echo(f"recorded: walk-forward run {result.run_id} in {shown}")
    click.echo(f"summary: {result.files['summary']}")
    click.echo(f"report:  {result.files['report']}")
    if result.push_error:
        click.echo(f"error: {result.push_error}", err=True)
        sys.exit(1)
