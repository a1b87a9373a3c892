"""``allocator retrain``, ``allocator walk-forward`` and ``allocator tune``: the batch jobs,
each read from a job YAML (``--config``, adjusted by ``--set``); their help gives the exit codes."""

from __future__ import annotations

from pathlib import Path
from typing import NoReturn

import click

from allocator.cli.options import (
    config_option,
    emit_json,
    fail,
    failing,
    graceful_stop,
    interrupted_exit_code,
    json_options,
    overrides_option,
    sigterm_stops,
)
from allocator.recording.settings import shown_url


@click.command()
@config_option("retraining YAML (see configs/retrain.yaml)", required=True)
@overrides_option("override a key, e.g. --set gates.max_turnover=0.05 --set trainer.seed=1")
@click.option("--as-of", help="retrain as of this date (default: the data's last)")
def retrain(config_path: str, overrides: tuple[str, ...], as_of: str | None) -> None:
    """Train on the latest window; promote the candidate only if every gate passes.

    Exit 0 when a decision was made (promoted or not), 2 on a bad config or data, 1 when the
    job could not reach a decision (database, registry, export). SIGTERM or Ctrl-C while it
    trains ends it after that step with no decision (143 or 130); later, the decision
    finishes first. A second signal stops it at once.
    """
    # heavy (torch, onnxruntime, sqlalchemy): imported when the command runs, keeps --help instant
    from allocator.artifacts.manifest import ManifestError
    from allocator.registry.errors import ModelLoadError
    from allocator.trainer import MissingExtraError
    from allocator.trainer.export.errors import ExportError
    from allocator.trainer.jobs.retrain.config import RetrainError, load_retrain_config
    from allocator.trainer.jobs.retrain.runner import retrain as run_retrain
    from allocator.trainer.market.data import DataError
    from allocator.trainer.training.checkpointing import TrainingStoppedError
    from allocator.typed_config import ConfigError

    with failing(ConfigError):
        config = load_retrain_config(config_path, list(overrides))
    try:
        with graceful_stop(
            "stopping after this training step, with no decision (again: at once)"
        ) as ask:
            decision = run_retrain(config, as_of, echo=click.echo, stop=ask.event)
    except (ConfigError, DataError, MissingExtraError) as exc:
        fail(str(exc))
    except TrainingStoppedError as exc:
        fail(f"retraining stopped at step {exc.step}, production unchanged", ask.exit_code)
    except KeyboardInterrupt as exc:  # a second signal
        fail(f"retraining stopped at once ({exc or 'interrupted'})", interrupted_exit_code(exc))
    except (RetrainError, ExportError, ModelLoadError, ManifestError, OSError) as exc:
        fail(f"retraining failed, production unchanged: {exc}", 1)
    click.echo("")
    click.echo(decision.summary())
    if decision.push_error:
        click.echo(f"warning: {decision.push_error}", err=True)


@click.group("walk-forward", invoke_without_command=True)
@config_option("walk-forward YAML (see configs/walk_forward.yaml); required to run", required=False)
@click.option(
    "--executor",
    type=click.Choice(["local", "processes", "ray"]),
    help="run windows in this process, in worker processes (workers=N) or as Ray tasks "
    "(default: the config's)",
)
@click.option("--ray-address", help="join this Ray cluster (implies --executor ray)")
@overrides_option(
    "override a key, e.g. --set trainer.total_timesteps=1000 --set windows.purge_days=10"
)
@click.option(
    "--out",
    type=click.Path(file_okay=False),
    help="write runs, summary.json, returns.csv and report/ (report.md with its PNGs, and the "
    "interactive report.html) here (default: output_dir/name-label)",
)
@click.option(
    "--resume",
    "resume_dir",
    type=click.Path(exists=True, file_okay=False),
    help="finish the killed or failed run in this directory: finished windows are kept, the "
    "others run again (its own config unless --config is given; only --executor, "
    "--ray-address and keys such as retries or progress_every may differ)",
)
@click.option("--progress/--no-progress", default=True, show_default=True)
@click.pass_context
def walk_forward(
    ctx: click.Context,
    config_path: str | None,
    executor: str | None,
    ray_address: str | None,
    overrides: tuple[str, ...],
    out: str | None,
    resume_dir: str | None,
    progress: bool,
) -> None:
    """Walk-forward validation: per window train, export, backtest the export vs baselines.

    With --config, run one: exit 0 when every window ran and was recorded, 2 on a bad config
    or data, 1 when a window or the recording failed, or when the Pushgateway push failed (rows
    and report are written). With --resume RUN_DIR, finish a run that was killed or failed,
    without retraining its finished windows.
    """
    if ctx.invoked_subcommand is not None:
        if config_path or executor or ray_address or overrides or out or resume_dir:
            fail(
                f"--config, --set, --executor, --out and --resume run a walk-forward, not "
                f"{ctx.invoked_subcommand!r}"
            )
        return
    if resume_dir is not None and out is not None:
        fail("--resume continues the run in its own directory; leave out --out")
    if config_path is None and resume_dir is None:
        fail(
            "Missing option '--config' (the walk-forward YAML to run), --resume RUN_DIR, or a "
            "command: status RUN_DIR, stats RUN_DIR"
        )
    extra = list(overrides)
    if ray_address:
        extra += ["executor=ray", f"ray_address={ray_address}"]
    elif executor:
        extra.append(f"executor={executor}")
    run_walk_forward_command(config_path, extra, out, resume_dir, progress)


def run_walk_forward_command(
    config_path: str | None,
    overrides: list[str],
    out: str | None,
    resume_dir: str | None,
    progress: bool,
) -> None:
    """``allocator walk-forward --config ... | --resume RUN_DIR``: run (or finish) one, then
    print the summary and the tests."""
    # heavy (torch, onnxruntime, sqlalchemy): imported when the command runs, keeps --help instant
    from allocator.artifacts.manifest import ManifestError
    from allocator.registry.errors import ModelLoadError
    from allocator.trainer import MissingExtraError
    from allocator.trainer.export.errors import ExportError
    from allocator.trainer.jobs.run_folder import make_label, run_directory
    from allocator.trainer.jobs.walk_forward.config import (
        WalkForwardError,
        load_walk_forward_config,
    )
    from allocator.trainer.jobs.walk_forward.report import format_statistics, format_summary
    from allocator.trainer.jobs.walk_forward.rundir import STATE_FILE, ResumeError
    from allocator.trainer.jobs.walk_forward.runner import resume_walk_forward, run_walk_forward
    from allocator.trainer.market.data import DataError
    from allocator.trainer.market.windows import WindowError
    from allocator.typed_config import ConfigError

    with failing(ConfigError):
        config = load_walk_forward_config(config_path, overrides) if config_path else None
    label = make_label()
    if resume_dir is None:
        assert config is not None  # the group refuses neither --config nor --resume
        run_dir = run_directory(config.output_dir, config.name, out, label)
    else:
        run_dir = Path(resume_dir)

    def stopped(message: str, code: int) -> NoReturn:
        if (run_dir / STATE_FILE).is_file():
            message += (
                f"\nfinished windows are kept: `allocator walk-forward --resume {run_dir}` "
                "continues the run"
            )
        fail(message, code)

    try:
        with sigterm_stops():
            if resume_dir is None:
                assert config is not None
                result = run_walk_forward(config, out_dir=run_dir, label=label, progress=progress)
            else:
                rest = overrides if config is None else ()
                result = resume_walk_forward(run_dir, config, rest, progress=progress)
    except (ConfigError, DataError, WindowError, ResumeError, MissingExtraError) as exc:
        fail(str(exc))
    except KeyboardInterrupt as exc:  # the running windows' processes were ended on the way out
        stopped(f"walk-forward stopped ({exc or 'interrupted'})", interrupted_exit_code(exc))
    except (WalkForwardError, ExportError, ModelLoadError, ManifestError, OSError) as exc:
        stopped(f"walk-forward failed: {exc}", 1)
    config = result.config
    click.echo(f"{len(result.windows)} windows in {result.seconds:.1f} s ({config.executor})")
    click.echo(format_summary(result.summary))
    click.echo("")
    click.echo(format_statistics(result.summary["statistics"]))
    if result.run_id is not None:
        shown = shown_url(str(result.database_url))
        click.echo(f"recorded: walk-forward run {result.run_id} in {shown}")
    for key in ("summary", "returns", "report", "html"):
        if key in result.files:
            click.echo(f"{key + ':':<8} {result.files[key]}")
    if result.push_error:
        fail(str(result.push_error), 1)


@walk_forward.command("status")
@click.argument("run_dir", type=click.Path(exists=True, file_okay=False))
@json_options
def walk_forward_status(run_dir: str, as_json: bool, json_out: str | None) -> None:
    """How far the walk-forward run in RUN_DIR is: each window done, running (its training
    steps, last reward, inner score), stopped (its process is gone) or waiting.

    Reads only RUN_DIR's files, while the run goes on or after it stopped. Exit 2 when RUN_DIR
    is not a walk-forward run directory.
    """
    # heavy (pandas, torch via the window modules): imported when the command runs
    from allocator.trainer.jobs.walk_forward.config import WalkForwardError
    from allocator.trainer.jobs.walk_forward.progress import format_status, status_report

    with failing(WalkForwardError):
        if as_json or json_out:
            emit_json(status_report(run_dir), as_json, json_out)
        if not as_json:
            click.echo(format_status(run_dir))


@walk_forward.command("stats")
@click.argument("run_dir", type=click.Path(exists=True, file_okay=False))
@click.option(
    "--configurations-tried",
    type=click.IntRange(min=1),
    help="configurations tried, this one included, for the deflated Sharpe (default: the "
    "run's configurations_tried, else 1)",
)
@click.option(
    "--trials-sharpe-variance",
    type=click.FloatRange(min=0),
    help="annualized variance of those configurations' Sharpe ratios (default: the run's, "
    "else a zero-Sharpe span's sampling variance)",
)
@click.option(
    "--baseline",
    "baselines",
    multiple=True,
    help="also judge the run against this baseline, backtested now on each window's test "
    "span (repeatable; e.g. anchor: a tilt recipe's zero action)",
)
@json_options
def walk_forward_stats(
    run_dir: str,
    configurations_tried: int | None,
    trials_sharpe_variance: float | None,
    baselines: tuple[str, ...],
    as_json: bool,
    json_out: str | None,
) -> None:
    """Intervals and tests of a finished walk-forward run in RUN_DIR.

    Reads RUN_DIR/returns.csv. A --baseline the run did not record is backtested on the same
    assets and costs and joined to them. Nothing is written into RUN_DIR. Exit 2 when RUN_DIR
    is not a finished run or a baseline is unknown, 1 when a window cannot be replayed.
    """
    # heavy (pandas, arch, onnxruntime): imported when the command runs, keeps --help instant
    from allocator.registry.errors import ModelLoadError
    from allocator.trainer.jobs.walk_forward.config import StatisticsSettings, WalkForwardError
    from allocator.trainer.jobs.walk_forward.report import format_statistics
    from allocator.trainer.jobs.walk_forward.rundir import RETURNS_FILE, read_returns, read_summary
    from allocator.trainer.jobs.walk_forward.summary import run_statistics
    from allocator.trainer.jobs.walk_forward.window import with_baselines
    from allocator.trainer.market.data import DataError
    from allocator.typed_config import ConfigError

    returns_path = Path(run_dir) / RETURNS_FILE
    with failing(WalkForwardError, ValueError):
        summary = read_summary(run_dir)
        frame = read_returns(returns_path)
    recorded = summary["summary"].get("statistics", {}).get("settings", {})
    fields = StatisticsSettings.model_fields
    settings = StatisticsSettings(**{k: v for k, v in recorded.items() if k in fields})
    if trials_sharpe_variance is not None:
        settings = settings.model_copy(update={"trials_sharpe_variance": trials_sharpe_variance})
    tried = configurations_tried or int(summary.get("configurations_tried", 1))
    source = str(returns_path)
    try:
        if baselines:
            frame = with_baselines(run_dir, frame, baselines)
            source += f", with {', '.join(baselines)} backtested now"
    except (ConfigError, DataError, ValueError) as exc:
        fail(str(exc))
    except (WalkForwardError, ModelLoadError, OSError) as exc:
        fail(f"cannot rebuild the daily returns of {run_dir}: {exc}", 1)
    stats = run_statistics(frame, settings, tried)
    if not as_json:
        click.echo(f"daily returns: {source}")
        click.echo(format_statistics(stats))
    emit_json({"run_dir": run_dir, "returns": source, **stats}, as_json, json_out)


@walk_forward.command("seeds")
@click.argument("run_dirs", nargs=-1, required=True, type=click.Path(exists=True, file_okay=False))
@json_options
def walk_forward_seeds(run_dirs: tuple[str, ...], as_json: bool, json_out: str | None) -> None:
    """Seed luck apart from period luck, from finished runs of one recipe that differ only
    in their seed (run the same config with --set seed=100, --set seed=200, ...).

    Per window each seed's excess Sharpe over equal weight; the variance of those split into
    seed and period parts; each seed's pooled excess Sharpe with its interval; the
    equal-capital mix of the seeds. Reads RUN_DIR/returns.csv and walk_forward.json only.
    Exit 2 when the runs are not one recipe with distinct seeds.
    """
    # heavy (pandas, arch): imported when the command runs, keeps --help instant
    from allocator.trainer.jobs.walk_forward.config import WalkForwardError
    from allocator.trainer.jobs.walk_forward.seeds import format_seed_study, seed_study

    with failing(WalkForwardError, ValueError):
        study = seed_study(run_dirs)
    if not as_json:
        click.echo(format_seed_study(study))
    emit_json(study, as_json, json_out)


@click.command()
@config_option("tuning YAML (see configs/tune.yaml)", required=True)
@overrides_option("override a key, e.g. --set n_trials=4 --set trainer.total_timesteps=2000")
@click.option(
    "--executor",
    type=click.Choice(["local", "ray"]),
    help="train trials in this process or as Ray tasks (default: the config's)",
)
@click.option(
    "--out",
    type=click.Path(file_okay=False),
    help="write the study, trials/, trials.csv, best.yaml and tune.json here "
    "(default: output_dir/name-label)",
)
@click.option("--progress/--no-progress", default=True, show_default=True)
def tune(
    config_path: str,
    overrides: tuple[str, ...],
    executor: str | None,
    out: str | None,
    progress: bool,
) -> None:
    """Search trainer settings with Optuna, scoring each trial on the inner span only.

    No trial reads a price after the trainer's data.train_end. Exit 0 when a trial completed
    (best.yaml written), 2 on a bad config or data, 1 when no trial completed; SIGTERM (143)
    or Ctrl-C (130) stop it with the finished trials summarized.
    """
    # heavy (optuna, torch): imported when the command runs, keeps --help instant
    from allocator.trainer import MissingExtraError, require_extra

    with failing(MissingExtraError):
        optuna = require_extra("optuna", "tune", "allocator tune")
    # the tuner (torch, SB3, ray) likewise: imported only when a study runs
    from allocator.trainer.jobs.tuning.config import TuneError, load_tune_config
    from allocator.trainer.jobs.tuning.runner import run_tuning
    from allocator.trainer.market.data import DataError
    from allocator.typed_config import ConfigError

    extra = [*overrides, f"executor={executor}"] if executor else list(overrides)
    with failing(ConfigError):
        config = load_tune_config(config_path, extra)
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # the progress bar says it shorter
    try:
        with sigterm_stops():
            result = run_tuning(config, out_dir=out, progress=progress)
    except (ConfigError, DataError, MissingExtraError) as exc:
        fail(str(exc))
    except KeyboardInterrupt as exc:  # the study's files were written on the way out
        fail(
            "tuning stopped; trials.csv, tune.json and (when a trial completed) best.yaml cover "
            "the trials that finished, the running ones are marked FAIL",
            interrupted_exit_code(exc),
        )
    except (TuneError, OSError) as exc:
        fail(f"tuning failed: {exc}", 1)
    summary = result.summary
    states = ", ".join(f"{n} {s.lower()}" for s, n in summary["states"].items())
    click.echo(
        f"{summary['n_trials']} trials ({states}) in {result.seconds:.1f} s ({config.executor})"
    )
    click.echo(f"configurations tried: {summary['configurations_tried']}")
    if summary["stopped"]:
        click.echo(f"stopped early: {summary['stopped']}")
    click.echo(f"trials:  {result.files['trials']}")
    click.echo(f"summary: {result.files['summary']}")
    best = result.best
    if best is None:
        fail("no trial completed; nothing to keep", 1)
    click.echo(f"best: trial {best['number']}, inner score {best['value']:.4g}")
    for key, value in best["params"].items():
        click.echo(f"  {key} = {value}")
    click.echo(f"best config: {result.files['best']}")
