"""A real ``allocator serve --workers 2`` whose worker keeps dying, for the live alert tests.

The supervisor restarts a worker that exits, so nothing but its restart counter tells an
operator that one keeps dying. To make ``AllocatorServingWorkersRestarting`` fire against a
real Prometheus, a thread SIGKILLs worker 0 each time it comes back, ``KILLS`` times (the
supervisor's back-off and the workers' start make that about 15 s).
"""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from pathlib import Path

from allocator.recording.migrations import upgrade
from tests.serving.test_workers import Workers

KILLS = 3
_SERVING = re.compile(r"worker 0 \(pid (\d+)\) serving")


class CrashingWorkers:
    """The supervisor subprocess, its metrics port, and the thread killing its worker 0."""

    def __init__(self, registry: Path, tmp: Path, redis_url: str) -> None:
        tmp.mkdir(parents=True, exist_ok=True)
        database = f"sqlite:///{tmp / 'trades.db'}"
        upgrade(database)
        self.server = Workers(
            [
                *("--registry", str(registry), "--model", "tiny", "--cpu"),
                *("--redis-url", redis_url, "--database-url", database),
                *("--spool-dir", str(tmp / "spool")),
            ],
            tmp,
        )
        self.metrics_port = self.server.metrics_port
        self.killed: list[int] = []
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._kill_worker_0, name="killer", daemon=True)

    def start_killing(self) -> None:
        """Start once Prometheus has scraped the counter at 0: ``increase`` counts only the rise
        it sees, so restarts before the first scrape would not reach the alert."""
        self._thread.start()

    def _pids(self) -> list[int]:
        return [int(p) for p in _SERVING.findall(self.server.process.stderr)]

    def _kill_worker_0(self) -> None:
        try:
            while len(self.killed) < KILLS and not self._stop.is_set():
                fresh = [p for p in self._pids() if p not in self.killed]
                if fresh:
                    os.kill(fresh[-1], signal.SIGKILL)
                    self.killed.append(fresh[-1])
                time.sleep(0.1)
        except BaseException as exc:  # reported by the test, not lost in a thread
            self.error = exc

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(10)
        self.server.stop()
