"""Fixtures shared by the job tests."""

from __future__ import annotations

import shutil
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from allocator.trainer.jobs.walk_forward.rundir import WalkForwardResult
from allocator.trainer.jobs.walk_forward.runner import run_walk_forward
from tests.postgres import temporary_database
from tests.trainer.jobs.helpers import free_address, migrated_sqlite, tiny


@pytest.fixture(scope="module")
def postgres_database() -> Iterator[str]:
    """A Postgres database of this test module's own (empty, unmigrated), dropped at the end."""
    with temporary_database("allocator_jobs") as url:
        yield url


@pytest.fixture(scope="session")
def pushgateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str | None]:
    """A real Pushgateway (Debian's prometheus-pushgateway) when installed, else None."""
    binary = shutil.which("prometheus-pushgateway") or shutil.which("pushgateway")
    if binary is None:
        yield None
        return
    address = free_address()
    data = tmp_path_factory.mktemp("pushgateway") / "pushgateway.data"
    proc = subprocess.Popen(
        [binary, f"--web.listen-address={address}", f"--persistence.file={data}"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://{address}"
    try:
        for _ in range(100):
            try:
                with urllib.request.urlopen(f"{url}/-/ready", timeout=1) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                time.sleep(0.1)
        else:
            pytest.fail("prometheus-pushgateway did not become ready")
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@dataclass
class LocalRun:
    result: WalkForwardResult
    url: str
    gateway: str | None


@pytest.fixture(scope="session")
def local_run(tmp_path_factory: pytest.TempPathFactory, pushgateway: str | None) -> LocalRun:
    """The tiny config on the local executor, recorded in SQLite, pushed when a gateway runs."""
    tmp = tmp_path_factory.mktemp("walk-forward-local")
    url = migrated_sqlite(tmp)
    extra = [f"database_url={url}"] + ([f"pushgateway_url={pushgateway}"] if pushgateway else [])
    result = run_walk_forward(tiny(tmp, *extra), progress=False)
    return LocalRun(result, url, pushgateway)
