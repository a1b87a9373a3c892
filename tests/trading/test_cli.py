"""``allocator trade``: create an account, trade a bar, replay bars, report status and errors."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest
from click.testing import CliRunner, Result
from sqlalchemy import Engine, update
from sqlalchemy.orm import Session

from allocator.cli import main
from allocator.recording.schema import PaperHolding
from allocator.serving.server import AllocationServer
from tests.trading.conftest import ASSETS, N_BARS, bar


def trade(engine: Engine, *args: str) -> Result:
    url = engine.url.render_as_string(hide_password=False)
    return CliRunner().invoke(main, ["trade", *args, "--database-url", url])


def test_account_cycle_run_and_status(engine: Engine, server: AllocationServer) -> None:
    target = f"127.0.0.1:{server.port}"
    created = trade(
        engine,
        "account",
        "create",
        "desk",
        "--assets",
        ",".join(ASSETS),
        "--cash",
        "50000",
        "--lot-size",
        "1",
        "--min-order-value",
        "100",
    )
    assert created.exit_code == 0, created.output
    assert "created paper account desk" in created.output
    again = trade(engine, "account", "create", "desk", "--assets", "AAA", "--cash", "1")
    assert again.exit_code == 2
    assert "account 'desk' already exists" in again.output

    done = trade(
        engine, "cycle", "--account", "desk", "--date", bar(10).isoformat(), "--server", target
    )
    assert done.exit_code == 0, done.output
    assert f"desk {bar(10).isoformat()}: done" in done.output
    rerun = trade(
        engine, "cycle", "--account", "desk", "--date", bar(10).isoformat(), "--server", target
    )
    assert "already done" in rerun.output

    replay = trade(engine, "run", "--account", "desk", "--server", target)
    assert replay.exit_code == 0, replay.output
    assert f"desk {bar(N_BARS - 1).isoformat()}: done" in replay.output

    status = trade(engine, "status", "--json")
    assert status.exit_code == 0, status.output
    (entry,) = json.loads(status.output)
    assert entry["last_bar"] == bar(N_BARS - 1).isoformat()
    assert entry["halted"] is False
    assert entry["fees"] > 0
    assert 0.0 <= entry["drawdown"] < 1.0
    assert entry["turnover"] >= 0.0
    assert all(p["quantity"] == int(p["quantity"]) for p in entry["positions"])  # whole lots


def test_errors_are_named(engine: Engine, server: AllocationServer) -> None:
    target = f"127.0.0.1:{server.port}"
    trade(engine, "account", "create", "desk", "--assets", ",".join(ASSETS), "--cash", "1000")
    unknown = trade(
        engine, "cycle", "--account", "ghost", "--date", bar(10).isoformat(), "--server", target
    )
    assert unknown.exit_code == 1
    assert "unknown account 'ghost'" in unknown.output
    stale = trade(engine, "cycle", "--account", "desk", "--date", "2031-01-01", "--server", target)
    assert stale.exit_code == 1
    assert "no prices for 2031-01-01" in stale.output
    bad = trade(engine, "cycle", "--account", "desk", "--date", "tomorrow", "--server", target)
    assert bad.exit_code == 2
    assert "--date: 'tomorrow' is not an ISO date" in bad.output
    cash = trade(engine, "account", "create", "cashy", "--assets", "CASH", "--cash", "1")
    assert cash.exit_code == 2
    assert "names the cash slot" in cash.output

    trade(engine, "cycle", "--account", "desk", "--date", bar(10).isoformat(), "--server", target)
    with Session(engine) as session, session.begin():
        session.execute(update(PaperHolding).values(quantity=PaperHolding.quantity * 2))
    halted = trade(
        engine, "cycle", "--account", "desk", "--date", bar(11).isoformat(), "--server", target
    )
    assert halted.exit_code == 1
    assert "halted" in halted.output
    status = trade(engine, "status")
    assert status.exit_code == 1
    assert "HALTED: reconciliation mismatch" in status.output
    assert trade(engine, "account", "resume", "desk").exit_code == 0


def test_an_account_needs_its_cash_or_its_broker(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A paper account without --cash, and an Alpaca account without credentials (or without
    alpaca-py), are refused before anything is recorded."""
    monkeypatch.delenv("ALPACA_API_KEY", raising=False)
    monkeypatch.delenv("ALPACA_SECRET_KEY", raising=False)
    no_cash = trade(engine, "account", "create", "desk", "--assets", "AAA")
    assert no_cash.exit_code == 2
    assert "a paper account needs --cash" in no_cash.output
    alpaca = trade(engine, "account", "create", "desk", "--assets", "AAA", "--broker", "alpaca")
    assert alpaca.exit_code == 2
    assert "ALPACA_API_KEY" in alpaca.output or "allocator[alpaca]" in alpaca.output
    assert trade(engine, "status", "--json").output.strip() == "[]"


def test_a_cycle_on_the_latest_bar(engine: Engine, server: AllocationServer) -> None:
    """What the scheduled job runs after each day's ingest: the newest bar of the prices table."""
    trade(engine, "account", "create", "desk", "--assets", ",".join(ASSETS), "--cash", "1000")
    target = f"127.0.0.1:{server.port}"
    done = trade(engine, "cycle", "--account", "desk", "--date", "latest", "--server", target)
    assert done.exit_code == 0, done.output
    assert f"desk {bar(N_BARS - 1).isoformat()}: done" in done.output


class Gateway(BaseHTTPRequestHandler):
    """A Pushgateway's push endpoint that keeps what it was sent."""

    pushes: ClassVar[list[tuple[str, str, str]]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"] or 0)).decode()
        self.pushes.append((self.command, self.path, body))
        self.send_response(200)
        self.end_headers()

    do_PUT = do_POST  # noqa: N815

    def log_message(self, format: str, *args: object) -> None:
        pass


def test_cycle_and_compare_push_the_book_to_the_pushgateway(
    engine: Engine, server: AllocationServer, tmp_path: Path
) -> None:
    http = ThreadingHTTPServer(("127.0.0.1", 0), Gateway)
    thread = threading.Thread(target=http.serve_forever, daemon=True)
    thread.start()
    Gateway.pushes.clear()
    gateway = f"http://127.0.0.1:{http.server_port}"
    target = f"127.0.0.1:{server.port}"
    try:
        trade(engine, "account", "create", "desk", "--assets", ",".join(ASSETS), "--cash", "1000")
        for k in (10, 11):
            done = trade(
                engine,
                *("cycle", "--account", "desk", "--date", bar(k).isoformat()),
                *("--server", target, "--pushgateway-url", gateway),
            )
            assert done.exit_code == 0, done.output
        compared = trade(
            engine,
            *("compare", "--account", "desk", "--registry", str(tmp_path / "registry")),
            *("--pushgateway-url", gateway),
        )
        assert compared.exit_code == 0, compared.output
    finally:
        http.shutdown()
    methods = {method for method, _, _ in Gateway.pushes}
    paths = {path for _, path, _ in Gateway.pushes}
    assert methods == {"POST"}  # adds to the account's group: cycle and compare side by side
    assert paths == {"/metrics/job/allocator-trade/account/desk"}
    cycle_body, compare_body = Gateway.pushes[-2][2], Gateway.pushes[-1][2]
    for name in (
        "allocator_trading_nav",
        "allocator_trading_drawdown_ratio",
        "allocator_trading_position_value",
        "allocator_trading_turnover_ratio",
        "allocator_trading_fees_paid",
        "allocator_trading_rejected_orders",
        'allocator_trading_account_halted{account="desk"} 0.0',
        'allocator_trading_orders_total{account="desk",status="filled"}',
    ):
        assert name in cycle_body, name
    assert 'allocator_trading_tracking_difference{account="desk"}' in compare_body


def test_an_unreadable_token_file_is_named(engine: Engine, tmp_path: Path) -> None:
    trade(engine, "account", "create", "desk", "--assets", ",".join(ASSETS), "--cash", "1000")
    missing = tmp_path / "token"
    done = trade(
        engine, "cycle", "--account", "desk", "--date", "latest", "--token-file", str(missing)
    )
    assert done.exit_code == 2
    assert f"--token-file: cannot read {missing}" in done.output
