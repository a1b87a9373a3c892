"""The supervisor's view of its workers' metric files, robust to a worker mid-start:
prometheus-client creates a value file and only then sizes it, and reading it at 0 bytes fails
the whole scrape, for good if the worker died then (prometheus/client_python#1199). An empty file
holds no value yet, so it is skipped."""

from __future__ import annotations

import contextlib
import glob
import os
from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.metrics_core import Metric
from prometheus_client.multiprocess import MultiProcessCollector


def worker_restarts_counter(registry: CollectorRegistry) -> Counter:
    """The supervisor's count of restarted workers (a worker cannot count its own death)."""
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
    """The files with a header to read; one gone since the glob is skipped too."""
    out = []
    for path in paths:
        with contextlib.suppress(FileNotFoundError):
            if os.path.getsize(path) > 0:
                out.append(path)
    return out
