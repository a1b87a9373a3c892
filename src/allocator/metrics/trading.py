"""Figures of the trading cycle: reconciliation mismatches, halts, orders, cycles.

A mismatch between the broker and the recorded book halts the account; the counter is what an
alert fires on (``allocator_trading_reconciliation_mismatches_total`` increasing), the gauge
says which accounts stay halted until an operator resumes them.
"""

from __future__ import annotations

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge


class TradingMetrics:
    """The trading figures, registered once per registry (the process default unless given)."""

    def __init__(self, registry: CollectorRegistry = REGISTRY) -> None:
        self.mismatches = Counter(
            "allocator_trading_reconciliation_mismatches_total",
            "Reconciliations that found the broker's positions differ from the recorded ones.",
            ["account"],
            registry=registry,
        )
        self.halted = Gauge(
            "allocator_trading_account_halted",
            "1 while the account is halted (a failed reconciliation), else 0.",
            ["account"],
            registry=registry,
        )
        self.orders = Counter(
            "allocator_trading_orders_total",
            "Orders settled by the broker, by final status (filled, partially_filled, rejected).",
            ["account", "status"],
            registry=registry,
        )
        self.cycles = Counter(
            "allocator_trading_cycles_total",
            "Trading cycles run, by outcome (done, already_done, failed).",
            ["account", "outcome"],
            registry=registry,
        )


_DEFAULT: TradingMetrics | None = None


def trading_metrics() -> TradingMetrics:
    """The process-wide figures on the default registry, made on first use."""
    global _DEFAULT
    if _DEFAULT is None:
        _DEFAULT = TradingMetrics()
    return _DEFAULT
