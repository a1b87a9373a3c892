"""``allocator train``: one TD3 or SAC training run.

The trainer (torch, stable-baselines3) is imported inside the command, so ``allocator --help``
stays instant.
"""

from __future__ import annotations

from pathlib import Path

import click

from allocator.cli.options import config_options, fail


@click.command()
@config_options(
    "YAML config (see configs/); defaults when omitted",
    "override a config key, e.g. --set algorithm.smoothness.mode=adaptive",
    required=False,
)
@click.option(
    "--run-dir",
    default=None,
    type=click.Path(file_okay=False),
    help="write the run here instead of output_dir/name-timestamp",
)
def train(config_path: str | None, overrides: tuple[str, ...], run_dir: str | None) -> None:
    """Train a TD3 or SAC policy; write model, audits, logs and a validation backtest."""
    # heavy (torch): imported when the command runs, so `allocator --help` stays instant
    from allocator.trainer.market.data import DataError
    from allocator.trainer.sim.performance import format_table
    from allocator.trainer.training.config import ConfigError, load_config
    from allocator.trainer.training.run import train as run_training

    try:
        config = load_config(config_path, list(overrides))
        run = run_training(config, Path(run_dir) if run_dir else None)
    except (ConfigError, DataError) as exc:
        fail(str(exc))
    click.echo(f"run: {run.run_dir}")
    click.echo(
        f"{run.summary['algorithm']}: {run.summary['total_timesteps']} steps in "
        f"{run.summary['train_seconds']} s on {run.summary['device']}, "
        f"final smoothness lambda {run.summary['smooth_lambda']:.4g}"
    )
    click.echo(f"validation {config.data.validation_start} .. {config.data.validation_end}:")
    click.echo(format_table(run.summary["validation"]))
