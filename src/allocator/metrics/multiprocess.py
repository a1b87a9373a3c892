"""The supervisor's view of its workers' metric files, robust to a worker mid-start.

prometheus-client's ``MmapedDict`` creates a worker's value file and only then sizes it, so for
a moment the file exists at 0 bytes; ``MultiProcessCollector.collect`` reading it then raises
``struct.error`` and the whole scrape fails (HTTP 500), every other worker's figures with it.
A worker killed in that moment leaves the empty file for good, and every later scrape fails
(prometheus/client_python#1199, unfixed in 0.26). An empty file holds no value yet, so skipping
it loses nothing.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.metrics_core import Metric
from prometheus_client.multiprocess import MultiProcessCollector


def worker_restarts_counter(registry: CollectorRegistry) -> Counter:
    """The supervisor's count of workers it started again: a worker cannot count its own death,
    so this lives in the supervisor's registry, beside the workers' summed files."""
    return Counter(
        "allocator_serving_worker_restarts_total",
        "Worker processes of this server started again after they died unexpectedly.",
        registry=registry,
    )


class WorkerFilesCollector(MultiProcessCollector):
    """``MultiProcessCollector`` that skips value files not yet sized (nothing written)."""

    def collect(self) -> Iterable[Metric]:
        return self.merge(sized_files(glob.glob(os.path.join(self._path, "*.db"))), accumulate=True)


def sized_files(paths: Iterable[str]) -> list[str]:
    """The files with a header to read; one gone since the glob is skipped too (its worker was
    marked dead), as ``MultiProcessCollector`` skips a vanished live-gauge file."""
    out = []
    for path in paths:
        try:
            if os.path.getsize(path) > 0:
                out.append(path)
        except FileNotFoundError:
            continue
    return out
