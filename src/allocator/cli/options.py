"""What several commands share: options declared once (so their flag, default and help read
the same everywhere), signal handling, and ``fail``."""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import FrameType
from typing import Any, NoReturn, TypeVar

import click

F = TypeVar("F", bound=Callable[..., object])


def fail(message: str, code: int = 2) -> NoReturn:
    """Print ``error: message`` and exit with ``code`` (2: bad input, 1: the job could not
    finish), without a traceback."""
    click.echo(f"error: {message}", err=True)
    sys.exit(code)


@contextmanager
def failing(*errors: type[Exception], code: int = 2) -> Iterator[None]:
    """Inside, one of ``errors`` ends the command through ``fail`` with its message."""
    try:
        yield
    except errors as exc:
        fail(str(exc), code)


class Stopped(KeyboardInterrupt):
    """SIGTERM arrived: unwinds like Ctrl-C, so a job's cleanup runs for either."""

    exit_code = 128 + signal.SIGTERM


def interrupted_exit_code(exc: KeyboardInterrupt) -> int:
    """What a shell reports for a job the signal ended: 143 for SIGTERM, 130 for Ctrl-C."""
    return exc.exit_code if isinstance(exc, Stopped) else 128 + signal.SIGINT


@contextmanager
def sigterm_stops() -> Iterator[None]:
    """Inside, SIGTERM raises ``Stopped`` as SIGINT raises KeyboardInterrupt: ``kill``, a
    scheduler or an eviction would otherwise end a batch job (which under ``nohup`` ignores
    SIGINT) before any ``finally`` wrote the summary of its finished work."""

    def stop(signum: int, frame: FrameType | None) -> None:
        raise Stopped(f"stopped by signal {signal.Signals(signum).name}")

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@dataclass
class StopRequest:
    """A stop asked for by SIGTERM or SIGINT, honoured where the job can stop cleanly."""

    event: threading.Event = field(default_factory=threading.Event)
    signum: int | None = None

    @property
    def exit_code(self) -> int:
        return 128 + (self.signum or signal.SIGINT)


@contextmanager
def graceful_stop(message: str) -> Iterator[StopRequest]:
    """Inside, the first SIGTERM or SIGINT only sets the yielded request (and prints
    ``message``), so training stops between steps and writes a checkpoint instead of losing
    everything since the last one; a second signal stops at once, as ``sigterm_stops`` does."""
    request = StopRequest()

    def stop(signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if request.event.is_set():
            second = Stopped if signum == signal.SIGTERM else KeyboardInterrupt
            raise second(f"stopped by a second {name}")
        request.signum = signum
        request.event.set()
        click.echo(f"{name}: {message}", err=True)

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield request
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def config_option(help_text: str, *, required: bool) -> Callable[[F], F]:
    """``--config PATH`` (passed as ``config_path``)."""
    return click.option(
        "--config",
        "config_path",
        required=required,
        type=click.Path(dir_okay=False),
        help=help_text,
    )


def overrides_option(help_text: str) -> Callable[[F], F]:
    """``--set KEY=VALUE`` (repeatable): dotted-key overrides of the YAML (``overrides``)."""
    return click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE", help=help_text)


database_url_option = click.option(
    "--database-url",
    default=None,  # serve's flags leave their setting unset (tests/deploy/test_reference.py)
    help="SQLAlchemy URL (default: $DATABASE_URL, else sqlite:///allocator.db)",
)


def period_options(command: F) -> F:
    """``--start/--end``: the backtest period, as ISO dates."""
    command = click.option("--end", default="2019-12-31", show_default=True)(command)
    return click.option("--start", default="2010-01-01", show_default=True)(command)


cost_bps_option = click.option("--cost-bps", default=10.0, show_default=True, type=float)


def json_options(command: F) -> F:
    """``--json`` (``as_json``): the report as JSON, alone on stdout; ``--json-out PATH``
    (``json_out``): also write it there. Every command with a report takes the pair."""
    command = click.option(
        "--json-out",
        "json_out",
        type=click.Path(dir_okay=False),
        help="also write the report as JSON to this file",
    )(command)
    return click.option(
        "--json", "as_json", is_flag=True, help="print the report as JSON on stdout, only that"
    )(command)


def emit_json(payload: Any, as_json: bool, json_out: str | None) -> None:
    """What ``json_options`` asked for; under ``--json`` the "wrote" line goes to stderr, so
    stdout stays one JSON document."""
    # light (json, pathlib); the artifacts layer is loaded only by a command that reports
    from allocator.artifacts.files import json_text, write_json

    if json_out:
        write_json(json_out, payload)
        click.echo(f"wrote {json_out}", err=as_json)
    if as_json:
        click.echo(json_text(payload))
