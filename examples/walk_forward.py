"""A walk-forward validation on tiny settings, with its report.

A walk-forward trains a fresh model on each window's training span, exports it, and backtests
it on the next, never-seen span beside the baselines (equal weight, buy and hold, minimum
variance, HRP). Every window is recorded in the trade database; the summary (how often the
agent beat equal weight, by market regime, and against the config's goals) and a report
(``report/report.md`` with its plots and the statistics: bootstrap intervals, SPA test,
deflated Sharpe; ``report/report.html``, the same as interactive charts to open in a browser)
are written under ``--out``. ``configs/walk_forward_tiny.yaml`` is two
quarterly windows in 2018 on four stocks; ``configs/walk_forward.yaml`` is the real one.

    python examples/walk_forward.py --out runs/examples/walk_forward
    python examples/walk_forward.py --set trainer.total_timesteps=2000
"""

from __future__ import annotations

import argparse
from pathlib import Path

from allocator.recording.migrations import upgrade
from allocator.trainer.jobs.walk_forward.config import load_walk_forward_config
from allocator.trainer.jobs.walk_forward.report import format_summary
from allocator.trainer.jobs.walk_forward.runner import run_walk_forward

TINY = Path(__file__).resolve().parents[1] / "configs" / "walk_forward_tiny.yaml"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/examples/walk_forward"))
    parser.add_argument("--config", type=Path, default=TINY)
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config key, as `allocator walk-forward --set` does",
    )
    args = parser.parse_args(argv)

    database = f"sqlite:///{args.out / 'trades.db'}"
    args.out.mkdir(parents=True, exist_ok=True)
    upgrade(database)  # the trade schema the windows are recorded in
    config = load_walk_forward_config(
        args.config,
        [
            f"registry={args.out / 'models'}",  # each window's exported model
            f"output_dir={args.out}",
            f"database_url={database}",
            "pushgateway_url=null",
            *args.overrides,
        ],
    )
    print(f"walk-forward {config.name}: train, export, backtest against the baselines per window")
    result = run_walk_forward(config, out_dir=args.out, label="example", progress=False)
    for w in result.summary["per_window"]:
        print(
            f"  {w['label']} test {w['test_start']} .. {w['test_end']} ({w['regime']}): "
            f"Sharpe {w['sharpe']:+.2f}, equal weight {w['equal_weight_sharpe']:+.2f}, "
            f"excess {w['excess_sharpe']:+.2f} [{w['excess_sharpe_low']:+.2f}, "
            f"{w['excess_sharpe_high']:+.2f}]"
        )
    print(format_summary(result.summary))
    print(f"report: {result.files['report']}")
    print(f"interactive: {result.files['html']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
