"""``allocator train``: one TD3 or SAC training run, or the rest of one that was interrupted.

SIGTERM or Ctrl-C stops the run after the current step with a checkpoint there (exit 143 or
130), which ``--resume`` continues; a second signal stops it at once.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from allocator.cli.options import (
    config_option,
    fail,
    graceful_stop,
    interrupted_exit_code,
    overrides_option,
)
from allocator.recording.settings import shown_url


@click.command()
@config_option(
    "YAML config (see configs/); defaults when omitted (with --resume: the run's config.yaml)",
    required=False,
)
@overrides_option("override a config key, e.g. --set algorithm.smoothness.mode=adaptive")
@click.option(
    "--run-dir",
    type=click.Path(file_okay=False),
    help="write the run here instead of output_dir/name-timestamp",
)
@click.option(
    "--resume",
    "resume_dir",
    type=click.Path(file_okay=False, exists=True),
    help="continue this run from its last checkpoint (see checkpoint_every) to total_timesteps",
)
@click.option(
    "--database-url",
    help="record the finished run in this trade database's training_runs (migrated first)",
)
def train(
    config_path: str | None,
    overrides: tuple[str, ...],
    run_dir: str | None,
    resume_dir: str | None,
    database_url: str | None,
) -> None:
    """Train a TD3 or SAC policy; write model, audits, logs and a validation backtest (its PNGs
    and an interactive report.html)."""
    # heavy (torch): imported when the command runs, so `allocator --help` stays instant
    from allocator.recording.schema import utcnow
    from allocator.trainer import MissingExtraError
    from allocator.trainer.jobs.database import checked_engine, record_training_run
    from allocator.trainer.market.data import DataError
    from allocator.trainer.sim.html_report import REPORT_FILE
    from allocator.trainer.sim.performance import format_table
    from allocator.trainer.training.checkpointing import TrainingStoppedError
    from allocator.trainer.training.config import load_config
    from allocator.trainer.training.run import resume as resume_training
    from allocator.trainer.training.run import train as run_training
    from allocator.trainer.training.run_dir import CONFIG_FILE
    from allocator.trainer.training.saturation import collapse_warnings
    from allocator.typed_config import ConfigError

    if resume_dir is not None and run_dir is not None:
        fail("--resume continues the run in its own directory; drop --run-dir")
    started = utcnow()
    try:
        if database_url:
            checked_engine(database_url, ["training_runs"], ConfigError).dispose()
        with graceful_stop("stopping after this step, with a checkpoint (again: at once)") as ask:
            if resume_dir is None:
                config = load_config(config_path, list(overrides))
                run = run_training(config, Path(run_dir) if run_dir else None, stop=ask.event)
            else:
                given = None
                if config_path is not None or overrides:
                    base = config_path or Path(resume_dir) / CONFIG_FILE
                    given = load_config(base, list(overrides))
                run = resume_training(Path(resume_dir), given, stop=ask.event)
                config = run.config
    except (ConfigError, DataError, MissingExtraError) as exc:
        fail(str(exc))
    except TrainingStoppedError as exc:
        click.echo(f"stopped at step {exc.step}: checkpoint {exc.checkpoint}", err=True)
        click.echo(f"continue with `allocator train --resume {exc.run_dir}`", err=True)
        sys.exit(ask.exit_code)
    except KeyboardInterrupt as exc:  # a second signal: no checkpoint beyond the periodic ones
        fail(f"training stopped at once ({exc or 'interrupted'})", interrupted_exit_code(exc))
    summary = run.summary
    click.echo(f"run: {run.run_dir}")
    if database_url:
        row = record_training_run(database_url, run, started)
        click.echo(f"recorded as training run {row} in {shown_url(database_url)}")
    if "resumed_from" in summary:
        click.echo(f"resumed from step {summary['resumed_from'][-1]}")
    click.echo(
        f"{summary['algorithm']}: {summary['timesteps']} steps in "
        f"{summary['train_seconds']} s on {summary['device']}, "
        f"final smoothness lambda {summary['smooth_lambda']:.4g}"
    )
    if "selection" in summary:
        click.echo(f"kept: {summary['selection']['reason']}")
    for line in collapse_warnings(summary):
        click.echo(line)
    click.echo(f"validation {config.data.validation_start} .. {config.data.validation_end}:")
    click.echo(format_table(summary["validation"]))
    if config.html_report:
        click.echo(f"interactive report: {run.run_dir / REPORT_FILE}")
