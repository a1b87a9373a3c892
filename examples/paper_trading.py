"""Paper-trade a served model: orders, fills, positions and NAV beside its backtest.

What a desk runs, on a laptop's scale. A tiny model is trained and exported to a registry (as in
``train_serve.py``); the closes go into the trade database (``allocator data ingest``); the
allocation server serves the registry and records its decisions into the same database
(``allocator serve``); a paper account (``allocator trade account create``) trades every bar
(``allocator trade run``): each cycle asks the server for target weights, sizes orders and has
the paper broker fill them at the bar's close under the model's costs. Then the positions with
their P&L (``allocator trade status``), the fills (SQL on the ``fills`` table), and the
account's NAV against the backtest of the same model over the same bars (``allocator trade
compare``): on a fractional account at the model's cost rate the two agree to a small
fraction of a percent; with ``--lot-size 1`` it trades whole shares, and the comparison shows
how far the rounding moves the account from its backtest.

Everything after training is the ``allocator`` command, as a scheduled job would run it; in
production the server is a long-lived service and ``trade cycle --date latest`` runs once a day
after the day's ingest (``docs/trading.md``).

    python examples/paper_trading.py --out runs/examples/paper_trading
    python examples/paper_trading.py --bars 120 --lot-size 1
"""

from __future__ import annotations

import argparse
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from allocator import export_run, load_config, train
from allocator.trainer.market.data import load_sp500

ASSETS = ["AAPL", "MSFT", "JPM", "XOM"]
FIRST_BAR = "2018-07-02"  # the first trading day after the model's validation span
COST_BPS = 10.0  # the model's cost rate: the account pays the costs the policy trained under
ACCOUNT = "paper-desk"
ALLOCATOR = [sys.executable, "-m", "allocator.cli"]  # the `allocator` command


def allocator(*args: str) -> str:
    """Run one ``allocator`` command; its output, or its error on failure."""
    done = subprocess.run([*ALLOCATOR, *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"allocator {' '.join(args)} failed:\n{done.stdout}{done.stderr}")
    return done.stdout


def train_and_export(out: Path, steps: int) -> Path:
    """A tiny TD3 on four stocks, exported to ``out/models``; returns the registry."""
    config = load_config(
        None,
        [
            "name=paper",
            f"data.assets=[{','.join(ASSETS)}]",
            "data.train_start=2016-01-01",
            "data.train_end=2017-12-31",
            "data.validation_start=2018-01-01",
            "data.validation_end=2018-06-30",
            f"env.max_assets={len(ASSETS)}",
            f"env.cost_bps={COST_BPS}",
            "env.window=10",
            "env.episode_length=60",
            f"total_timesteps={steps}",
            "algorithm.learning_starts=100",
            "algorithm.batch_size=32",
            "algorithm.net_arch=[32,32]",
            "progress_bar=false",
            "tensorboard=false",
            "torch_threads=1",
        ],
    )
    run = train(config, out / "run")
    version_dir = export_run(run.run_dir, out / "models", name="paper")
    print(f"trained {steps} steps and exported {version_dir}")
    return out / "models"


def write_closes(path: Path, bars: int) -> tuple[str, str]:
    """The closes of ``ASSETS`` as a long-format CSV (date, asset, close): the model's window
    before ``FIRST_BAR``, then ``bars`` bars to trade. Returns the first and last bar."""
    data = load_sp500().select(ASSETS)
    first = data.date_index(FIRST_BAR)
    wide = data.to_frame().iloc[first - 20 : first + bars]
    long = wide.rename_axis("date").reset_index().melt("date", var_name="asset", value_name="close")
    long.to_csv(path, index=False, date_format="%Y-%m-%d")
    return str(wide.index[20].date()), str(wide.index[-1].date())


def start_server(registry: Path, database: str, out: Path) -> tuple[subprocess.Popen[bytes], str]:
    """``allocator serve`` on a free port; returns the process and its HOST:PORT once up."""
    log = out / "server.log"
    command = [*ALLOCATOR, "serve", "--registry", str(registry), "--port", "0"]
    command += ["--metrics-port", "0", "--database-url", database]
    command += ["--spool-dir", str(out / "spool"), "--cpu"]
    with log.open("wb") as sink:
        server = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        found = re.search(r"serving on (\S+)", log.read_text(errors="replace"))
        if found:
            return server, found.group(1)
        if server.poll() is not None:
            break
        time.sleep(0.2)
    server.kill()
    raise SystemExit(f"the server did not start:\n{log.read_text(errors='replace')}")


def print_fills(db: Path, last: int) -> None:
    """The account's fills, the latest ``last`` of them, straight from the trade database."""
    with sqlite3.connect(db) as conn:
        rows = conn.execute(
            "SELECT f.bar_date, f.asset, f.side, f.quantity, f.price, f.fee FROM fills f "
            "JOIN accounts a ON a.id = f.account_id WHERE a.name = ? ORDER BY f.id",
            (ACCOUNT,),
        ).fetchall()
    print(f"fills: {len(rows)}, the last {min(last, len(rows))}:")
    for bar, asset, side, quantity, price, fee in rows[-last:]:
        print(f"  {bar} {side:<4} {quantity:12.4f} {asset:<5} at {price:9.2f}, fee {fee:6.2f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/examples/paper_trading"))
    parser.add_argument("--steps", type=int, default=300, help="training steps")
    parser.add_argument("--bars", type=int, default=40, help="daily bars to trade")
    parser.add_argument("--cash", type=float, default=100_000.0, help="the account's deposit")
    parser.add_argument("--lot-size", type=float, default=0.0, help="0: fractional shares")
    args = parser.parse_args(argv)
    if args.out.exists():
        shutil.rmtree(args.out)  # a fresh account and registry on every run
    args.out.mkdir(parents=True)

    registry = train_and_export(args.out, args.steps)
    db = args.out / "trades.db"
    database = ("--database-url", f"sqlite:///{db}")  # the trade database every command uses
    allocator("db", "upgrade", *database)
    first, last = write_closes(args.out / "closes.csv", args.bars)
    allocator("data", "ingest", str(args.out / "closes.csv"), *database)
    allocator(
        "trade", "account", "create", ACCOUNT, "--assets", ",".join(ASSETS),
        "--cash", str(args.cash), "--cost-bps", str(COST_BPS), "--lot-size", str(args.lot_size),
        *database,
    )  # fmt: skip
    print(f"paper account {ACCOUNT}: {args.cash:,.0f} cash, trading {first} .. {last}")

    server, target = start_server(registry, database[1], args.out)
    try:
        traded = allocator(
            "trade", "run", "--account", ACCOUNT, "--server", target, "--start", first, *database
        )
    finally:
        server.send_signal(signal.SIGTERM)  # drains and flushes the recorder, as in production
        server.wait(timeout=60)
    print(traded.strip())

    print(allocator("trade", "status", "--account", ACCOUNT, *database).strip())
    print_fills(db, last=8)
    print("live against backtest:")
    compare = ("--registry", str(registry), "--json-out", str(args.out / "compare.json"))
    print(allocator("trade", "compare", "--account", ACCOUNT, *compare, *database).strip())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
