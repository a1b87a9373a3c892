"""``allocator serve``: the gRPC server, until SIGTERM/SIGINT.

Every option is a ``ServerConfig`` field (``--model`` sets ``default_model``; ``--no-record`` and
``--cpu`` switch ``record`` and ``prefer_cuda`` off); an option left unset takes the config's
default. The server (onnxruntime, grpc, sqlalchemy) is imported inside the command, so
``allocator --help`` stays instant.
"""

from __future__ import annotations

import logging
import signal
from typing import Any

import click

from allocator.cli.options import database_url_option, fail


@click.command()
@click.option("--registry", required=True, type=click.Path(file_okay=False), help="model registry")
@click.option("--host", default="127.0.0.1", show_default=True, help="address to bind")
@click.option("--port", default=50051, show_default=True, help="gRPC port (0: any free port)")
@click.option("--metrics-port", default=9464, show_default=True, help="Prometheus /metrics port")
@database_url_option
@click.option("--no-record", is_flag=True, help="do not record decisions (experiments only)")
@click.option("--spool-dir", default="spool", show_default=True, help="recorder's durable spool")
@click.option("--redis-url", default=None, help="share smoothing state between replicas")
@click.option("--auth-token-file", default=None, help="require this bearer token")
@click.option("--tls-cert", default=None, help="server certificate (PEM)")
@click.option("--tls-key", default=None, help="server private key (PEM)")
@click.option("--tls-client-ca", default=None, help="require client certificates (mTLS)")
@click.option(
    "--latency-budget-ms", default=10.0, show_default=True, help="P95 budget per decision"
)
@click.option("--max-concurrent-rpcs", default=64, show_default=True)
@click.option("--threads", default=8, show_default=True, help="handler threads per process")
@click.option(
    "--workers",
    default=1,
    show_default=True,
    help="server processes sharing the port (Linux); more than 1 needs --redis-url",
)
@click.option("--model", "default_model", default=None, help="model answering unpinned calls")
@click.option("--reload-interval", default=2.0, show_default=True, help="registry scan period")
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
    "--group-commit-ms", type=float, default=None, help="durable acks: commit window (default 1)"
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
def serve(**options: Any) -> None:
    """Serve allocations over gRPC until SIGTERM/SIGINT (then drain and flush the recorder)."""
    from pydantic import ValidationError  # what ServerConfig raises; only needed when serving

    # heavy (onnxruntime, grpc, sqlalchemy): imported when the command runs, keeps --help instant
    from allocator.recording.sinks import SchemaMissingError
    from allocator.registry.errors import ModelLoadError
    from allocator.serving.server import ServerConfig, build_server
    from allocator.serving.stop_signals import StopSignals

    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    options["record"] = not options.pop("no_record")
    options["prefer_cuda"] = not options.pop("cpu")
    try:
        config = ServerConfig(**{k: v for k, v in options.items() if v is not None})
        if config.workers > 1:
            _supervise(config)
            return
        # before the model load: a SIGTERM during it drains the server once started
        stop = StopSignals()
        server = build_server(config)
    except ValidationError as exc:
        fail("; ".join(_validation_message(e) for e in exc.errors()))
    except (ModelLoadError, SchemaMissingError, ValueError, OSError) as exc:
        fail(str(exc))
    server.start()
    click.echo(f"serving on {server.target} (metrics on port {server.metrics_port})", err=True)
    stop.wait()
    click.echo("draining: health NOT_SERVING, finishing calls, flushing the recorder", err=True)
    server.stop()


def _validation_message(error: Any) -> str:
    """``--field: message``; a check across fields names its flags in its own message."""
    message = str(error["msg"]).removeprefix("Value error, ")
    if not error["loc"]:
        return message
    return f"--{'-'.join(map(str, error['loc']))}: {message}"


def _supervise(config: Any) -> None:
    """``--workers N`` > 1: the supervisor (``serving.workers``) until SIGTERM/SIGINT."""
    from allocator.serving.workers import Supervisor  # with the server's imports: when run

    supervisor = Supervisor(config)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: supervisor.stop())
    try:
        supervisor.start()
    except RuntimeError as exc:
        fail(str(exc))
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
