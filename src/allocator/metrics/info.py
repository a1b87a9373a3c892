"""An info metric that switches atomically from one label set to the next."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable, Sequence

from prometheus_client import CollectorRegistry, Gauge
from prometheus_client.metrics_core import InfoMetricFamily, Metric
from prometheus_client.registry import Collector


class CurrentInfo(Collector):
    """An info metric that is absent until set and holds exactly one label set afterwards.

    ``prometheus_client.Info`` exposes ``name_info 1`` with no labels before it is set, and a
    labelled ``Gauge`` needs ``clear()`` then ``set(1)``, between which a scrape sees nothing.
    Here the switch is one assignment under a lock: a scrape sees the old set or the new one.

    In prometheus-client's multiprocess mode (``allocator serve --workers N``) a custom
    collector in a worker is never scraped: the supervisor reads the workers' value files. There
    the metric is a gauge ``NAME_info`` with a ``pid`` label per worker, and a switch sets the
    new label set to 1 and the previous one to 0 (multiprocess files cannot drop a series).
    """

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
