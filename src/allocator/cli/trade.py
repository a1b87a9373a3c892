"""``allocator trade``: paper accounts, one trading cycle, a replay of bars, and the status.

Every failure a cycle can meet (stale bar, missing price, halted account, broker rejection,
server down) exits 1 with the reason on stderr; bad options exit 2.
"""

from __future__ import annotations

import datetime as dt
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click

from allocator.cli.options import database_url_option, emit_json, fail, failing, json_options
from allocator.recording.settings import database_url as default_url
from allocator.recording.settings import shown_url


def parse_date(value: str | None, option: str) -> dt.date | None:
    if not value:
        return None
    try:
        return dt.date.fromisoformat(value)
    except ValueError:
        fail(f"{option}: {value!r} is not an ISO date (YYYY-MM-DD)")


@contextmanager
def trade_engine(database_url: str | None) -> Iterator[Any]:
    # heavy (sqlalchemy): imported when a trade command runs, so `allocator --help` stays instant
    from sqlalchemy import create_engine, inspect

    url = database_url or default_url()
    engine = create_engine(url)
    try:
        if not inspect(engine).has_table("accounts"):
            fail(
                "the trade database has no trading tables: run `allocator db upgrade` first "
                f"({shown_url(url)})"
            )
        yield engine
    finally:
        engine.dispose()


pushgateway_option = click.option(
    "--pushgateway-url",
    envvar=["ALLOCATOR_PUSHGATEWAY_URL", "PUSHGATEWAY_URL"],
    help="Push the account's figures at the end [env: ALLOCATOR_PUSHGATEWAY_URL, PUSHGATEWAY_URL]",
)


@contextmanager
def pushed(engine: Any, account_name: str, gateway_url: str | None) -> Iterator[Any]:
    """The command's trading figures; at the end, failed or not, the account's book is read
    back into them and they are pushed (a failed push is a warning, never the exit code)."""
    # heavy (prometheus_client, sqlalchemy): the figures, and the status report of the database
    from prometheus_client import CollectorRegistry

    # allocator's trading modules import sqlalchemy too: loaded with the command only
    from allocator.metrics.trading import TradingMetrics
    from allocator.trading.status import account_status

    metrics = TradingMetrics(CollectorRegistry())
    try:
        yield metrics
    finally:
        if gateway_url:
            for entry in account_status(engine, account_name):
                metrics.record_book(entry)
            error = metrics.push(gateway_url, account_name)
            if error:
                click.echo(f"warning: {error}", err=True)


@click.group()
def trade() -> None:
    """Trade target weights: paper accounts, cycles per bar, positions and P&L."""


@trade.group()
def account() -> None:
    """Create and resume trading accounts."""


@account.command("create")
@click.argument("name")
@click.option("--assets", required=True, help="Comma-separated asset ids the account trades.")
@click.option(
    "--cash",
    type=float,
    help="Initial cash deposited (paper); an Alpaca account's cash is read from Alpaca.",
)
@click.option(
    "--broker",
    type=click.Choice(["paper", "alpaca"]),
    default="paper",
    show_default=True,
    help="alpaca: Alpaca's paper endpoint, credentials in ALPACA_API_KEY/ALPACA_SECRET_KEY.",
)
@click.option("--model", help="Model name to ask (default: the server's).")
@click.option("--cost-bps", type=float, default=10.0, show_default=True)
@click.option("--lot-size", type=float, default=0.0, show_default=True, help="0: fractional.")
@click.option("--min-order-value", type=float, default=0.0, show_default=True)
@click.option("--band", type=float, default=0.0, show_default=True, help="No-trade band (NAV).")
@click.option("--cash-buffer", type=float, default=0.0, show_default=True, help="Of NAV.")
@database_url_option
def account_create(
    name: str,
    assets: str,
    cash: float | None,
    broker: str,
    model: str | None,
    database_url: str | None,
    **rules: float,  # --cost-bps to --cash-buffer: SizingRules, field for field
) -> None:
    """Create account NAME: a paper one funded with CASH at the paper broker and in the book, or
    one on an empty Alpaca paper account, its cash read from Alpaca."""
    # heavy (sqlalchemy): imported when the command runs
    from sqlalchemy.orm import Session

    # allocator's trading modules import sqlalchemy too: loaded with the command only
    from allocator.trading.book import AccountSpec, create_account
    from allocator.trading.errors import TradingError
    from allocator.trading.paper import PaperBroker
    from allocator.trading.sizing import SizingRules

    with failing(ValueError):
        listed = [a.strip() for a in assets.split(",") if a.strip()]
        spec = AccountSpec(name, listed, SizingRules(**rules), model, broker)
    if broker == "paper" and cash is None:
        fail("a paper account needs --cash")
    if broker == "alpaca":
        # heavy (alpaca-py): imported only for an Alpaca account
        from allocator.trading.alpaca import opening_cash

        with failing(TradingError):
            cash = opening_cash(cash)
    assert cash is not None
    with (
        trade_engine(database_url) as engine,
        failing(ValueError, TradingError),
        Session(engine) as session,
        session.begin(),
    ):
        create_account(session, spec, cash)
        if broker == "paper":
            PaperBroker(engine, spec.rules.cost_bps).fund_in(session, name, cash)
    click.echo(
        f"created {broker} account {name} with {cash:,.2f} cash, assets {', '.join(spec.assets)}"
    )


@account.command("resume")
@click.argument("name")
@database_url_option
def account_resume(name: str, database_url: str | None) -> None:
    """Clear NAME's halt once its book and broker agree again (checked at the next cycle)."""
    # heavy (sqlalchemy): imported when the command runs
    from sqlalchemy.orm import Session

    # allocator's trading modules import sqlalchemy too: loaded with the command only
    from allocator.trading.book import load_account, set_halt
    from allocator.trading.errors import TradingError

    with (
        trade_engine(database_url) as engine,
        failing(TradingError),
        Session(engine) as session,
        session.begin(),
    ):
        set_halt(load_account(session, name), None)
    click.echo(f"resumed account {name}")


def cycle_options(command: Any) -> Any:
    """What ``cycle`` and ``run`` share: the account, the server, the paper broker's knobs."""
    for option in reversed(
        [
            click.option("--account", "account_name", required=True, help="Account name."),
            click.option(
                "--server",
                default="localhost:50051",
                show_default=True,
                help="Allocation server, HOST:PORT.",
            ),
            click.option(
                "--token-file",
                type=click.Path(dir_okay=False),
                help="File holding the server's bearer token.",
            ),
            click.option(
                "--attempts",
                type=click.IntRange(1, 20),
                default=3,
                show_default=True,
                help="Tries before a silent server is given up on.",
            ),
            click.option(
                "--slippage-bps",
                type=float,
                default=0.0,
                show_default=True,
                help="Paper broker: slippage against the trader.",
            ),
            pushgateway_option,
            database_url_option,
        ]
    ):
        command = option(command)
    return command


def trade_bars(
    options: dict[str, Any], pick: Callable[[Any], list[dt.date]], *, wait: bool
) -> None:
    """Run the account's cycle for each bar ``pick(session)`` chooses; print the last result.

    ``wait``: skip the bars before the model's window is filled instead of failing on them."""
    # heavy (sqlalchemy, grpc): imported when the command runs
    from sqlalchemy.orm import Session

    # allocator's trading modules import sqlalchemy too: loaded with the command only
    from allocator.serving.client import AllocatorClient
    from allocator.trading.book import load_account
    from allocator.trading.cycle import Retries, run_cycle
    from allocator.trading.errors import MissingPriceError, TradingError
    from allocator.trading.paper import PaperBroker

    name, token_file = options["account_name"], options["token_file"]
    try:
        token = Path(token_file).read_text(encoding="utf-8").strip() if token_file else None
    except OSError as exc:
        fail(f"--token-file: cannot read {token_file}: {exc.strerror or exc}")
    result = None
    with trade_engine(options["database_url"]) as engine:
        with failing(ValueError), failing(TradingError, code=1):
            with Session(engine) as session:
                account = load_account(session, name)
                cost_bps, kind = account.cost_bps, account.broker
            if kind == "alpaca":
                # heavy (alpaca-py): imported only for an Alpaca account
                from allocator.trading.alpaca import AlpacaBroker

                broker: Any = AlpacaBroker.from_env()
            else:
                broker = PaperBroker(engine, cost_bps, slippage_bps=options["slippage_bps"])
        with AllocatorClient(options["server"], token=token) as client:
            with Session(engine) as session:
                dates = pick(session)
            with pushed(engine, name, options["pushgateway_url"]) as metrics:
                for bar_date in dates:
                    try:
                        result = run_cycle(
                            engine,
                            broker,
                            client,
                            name,
                            bar_date,
                            retries=Retries(attempts=options["attempts"]),
                            metrics=metrics,
                        )
                    except TradingError as exc:
                        unfilled = isinstance(exc, MissingPriceError) and "closes up to" in str(exc)
                        if wait and result is None and unfilled:
                            continue  # the model's window is not filled yet
                        fail(str(exc), 1)
    if result is None:
        fail("no bar in the span has the model's window of history")
    filled = sum(1 for o in result.orders if o["status"] != "rejected")
    click.echo(
        f"{result.account} {result.bar_date.isoformat()}: {result.outcome}, "
        f"{filled}/{len(result.orders)} orders filled, NAV {result.nav_before:,.2f} -> "
        f"{result.nav_after:,.2f} ({result.model})"
    )


@trade.command("cycle")
@cycle_options
@click.option(
    "--date",
    "date_",
    required=True,
    help="The bar to trade, YYYY-MM-DD, or 'latest': the latest bar of the prices table.",
)
def cycle(date_: str, **options: Any) -> None:
    """Run ACCOUNT's trading cycle for the bar of DATE (once: a rerun changes nothing)."""
    # heavy (sqlalchemy): the bars are read from the trade database
    from allocator.trading.bars import bar_dates

    bar_date = None if date_ == "latest" else parse_date(date_, "--date")

    def pick(session: Any) -> list[dt.date]:
        dates = [bar_date] if bar_date is not None else bar_dates(session, None, None)[-1:]
        if not dates:
            fail("the prices table is empty: ingest prices first (`allocator data ingest`)")
        return dates

    trade_bars(options, pick, wait=False)


@trade.command("run")
@cycle_options
@click.option("--start", help="First bar, YYYY-MM-DD (default: the first).")
@click.option("--end", help="Last bar, YYYY-MM-DD (default: the latest).")
def run(start: str | None, end: str | None, **options: Any) -> None:
    """Replay every bar of the prices table from START to END through ACCOUNT's cycles.

    Bars already traded are skipped by the cycle itself; bars before the model's window is
    filled are skipped with a note."""
    # heavy (sqlalchemy): the bars and the book are read from the trade database
    from allocator.trading.bars import bar_dates
    from allocator.trading.book import last_traded

    first, last = parse_date(start, "--start"), parse_date(end, "--end")

    def pick(session: Any) -> list[dt.date]:
        dates = bar_dates(session, first, last)
        traded = last_traded(session, options["account_name"])
        if traded is not None:
            dates = [d for d in dates if d >= traded]  # the last traded bar reruns as a no-op
        if not dates:
            fail("no bars in the prices table for that span: ingest prices first")
        return dates

    trade_bars(options, pick, wait=True)


@trade.command("compare")
@click.option("--account", "account_name", required=True, help="Account name.")
@click.option(
    "--registry",
    required=True,
    type=click.Path(file_okay=False, exists=True),
    help="The model registry the allocation server serves from.",
)
@click.option("--start", help="First bar, YYYY-MM-DD (default: the first traded).")
@click.option("--end", help="Last bar, YYYY-MM-DD (default: the last traded).")
@json_options
@pushgateway_option
@database_url_option
def compare(
    account_name: str,
    registry: str,
    start: str | None,
    end: str | None,
    as_json: bool,
    json_out: str | None,
    pushgateway_url: str | None,
    database_url: str | None,
) -> None:
    """ACCOUNT's live NAV beside the backtest of the same model over the same bars.

    The report quantifies the difference: the NAV gap per bar, fees against the backtest's
    costs, turnover, how far the sizing rules kept the book from the target, and how far the
    server's answers moved. The tracking difference is pushed as
    allocator_trading_tracking_difference."""
    # heavy (sqlalchemy, onnxruntime): imported when the command runs
    from allocator.trading.compare import compare_account
    from allocator.trading.errors import TradingError

    first, last = parse_date(start, "--start"), parse_date(end, "--end")
    with trade_engine(database_url) as engine, pushed(engine, account_name, pushgateway_url) as m:
        with failing(TradingError, code=1):
            report = compare_account(engine, account_name, Path(registry), first, last)
        m.record_tracking(account_name, report.tracking_difference)
    if not as_json:
        click.echo(report.summary())
    emit_json(report.to_dict(), as_json, json_out)


@trade.command("status")
@click.option("--account", "account_name", help="Only this account.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@database_url_option
def status(account_name: str | None, as_json: bool, database_url: str | None) -> None:
    """Accounts with their halt state, NAV, positions and P&L; exit 1 when any is halted."""
    # heavy (sqlalchemy): imported when the command runs
    from allocator.trading.status import account_status

    with trade_engine(database_url) as engine:
        report = account_status(engine, account_name)
    if account_name is not None and not report:
        fail(f"unknown account {account_name!r}")
    if as_json:
        emit_json(report, True, None)
    else:
        for entry in report:
            state = f"HALTED: {entry['halt_reason']}" if entry["halted"] else "active"
            nav = "-" if entry["nav"] is None else f"{entry['nav']:,.2f}"
            if entry["drawdown"]:
                nav += f" ({entry['drawdown']:.2%} below its peak)"
            click.echo(
                f"{entry['account']}: {state}; last bar {entry['last_bar'] or '-'}, NAV {nav}, "
                f"cash {entry['cash']:,.2f}, fees {entry['fees']:,.2f}, "
                f"rejected orders {entry['rejected_orders']}"
            )
            for p in entry["positions"]:
                pnl = f"realized {p['realized_pnl']:,.2f}"
                if p["unrealized_pnl"] is not None:
                    pnl += f", unrealized {p['unrealized_pnl']:,.2f}"
                click.echo(f"  {p['asset']}: {p['quantity']:.6g} ({pnl})")
    if any(entry["halted"] for entry in report):
        sys.exit(1)
