"""The supervisor's collector over its workers' value files, with a worker caught mid-start.

The workers are real processes writing real prometheus-client multiprocess files; the empty
file is what ``MmapedDict`` leaves between creating a file and sizing it, e.g. when the worker
is killed in that moment.
"""

from __future__ import annotations

import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import generate_latest
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.parser import text_string_to_metric_families

from allocator.metrics.serving import WorkerFilesCollector, sized_files

WORKER = """
from prometheus_client import Counter
Counter("allocator_test_calls_total", "Calls.", registry=None).inc({n})
"""


def _worker(directory: Path, n: int) -> None:
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(directory)}
    subprocess.run([sys.executable, "-c", WORKER.format(n=n)], env=env, check=True)


def _calls(registry: CollectorRegistry) -> float:
    text = generate_latest(registry).decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "allocator_test_calls_total":
                return sample.value
    raise AssertionError(f"no allocator_test_calls_total in {text!r}")


@pytest.fixture
def files(tmp_path: Path) -> Path:
    """Two workers' counters (3 and 4 calls) and the empty file of a third caught mid-start."""
    _worker(tmp_path, 3)
    _worker(tmp_path, 4)
    (tmp_path / "counter_999999.db").touch()
    return tmp_path


def test_the_library_collector_fails_the_whole_scrape_on_an_empty_file(files: Path) -> None:
    """Why the collector exists: if this starts to pass, the library fixed its reader."""
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(files))
    with pytest.raises(struct.error):
        generate_latest(registry)


def test_an_empty_file_is_skipped_and_every_worker_still_counted(files: Path) -> None:
    registry = CollectorRegistry()
    WorkerFilesCollector(registry, path=str(files))
    assert _calls(registry) == 7
    # Once sized and written (the worker got going), its values count too.
    (files / "counter_999999.db").unlink()
    _worker(files, 5)
    assert _calls(registry) == 12


def test_a_file_gone_between_listing_and_reading_is_skipped(files: Path) -> None:
    listed = sorted(str(p) for p in files.glob("*.db"))
    gone = files / "counter_123456.db"
    assert sized_files([*listed, str(gone)]) == [p for p in listed if os.path.getsize(p) > 0]
