"""Figures of the trading cycle: reconciliation mismatches, halts, orders, cycles, the book.

A cycle is shorter than a scrape interval, so ``allocator trade`` pushes these to a Pushgateway
at its end, on a fresh registry per command, the book's state read back from the trade database.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge

from allocator.metrics.pushgateway import push_reporting
from allocator.portfolio import CASH_ID

TRADE_JOB = "allocator-trade"
"""The Pushgateway job the trade commands push under (grouped by account)."""


class TradingMetrics:
    """The trading figures, registered once per registry (the process default unless given)."""

    def __init__(self, registry: CollectorRegistry = REGISTRY) -> None:
        self.registry = registry

        def counter(name: str, documentation: str, *labels: str) -> Counter:
            return Counter(name, documentation, ["account", *labels], registry=registry)

        def gauge(name: str, documentation: str, *labels: str) -> Gauge:
            return Gauge(name, documentation, ["account", *labels], registry=registry)

        self.mismatches = counter(
            "allocator_trading_reconciliation_mismatches_total",
            "Reconciliations that found the broker's positions differ from the recorded ones.",
        )
        self.halted = gauge(
            "allocator_trading_account_halted",
            "1 while the account is halted (a failed reconciliation), else 0.",
        )
        self.orders = counter(
            "allocator_trading_orders_total",
            "Orders settled by the broker, by final status (filled, partially_filled, rejected).",
            "status",
        )
        self.cycles = counter(
            "allocator_trading_cycles_total",
            "Trading cycles run, by outcome (done, already_done, failed).",
            "outcome",
        )
        self.nav = gauge(
            "allocator_trading_nav",
            "The account's NAV at its last cycle's close, after that cycle's trades.",
        )
        self.drawdown = gauge(
            "allocator_trading_drawdown_ratio",
            "How far the account's NAV is below its highest recorded NAV (0: at the peak).",
        )
        self.position_value = gauge(
            "allocator_trading_position_value",
            "Value of each holding at the last cycle's close (cash under CASH).",
            "asset",
        )
        self.turnover = gauge(
            "allocator_trading_turnover_ratio",
            "Value traded by the last cycle over the NAV it started from.",
        )
        self.fees = gauge(
            "allocator_trading_fees_paid", "Fees the account has paid on all its fills."
        )
        self.rejected = gauge(
            "allocator_trading_rejected_orders",
            "Orders of the account the broker has rejected, all cycles together.",
        )
        self.tracking_difference = gauge(
            "allocator_trading_tracking_difference",
            "Live NAV over the backtest's NAV of the same model over the same bars, less one "
            "(allocator trade compare).",
        )

    def record_book(self, entry: Mapping[str, Any]) -> None:
        """The book of one account as ``trading.status.account_status`` reports it."""
        account = str(entry["account"])
        gauges = {"halted": self.halted, "fees": self.fees, "rejected_orders": self.rejected}
        gauges |= {"nav": self.nav, "drawdown": self.drawdown, "turnover": self.turnover}
        for key, gauge in gauges.items():
            if entry.get(key) is not None:  # no NAV, drawdown or turnover before a first cycle
                gauge.labels(account).set(float(entry[key]))
        self.position_value.labels(account, CASH_ID).set(float(entry["cash"]))
        for position in entry["positions"]:
            if position["value"] is not None:
                self.position_value.labels(account, position["asset"]).set(position["value"])

    def record_tracking(self, account: str, difference: float) -> None:
        """The compare command's final tracking difference (a NaN is not recorded)."""
        if math.isfinite(difference):
            self.tracking_difference.labels(account).set(difference)

    def push(self, gateway_url: str | None, account: str) -> str | None:
        """Add these figures to the account's group (POST: a family not pushed keeps its value); the
        error text, None when it went out (or no gateway is configured)."""
        key = {"account": account}
        return push_reporting(self.registry, gateway_url, TRADE_JOB, key, replace=False)


@functools.cache
def trading_metrics() -> TradingMetrics:
    """The process-wide figures on the default registry, made on first use."""
    return TradingMetrics()
