"""What several commands share: the ``--config/--set`` pair, common options, and ``fail``.

An option declared here is declared once, so its flag, default and help read the same in every
command that takes it.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any, NoReturn, TypeVar

import click

F = TypeVar("F", bound=Callable[..., object])


def fail(message: str) -> NoReturn:
    """Print a clear error and exit with status 2 (bad input), without a traceback."""
    click.echo(f"error: {message}", err=True)
    sys.exit(2)


class Stopped(KeyboardInterrupt):
    """SIGTERM arrived: unwinds like Ctrl-C, so a job's cleanup runs for either."""

    exit_code = 128 + signal.SIGTERM


def interrupted_exit_code(exc: KeyboardInterrupt) -> int:
    """What a shell reports for a job the signal ended: 143 for SIGTERM, 130 for Ctrl-C."""
    return exc.exit_code if isinstance(exc, Stopped) else 128 + signal.SIGINT


@contextmanager
def sigterm_stops() -> Iterator[None]:
    """Inside, SIGTERM raises ``Stopped`` in the main thread, as SIGINT raises
    KeyboardInterrupt: the default action would end the process before any ``finally`` ran.

    ``kill``, a scheduler's timeout and a Kubernetes eviction send SIGTERM, and a job started
    with ``nohup ... &`` ignores SIGINT altogether, so without this a batch job stopped that way
    leaves no summary of the work it finished.
    """

    def stop(signum: int, frame: FrameType | None) -> None:
        raise Stopped(f"stopped by signal {signal.Signals(signum).name}")

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


class StopRequest:
    """A stop asked for by SIGTERM or SIGINT, honoured where the job can stop cleanly."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.signum: int | None = None

    @property
    def exit_code(self) -> int:
        """128 + the signal's number, what a shell reports for a job the signal ended."""
        return 128 + (self.signum or signal.SIGINT)


@contextmanager
def graceful_stop(message: str) -> Iterator[StopRequest]:
    """Inside, the first SIGTERM or SIGINT only sets the yielded request (and prints
    ``message``); the job stops at its next safe point. A second one stops at once, as
    ``sigterm_stops`` does.

    A training run stopped mid-step would lose everything since its last periodic checkpoint;
    stopped between steps it can write one and continue later. A scheduler sends SIGTERM and
    waits its grace period before SIGKILL: one step takes milliseconds.
    """
    request = StopRequest()

    def stop(signum: int, frame: FrameType | None) -> None:
        if request.event.is_set():
            name = signal.Signals(signum).name
            if signum == signal.SIGTERM:
                raise Stopped(f"stopped by a second {name}")
            raise KeyboardInterrupt(f"stopped by a second {name}")
        request.signum = signum
        request.event.set()
        click.echo(f"{signal.Signals(signum).name}: {message}", err=True)

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield request
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def config_option(help_text: str, *, required: bool) -> Callable[[F], F]:
    """``--config PATH``: the command's YAML file (passed to the command as ``config_path``)."""
    optional = {} if required else {"default": None}  # a required option declares no default
    return click.option(
        "--config",
        "config_path",
        required=required,
        type=click.Path(dir_okay=False),
        help=help_text,
        **optional,
    )


def overrides_option(help_text: str) -> Callable[[F], F]:
    """``--set KEY=VALUE`` (repeatable): dotted-key overrides applied on top of the YAML
    (passed to the command as ``overrides``)."""
    return click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE", help=help_text)


def config_options(config_help: str, set_help: str, *, required: bool) -> Callable[[F], F]:
    """``--config`` then ``--set``, adjacent: the usual pair of a config-driven command."""

    def decorate(command: F) -> F:
        return config_option(config_help, required=required)(overrides_option(set_help)(command))

    return decorate


database_url_option = click.option(
    "--database-url",
    default=None,
    help="SQLAlchemy URL (default: $DATABASE_URL, else sqlite:///allocator.db)",
)


def period_options(command: F) -> F:
    """``--start/--end``: the backtest period, as ISO dates."""
    command = click.option("--end", default="2019-12-31", show_default=True)(command)
    return click.option("--start", default="2010-01-01", show_default=True)(command)


cost_bps_option = click.option("--cost-bps", default=10.0, show_default=True, type=float)


def json_options(command: F) -> F:
    """``--json``: print the report as JSON on stdout, and nothing else there (pipe it to jq);
    ``--json-out PATH``: also write it to PATH. Every command with a report takes the pair, so
    ``--json`` means the same everywhere (passed as ``as_json`` and ``json_out``)."""
    command = click.option(
        "--json-out",
        "json_out",
        default=None,
        type=click.Path(dir_okay=False),
        help="also write the report as JSON to this file",
    )(command)
    return click.option(
        "--json", "as_json", is_flag=True, help="print the report as JSON on stdout, only that"
    )(command)


def emit_json(payload: Any, as_json: bool, json_out: str | None) -> None:
    """What ``json_options`` asked for: ``payload`` written to ``json_out`` (said on stderr
    under ``--json``, so stdout stays one JSON document) and printed under ``--json``."""
    # light (json, pathlib); the artifacts layer is loaded only by a command that reports
    from allocator.artifacts.files import json_text, write_json

    if json_out:
        write_json(json_out, payload)
        click.echo(f"wrote {json_out}", err=as_json)
    if as_json:
        click.echo(json_text(payload))


def shown_url(url: str) -> str:
    """A database URL with any password masked, for messages."""
    # heavy (sqlalchemy): imported when a URL is shown, so `allocator --help` stays instant
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)
