"""Declaring metric families: each set says its names, help and labels, never the registry."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class Families:
    """Counters, gauges and histograms on one registry, every one labelled first by
    ``leading`` (the trading figures' ``account``)."""

    def __init__(self, registry: CollectorRegistry, *leading: str) -> None:
        self.registry = registry
        self.leading = leading

    def counter(self, name: str, documentation: str, *labels: str) -> Counter:
        return Counter(name, documentation, [*self.leading, *labels], registry=self.registry)

    def gauge(self, name: str, documentation: str, *labels: str, **options: Any) -> Gauge:
        """``options``: ``multiprocess_mode``, how ``--workers N`` combines the processes'."""
        labelnames = [*self.leading, *labels]
        return Gauge(name, documentation, labelnames, registry=self.registry, **options)

    def histogram(
        self, name: str, documentation: str, buckets: Sequence[float], *labels: str
    ) -> Histogram:
        labelnames = [*self.leading, *labels]
        return Histogram(name, documentation, labelnames, buckets=buckets, registry=self.registry)
