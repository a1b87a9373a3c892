"""``allocator serve``: the gRPC server, until SIGTERM/SIGINT. Every option is a
``ServerConfig`` field (``NAMED_FLAGS``: those whose flag has another name)."""

from __future__ import annotations

import logging
import signal
from typing import Any

import click

from allocator.cli.options import database_url_option, fail, failing


@click.command()
@click.option(
    "--config",
    "config_file",
    default=None,
    type=click.Path(dir_okay=False),
    help="YAML file of settings (ServerConfig fields); flags and ALLOCATOR_* override it",
)
@click.option(
    "--registry",
    default=None,
    type=click.Path(file_okay=False),
    help="model registry (required: here, $ALLOCATOR_REGISTRY or the --config file)",
)
@click.option("--host", default=None, help="address to bind (default 127.0.0.1)")
@click.option("--port", type=int, default=None, help="gRPC port (default 50051; 0: any free)")
@click.option("--metrics-port", type=int, default=None, help="Prometheus port (default 9464)")
@database_url_option
@click.option("--no-record", is_flag=True, help="do not record decisions (experiments only)")
@click.option("--spool-dir", default=None, help="recorder's durable spool (default spool)")
@click.option("--redis-url", default=None, help="share smoothing state between replicas")
@click.option("--auth-token-file", default=None, help="require this bearer token")
@click.option("--tls-cert", default=None, help="server certificate (PEM)")
@click.option("--tls-key", default=None, help="server private key (PEM)")
@click.option("--tls-client-ca", default=None, help="require client certificates (mTLS)")
@click.option(
    "--latency-budget-ms", type=float, default=None, help="P95 budget per decision (default 10)"
)
@click.option("--max-concurrent-rpcs", type=int, default=None, help="(default 64)")
@click.option(
    "--threads", type=int, default=None, help="state-store threads per process (default 8)"
)
@click.option(
    "--workers",
    type=int,
    default=None,
    help="server processes sharing the port (Linux, default 1); more than 1 needs --redis-url",
)
@click.option("--model", "default_model", default=None, help="model answering unpinned calls")
@click.option(
    "--reload-interval", type=float, default=None, help="registry scan period (default 2 s)"
)
@click.option("--cpu", is_flag=True, help="never try onnxruntime's CUDA provider")
@click.option("--spool-quota-bytes", type=int, default=None, help="spool size that refuses calls")
@click.option(
    "--ack",
    type=click.Choice(["durable", "queued"]),
    default=None,
    help="OK once the decision is durable (default), or once queued: faster, but a crash "
    "loses the last ~20 ms of answered decisions",
)
@click.option(
    "--batch-window-ms",
    type=float,
    default=None,
    help="calls arriving this close are decided and committed together (default 0.2)",
)
@click.option(
    "--batch-max-decisions", type=int, default=None, help="decisions per batch (default 256)"
)
@click.option(
    "--idempotency-cache",
    type=int,
    default=None,
    help="request ids remembered to refuse a reused one (answers live in the state)",
)
@click.option("--grace-seconds", type=float, default=None, help="SIGTERM: time for calls")
@click.option("--drain-seconds", type=float, default=None, help="SIGTERM: wait for quiet")
@click.option(
    "--max-connection-age-seconds",
    type=float,
    default=None,
    help="close client connections after this long (default 300), so new replicas get traffic",
)
@click.option(
    "--max-connection-age-grace-seconds",
    type=float,
    default=None,
    help="calls on a closing connection get this long (default 30)",
)
def serve(config_file: str | None, **options: Any) -> None:
    """Serve allocations over gRPC until SIGTERM/SIGINT (then drain and flush the recorder).

    Each setting comes from its flag, else ALLOCATOR_<SETTING> (ALLOCATOR_PORT,
    ALLOCATOR_DATABASE_URL, ...), else the --config file, else its default; the database URL
    then falls back to $DATABASE_URL.
    """
    # heavy (onnxruntime, grpc, sqlalchemy): imported when the command runs, keeps --help instant
    from allocator.recording.sinks import SchemaMissingError
    from allocator.registry.errors import ModelLoadError
    from allocator.serving.config import load_server_config
    from allocator.serving.server import build_server
    from allocator.serving.stop_signals import StopSignals

    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    with failing(ModelLoadError, SchemaMissingError, ValueError, OSError):
        config = load_server_config(server_flags(options), config_file, flag_names=NAMED_FLAGS)
        if config.workers > 1:
            _supervise(config)
            return
        # before the model load: a SIGTERM during it drains the server once started
        stop = StopSignals()
        server = build_server(config)
    server.start()
    click.echo(f"serving on {server.target} (metrics on port {server.metrics_port})", err=True)
    stop.wait()
    click.echo("draining: health NOT_SERVING, finishing calls, flushing the recorder", err=True)
    server.stop()


NAMED_FLAGS = {"default_model": "--model", "record": "--no-record", "prefer_cuda": "--cpu"}
"""Settings whose flag is not ``--<setting>``: errors name the flag the user typed."""


def server_flags(options: dict[str, Any]) -> dict[str, Any]:
    """The ServerConfig fields given on the command line: an unset flag leaves the setting to
    the environment, the file or the default (``--no-record``/``--cpu`` only switch off)."""
    flags = {k: v for k, v in options.items() if v is not None and k not in ("no_record", "cpu")}
    if options.get("no_record"):
        flags["record"] = False
    if options.get("cpu"):
        flags["prefer_cuda"] = False
    return flags


def _supervise(config: Any) -> None:
    """``--workers N`` > 1: the supervisor (``serving.workers``) until SIGTERM/SIGINT."""
    from allocator.serving.workers import Supervisor  # with the server's imports: when run

    supervisor = Supervisor(config)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: supervisor.stop())
    with failing(RuntimeError):
        supervisor.start()
    click.echo(
        f"serving on {supervisor.target} (metrics on port {supervisor.metrics_port}), "
        f"{config.workers} workers",
        err=True,
    )
    supervisor.run()
    click.echo(
        "draining: every worker NOT_SERVING, finishing calls, flushing its recorder", err=True
    )
    if not supervisor.drain():
        fail("a worker did not drain cleanly (see above)")
    click.echo("allocation server stopped", err=True)
