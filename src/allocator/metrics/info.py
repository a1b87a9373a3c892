"""An info metric that switches atomically from one label set to the next."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable, Sequence

from prometheus_client import CollectorRegistry, Gauge
from prometheus_client.metrics_core import InfoMetricFamily, Metric
from prometheus_client.registry import Collector


class CurrentInfo(Collector):
    """An info metric absent until set, then holding exactly one label set.

    ``prometheus_client.Info`` exposes an unlabelled 1 before it is set, and a labelled ``Gauge``
    needs ``clear()`` then ``set(1)``, between which a scrape sees nothing. Under ``serve --workers
    N`` a worker's collector is never scraped, so there it is a gauge ``NAME_info`` whose previous
    label set goes to 0 (files cannot drop a series)."""

    def __init__(
        self, name: str, documentation: str, labelnames: Sequence[str], registry: CollectorRegistry
    ) -> None:
        self._name = name
        self._documentation = documentation
        self._labelnames = tuple(labelnames)
        self._lock = threading.Lock()
        self._value: dict[str, str] | None = None
        self._gauge: Gauge | None = None
        if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            self._gauge = Gauge(
                f"{name}_info",
                documentation,
                self._labelnames,
                registry=None,  # the supervisor's collector reads the files, not a registry
                multiprocess_mode="liveall",
            )
        else:
            registry.register(self)

    def set(self, **labels: str) -> None:
        if set(labels) != set(self._labelnames):
            raise ValueError(f"{self._name} takes labels {self._labelnames}, got {tuple(labels)}")
        value = {k: str(v) for k, v in labels.items()}
        with self._lock:
            previous, self._value = self._value, value
            if self._gauge is not None:
                self._gauge.labels(**value).set(1)
                if previous is not None and previous != value:
                    self._gauge.labels(**previous).set(0)

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
