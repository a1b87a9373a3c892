"""The ``allocator`` command line: one entry point, a subcommand per job.

Heavy libraries are imported inside each command so ``allocator --help`` is instant and a
serving install without the training extras still runs the commands it has.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any, ClassVar

import click

from allocator import __version__
from allocator.artifacts.files import write_json


def _fail(message: str) -> None:
    """Print a clear error and exit with status 2 (bad input), without a traceback."""
    click.echo(f"error: {message}", err=True)
    sys.exit(2)


class _Main(click.Group):
    """Commands defined in other modules are imported only when they are run (or listed)."""

    lazy: ClassVar[dict[str, tuple[str, str]]] = {
        "request": ("allocator.serving.client", "request_command")
    }

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted([*super().list_commands(ctx), *self.lazy])

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name in self.lazy:
            module, attribute = self.lazy[name]
            return getattr(importlib.import_module(module), attribute)
        return super().get_command(ctx, name)


@click.group(cls=_Main, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="allocator")
def main() -> None:
    """Allocator: reinforcement-learning portfolio allocation, from training to serving."""


# --- data --------------------------------------------------------------------------------


@main.group()
def data() -> None:
    """Inspect and validate market data."""


@data.command("info")
@click.option("--dataset", default="sp500", show_default=True, help="'sp500' or a CSV/Parquet path")
def data_info(dataset: str) -> None:
    """Summarize a dataset: calendar, assets, per-asset history and annual figures."""
    from allocator.trainer.market.data import DataError, load_dataset

    try:
        md = load_dataset(dataset)
    except DataError as exc:
        _fail(str(exc))
    click.echo(f"source: {md.source}")
    click.echo(f"dates:  {md.dates[0].date()} .. {md.dates[-1].date()} ({md.n_dates} days)")
    click.echo(f"assets: {md.n_assets}")
    click.echo(md.summary().to_string(float_format=lambda v: f"{v:.4f}"))


@data.command("check")
@click.argument("path", type=click.Path(dir_okay=False))
@click.option("--min-history", default=60, show_default=True, help="fewest closes per asset")
def data_check(path: str, min_history: int) -> None:
    """Validate a long-format price file (date, asset, close); exit 2 naming the first problem."""
    from allocator.trainer.market.data import DataError, load_prices

    try:
        md = load_prices(path, min_history=min_history)
    except DataError as exc:
        _fail(str(exc))
    click.echo(
        f"ok: {path}: {md.n_assets} assets, {md.n_dates} dates "
        f"({md.dates[0].date()} .. {md.dates[-1].date()})"
    )


# --- backtest ----------------------------------------------------------------------------


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


@main.command()
@click.option(
    "--policy",
    "policy_spec",
    default="equal-weight",
    show_default=True,
    help="equal-weight, buy-and-hold, cash, min-variance, hrp, or module:callable",
)
@click.option("--start", default="2010-01-01", show_default=True)
@click.option("--end", default="2019-12-31", show_default=True)
@click.option("--dataset", default="sp500", show_default=True, help="'sp500' or a file path")
@click.option("--assets", default=None, help="comma-separated asset ids (default: all)")
@click.option("--cost-bps", default=10.0, show_default=True, type=float)
@click.option("--beta", default=0.0, show_default=True, type=float, help="EMA smoothing")
@click.option("--json", "json_path", default=None, type=click.Path(dir_okay=False))
@click.option("--plot", "plot_path", default=None, type=click.Path(dir_okay=False))
def backtest(
    policy_spec: str,
    start: str,
    end: str,
    dataset: str,
    assets: str | None,
    cost_bps: float,
    beta: float,
    json_path: str | None,
    plot_path: str | None,
) -> None:
    """Backtest a policy with the environment's mechanics; print metrics, write JSON/plot."""
    from allocator.trainer.market.data import DataError, load_dataset
    from allocator.trainer.sim.backtest import run_backtest
    from allocator.trainer.sim.performance import format_table

    policy = load_policy(policy_spec)
    names = [a.strip() for a in assets.split(",") if a.strip()] if assets else None
    try:
        md = load_dataset(dataset)
        result = run_backtest(policy, md, start, end, assets=names, cost_bps=cost_bps, beta=beta)
    except (DataError, ValueError) as exc:
        _fail(str(exc))
    metrics = result.metrics()
    click.echo(
        f"{result.name} on {md.source}, {result.nav.index[0].date()} .. "
        f"{result.nav.index[-1].date()}, {cost_bps:g} bps"
    )
    click.echo(format_table({result.name: metrics}))
    if json_path:
        write_json(json_path, result.to_dict())
        click.echo(f"wrote {json_path}")
    if plot_path:
        from allocator.trainer.sim.plots import plot_backtest

        plot_backtest(result, plot_path)
        click.echo(f"wrote {plot_path}")


# --- train -------------------------------------------------------------------------------


@main.command()
@click.option(
    "--config",
    "config_path",
    default=None,
    type=click.Path(dir_okay=False),
    help="YAML config (see configs/); defaults when omitted",
)
@click.option(
    "--set",
    "overrides",
    multiple=True,
    metavar="KEY=VALUE",
    help="override a config key, e.g. --set algorithm.smoothness.mode=adaptive",
)
@click.option(
    "--run-dir",
    default=None,
    type=click.Path(file_okay=False),
    help="write the run here instead of output_dir/name-timestamp",
)
def train(config_path: str | None, overrides: tuple[str, ...], run_dir: str | None) -> None:
    """Train a TD3 or SAC policy; write model, audits, logs and a validation backtest."""
    from allocator.trainer.market.data import DataError
    from allocator.trainer.sim.performance import format_table
    from allocator.trainer.training.config import ConfigError, load_config
    from allocator.trainer.training.run import train as run_training

    try:
        config = load_config(config_path, list(overrides))
        run = run_training(config, Path(run_dir) if run_dir else None)
    except (ConfigError, DataError) as exc:
        _fail(str(exc))
    click.echo(f"run: {run.run_dir}")
    click.echo(
        f"{run.summary['algorithm']}: {run.summary['total_timesteps']} steps in "
        f"{run.summary['train_seconds']} s on {run.summary['device']}, "
        f"final smoothness lambda {run.summary['smooth_lambda']:.4g}"
    )
    click.echo(f"validation {config.data.validation_start} .. {config.data.validation_end}:")
    click.echo(format_table(run.summary["validation"]))


# --- checkpoints -------------------------------------------------------------------------


@main.group()
def checkpoint() -> None:
    """Inspect and migrate training checkpoints (run directories)."""


@checkpoint.command("inspect")
@click.argument("run_dir", type=click.Path(file_okay=False, exists=True))
@click.option("--json", "as_json", is_flag=True, help="print the raw manifest JSON")
def checkpoint_inspect(run_dir: str, as_json: bool) -> None:
    """Print a checkpoint's manifest readably and check its files' sha256."""
    import json

    from allocator.artifacts.manifest import ManifestError, read_manifest, verify_checksums
    from allocator.trainer.checkpoints.manifest import describe

    try:
        manifest = read_manifest(run_dir)
    except ManifestError as exc:
        _fail(str(exc))
    if as_json:
        click.echo(json.dumps(manifest.model_dump(mode="json"), indent=2))
    else:
        click.echo(describe(manifest))
    try:
        verify_checksums(run_dir, manifest)
    except ManifestError as exc:
        _fail(str(exc))
    click.echo("checksums ok")


@checkpoint.command("migrate")
@click.argument("run_dir", type=click.Path(file_okay=False))
@click.option(
    "--to-version", type=int, default=None, help="target schema version (default: the current)"
)
@click.option(
    "--max-assets",
    type=int,
    default=None,
    help="widen the policy to this many asset slots (new slots start masked)",
)
def checkpoint_migrate(run_dir: str, to_version: int | None, max_assets: int | None) -> None:
    """Upgrade a run directory to the current manifest schema, or widen it; backs it up first."""
    from allocator.artifacts.manifest import SCHEMA_VERSION
    from allocator.trainer.checkpoints.upgrade import MigrationError, run_migration

    try:
        result = run_migration(
            run_dir, SCHEMA_VERSION if to_version is None else to_version, max_assets
        )
    except MigrationError as exc:
        _fail(str(exc))
    probe = result.probe
    click.echo(f"migrated {result.run_dir}: schema v{result.from_version} -> v{result.to_version}")
    click.echo(f"backup: {result.backup}")
    if result.widened_from is None:
        click.echo(
            f"probe: {probe.observations} observations, max |action diff| "
            f"{probe.float32_max_diff:g}"
        )
        return
    icm = probe.icm_canonical_max_diff
    click.echo(
        f"widened: max_assets {result.widened_from} -> {result.manifest.max_assets} "
        f"(new slots start masked; their action {probe.new_slot_max_action:g})"
    )
    click.echo(
        f"probe: {probe.observations} observations over {probe.masks} masks of the old slots; "
        f"canonical float64 max |diff| actor {probe.canonical_max_diff:g}, "
        f"critics {probe.critic_canonical_max_diff:g}"
        + (f", icm {icm:g}" if icm is not None else "")
        + f"; float32 predict max |diff| {probe.float32_max_diff:.3g}"
    )


# --- export ------------------------------------------------------------------------------


@main.command("export")
@click.argument("run_dir", type=click.Path(file_okay=False))
@click.option(
    "--registry",
    required=True,
    type=click.Path(file_okay=False),
    help="model registry root, e.g. models/ (versions go to REGISTRY/NAME/VERSION)",
)
@click.option("--name", default=None, help="registry name (default: the run's manifest name)")
@click.option("--version", default=None, help="registry version (default: the next integer)")
def export(run_dir: str, registry: str, name: str | None, version: str | None) -> None:
    """Export a run to ONNX (policy, and curiosity if trained with it), checked against torch."""
    from allocator.artifacts.manifest import read_manifest
    from allocator.trainer.export.run import ExportError, export_run, format_parity

    try:
        out = export_run(run_dir, registry, name=name, version=version)
    except ExportError as exc:
        _fail(str(exc))
    info = read_manifest(out).export or {}
    click.echo(f"exported: {out} (opset {info.get('opset')})")
    click.echo("parity with torch (max abs difference):")
    click.echo(format_parity(info.get("parity", {})))


# --- demo --------------------------------------------------------------------------------


@main.command()
@click.option("--out", default="runs/demo", show_default=True, type=click.Path(file_okay=False))
@click.option("--start", default="2010-01-01", show_default=True)
@click.option("--end", default="2019-12-31", show_default=True)
@click.option("--cost-bps", default=10.0, show_default=True, type=float)
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
    default="configs/td3_demo.yaml",
    show_default=True,
    help="training config for the demo (defaults are used if the file is absent)",
)
def demo(out: str, start: str, end: str, cost_bps: float, do_train: bool, config_path: str) -> None:
    """The first run on a new machine: baselines, then train -> export on the embedded data."""
    from allocator.trainer.market.data import load_sp500
    from allocator.trainer.sim.backtest import run_backtest
    from allocator.trainer.sim.baselines import BaselineName
    from allocator.trainer.sim.performance import format_table
    from allocator.trainer.sim.plots import plot_allocations, plot_performance

    md = load_sp500()
    click.echo(
        f"data: {md.source}, {md.n_assets} assets; backtest {start} .. {end}, "
        f"{cost_bps:g} bps costs"
    )
    results = {}
    for name in BaselineName:
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
        _demo_train_and_export(out_dir, config_path)
        from allocator.serving.demo import serve_demo

        click.echo("")
        serve_demo(out_dir / "models", out_dir, md.prices, md.assets, echo=click.echo)
        _demo_walk_forward(out_dir)


def _demo_walk_forward(out_dir: Path) -> None:
    """Two tiny walk-forward windows, recorded in the demo's SQLite file, with a report."""
    from allocator.trainer.jobs.report import format_summary
    from allocator.trainer.jobs.walk_forward import load_walk_forward_config, run_walk_forward

    path = Path("configs/walk_forward_tiny.yaml")
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


def _demo_train_and_export(out_dir: Path, config_path: str) -> None:
    """Train the demo config, export it to ``out_dir/models`` and print the ONNX parity."""
    from allocator.artifacts.manifest import read_manifest
    from allocator.trainer.export.run import PARITY_TOLERANCE, export_run, format_parity
    from allocator.trainer.sim.performance import format_table
    from allocator.trainer.training.config import load_config
    from allocator.trainer.training.run import train as run_training

    path = config_path if Path(config_path).is_file() else None
    config = load_config(path, [])
    click.echo("")
    click.echo(
        f"training {config.algorithm.name} ({path or 'default config'}), "
        f"{config.total_timesteps} steps ..."
    )
    run_dir = out_dir / "run"
    if run_dir.exists():
        import shutil

        shutil.rmtree(run_dir)
    run = run_training(config, run_dir)
    click.echo(f"validation {config.data.validation_start} .. {config.data.validation_end}:")
    click.echo(format_table(run.summary["validation"]))
    version_dir = export_run(run.run_dir, out_dir / "models", name="demo")
    exported = read_manifest(version_dir)
    click.echo("")
    click.echo(f"exported to {version_dir}")
    parity = (exported.export or {}).get("parity", {})
    click.echo(f"ONNX vs torch, max abs difference (export fails above {PARITY_TOLERANCE:g}):")
    click.echo(format_parity(parity))


_database_url_option = click.option(
    "--database-url",
    default=None,
    help="SQLAlchemy URL (default: $DATABASE_URL, else sqlite:///allocator.db)",
)


# --- serve -------------------------------------------------------------------------------


@main.command()
@click.option("--registry", required=True, type=click.Path(file_okay=False), help="model registry")
@click.option("--host", default="127.0.0.1", show_default=True, help="address to bind")
@click.option("--port", default=50051, show_default=True, help="gRPC port (0: any free port)")
@click.option("--metrics-port", default=9464, show_default=True, help="Prometheus /metrics port")
@_database_url_option
@click.option("--no-record", is_flag=True, help="do not record decisions (experiments only)")
@click.option("--spool-dir", default="spool", show_default=True, help="recorder's durable spool")
@click.option("--redis-url", default=None, help="share smoothing state between replicas")
@click.option("--auth-token-file", default=None, help="require this bearer token")
@click.option("--tls-cert", default=None, help="server certificate (PEM)")
@click.option("--tls-key", default=None, help="server private key (PEM)")
@click.option("--tls-client-ca", default=None, help="require client certificates (mTLS)")
@click.option("--latency-budget-ms", default=10.0, show_default=True, help="P95 budget")
@click.option("--max-concurrent-rpcs", default=64, show_default=True)
@click.option("--workers", default=8, show_default=True, help="handler threads")
@click.option("--model", "default_model", default=None, help="model answering unpinned calls")
@click.option("--reload-interval", default=2.0, show_default=True, help="registry scan period")
@click.option("--cpu", is_flag=True, help="never try onnxruntime's CUDA provider")
@click.option("--spool-quota-bytes", type=int, default=None, help="spool size that refuses calls")
@click.option("--idempotency-cache", type=int, default=None, help="answers kept for retries")
@click.option("--grace-seconds", type=float, default=None, help="SIGTERM: time for calls")
@click.option("--drain-seconds", type=float, default=None, help="SIGTERM: wait for quiet")
def serve(**options: Any) -> None:
    """Serve allocations over gRPC until SIGTERM/SIGINT (then drain and flush the recorder)."""
    import logging
    import signal
    import threading

    from pydantic import ValidationError

    from allocator.recording.sinks import SchemaMissingError
    from allocator.serving.loader import ModelLoadError
    from allocator.serving.server import ServerConfig, build_server

    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    options["record"] = not options.pop("no_record")
    options["prefer_cuda"] = not options.pop("cpu")
    try:
        config = ServerConfig(**{k: v for k, v in options.items() if v is not None})
        server = build_server(config)
    except ValidationError as exc:
        _fail("; ".join(f"--{'-'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()))
    except (ModelLoadError, SchemaMissingError, ValueError, OSError) as exc:
        _fail(str(exc))
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    server.start()
    click.echo(f"serving on {server.target} (metrics on port {server.metrics_port})", err=True)
    stop.wait()
    click.echo("draining: health NOT_SERVING, finishing calls, flushing the recorder", err=True)
    server.stop()


# --- db ----------------------------------------------------------------------------------


def _alembic_config(database_url: str | None) -> Any:
    """An alembic Config for the repository's migrations, bound to the chosen database URL."""
    from allocator.recording.migrations import MigrationsNotFoundError, alembic_config

    try:
        return alembic_config(database_url, stdout=sys.stdout)  # the stream in use now
    except MigrationsNotFoundError as exc:
        _fail(f"{exc}")


def _shown_url(config: Any) -> str:
    """The URL with any password masked, for messages."""
    from sqlalchemy.engine import make_url

    return make_url(config.attributes["url"]).render_as_string(hide_password=True)


@main.group()
def db() -> None:
    """Migrate the trade database (alembic; migrations ship with the repository checkout)."""


@db.command("upgrade")
@click.argument("revision", default="head")
@_database_url_option
def db_upgrade(revision: str, database_url: str | None) -> None:
    """Upgrade the trade schema to REVISION (default: head)."""
    from alembic import command

    config = _alembic_config(database_url)
    command.upgrade(config, revision)
    click.echo(f"upgraded {_shown_url(config)} to {revision}")


@db.command("downgrade")
@click.argument("revision")
@_database_url_option
def db_downgrade(revision: str, database_url: str | None) -> None:
    """Downgrade the trade schema to REVISION ('base' removes it all)."""
    from alembic import command

    config = _alembic_config(database_url)
    command.downgrade(config, revision)
    click.echo(f"downgraded {_shown_url(config)} to {revision}")


@db.command("current")
@_database_url_option
def db_current(database_url: str | None) -> None:
    """Print the revision the trade database is at (nothing when it has none)."""
    from alembic import command

    config = _alembic_config(database_url)
    click.echo(f"database: {_shown_url(config)}")
    command.current(config)


# --- retrain -----------------------------------------------------------------------------


@main.command()
@click.option(
    "--config",
    "config_path",
    required=True,
    type=click.Path(dir_okay=False),
    help="retraining YAML (see configs/retrain.yaml)",
)
@click.option(
    "--set",
    "overrides",
    multiple=True,
    metavar="KEY=VALUE",
    help="override a key, e.g. --set gates.max_turnover=0.05 --set trainer.seed=1",
)
@click.option("--as-of", default=None, help="retrain as of this date (default: the data's last)")
def retrain(config_path: str, overrides: tuple[str, ...], as_of: str | None) -> None:
    """Train on the latest window; promote the candidate only if every gate passes.

    Exit 0 when a decision was made (promoted or not), 2 on a bad config or data, 1 when the
    job could not reach a decision (database, registry, export).
    """
    from allocator.artifacts.manifest import ManifestError
    from allocator.serving.loader import ModelLoadError
    from allocator.trainer.export.run import ExportError
    from allocator.trainer.jobs.retrain import RetrainError, load_retrain_config
    from allocator.trainer.jobs.retrain import retrain as run_retrain
    from allocator.trainer.market.data import DataError
    from allocator.trainer.training.config import ConfigError

    try:
        config = load_retrain_config(config_path, list(overrides))
    except ConfigError as exc:
        _fail(str(exc))
    try:
        decision = run_retrain(config, as_of, echo=click.echo)
    except (ConfigError, DataError) as exc:
        _fail(str(exc))
    except (RetrainError, ExportError, ModelLoadError, ManifestError, OSError) as exc:
        click.echo(f"error: retraining failed, production unchanged: {exc}", err=True)
        sys.exit(1)
    click.echo("")
    click.echo(decision.summary())
    if decision.push_error:
        click.echo(f"warning: {decision.push_error}", err=True)


# --- walk-forward ------------------------------------------------------------------------


@main.command("walk-forward")
@click.option(
    "--config",
    "config_path",
    required=True,
    type=click.Path(dir_okay=False),
    help="walk-forward YAML (see configs/walk_forward.yaml)",
)
@click.option(
    "--executor",
    type=click.Choice(["local", "ray"]),
    default=None,
    help="run windows in this process or as Ray tasks (default: the config's)",
)
@click.option("--ray-address", default=None, help="join this Ray cluster (implies --executor ray)")
@click.option(
    "--set",
    "overrides",
    multiple=True,
    metavar="KEY=VALUE",
    help="override a key, e.g. --set trainer.total_timesteps=1000 --set windows.purge_days=10",
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
    from allocator.artifacts.manifest import ManifestError
    from allocator.serving.loader import ModelLoadError
    from allocator.trainer.export.run import ExportError
    from allocator.trainer.jobs.report import format_summary
    from allocator.trainer.jobs.walk_forward import (
        WalkForwardError,
        load_walk_forward_config,
        run_walk_forward,
    )
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
        _fail(str(exc))
    try:
        result = run_walk_forward(config, out_dir=out, progress=progress)
    except (ConfigError, DataError, WindowError) as exc:
        _fail(str(exc))
    except (WalkForwardError, ExportError, ModelLoadError, ManifestError, OSError) as exc:
        click.echo(f"error: walk-forward failed: {exc}", err=True)
        sys.exit(1)
    click.echo(f"{len(result.windows)} windows in {result.seconds:.1f} s ({config.executor})")
    click.echo(format_summary(result.summary))
    if result.run_id is not None:
        from sqlalchemy.engine import make_url

        shown = make_url(str(result.database_url)).render_as_string(hide_password=True)
        click.echo(f"recorded: walk-forward run {result.run_id} in {shown}")
    click.echo(f"summary: {result.files['summary']}")
    click.echo(f"report:  {result.files['report']}")
    if result.push_error:
        click.echo(f"error: {result.push_error}", err=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
