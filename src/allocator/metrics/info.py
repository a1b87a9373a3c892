"""An info metric that switches atomically from one label set to the next."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import InfoMetricFamily, Metric
from prometheus_client.registry import Collector


class CurrentInfo(Collector):
    """An info metric that is absent until set and holds exactly one label set afterwards.

    ``prometheus_client.Info`` exposes ``name_info 1`` with no labels before it is set, and a
    labelled ``Gauge`` needs ``clear()`` then ``set(1)``, between which a scrape sees nothing.
    Here the switch is one assignment under a lock: a scrape sees the old set or the new one.
    """

    def __init__(
        self, name: str, documentation: str, labelnames: Sequence[str], registry: CollectorRegistry
    ) -> None:
        self._name = name
        self._documentation = documentation
        self._labelnames = tuple(labelnames)
        self._lock = threading.Lock()
        self._value: dict[str, str] | None = None
        registry.register(self)

    def set(self, **labels: str) -> None:
        if set(labels) != set(self._labelnames):
            raise ValueError(f"{self._name} takes labels {self._labelnames}, got {tuple(labels)}")
        value = {k: str(v) for k, v in labels.items()}
        with self._lock:
            self._value = value

    def describe(self) -> Iterable[Metric]:
        """Names only, so that the registry detects a duplicate registration."""
        return [InfoMetricFamily(self._name, self._documentation)]

    def collect(self) -> Iterable[Metric]:
        family = InfoMetricFamily(self._name, self._documentation)
        with self._lock:
            value = self._value
        if value is not None:
            family.add_metric([], value)
        return [family]
