"""``allocator serve --workers N``: N server processes on one port, under one supervisor.

One Python process answers on about one core (the GIL), so a bigger host runs several. The
supervisor reserves the port with a bound, never listening, SO_REUSEPORT socket, so the port
stays theirs across worker restarts and ``--port 0`` has a number before any worker binds.
Each worker is a fresh interpreter (no grpc state inherited through fork) with its own spool
(``worker_config``); if the supervisor is killed, the kernel kills its workers
(``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import ctypes
import logging
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from allocator.serving.config import ServerConfig
from allocator.serving.stop_signals import StopSignals

__all__ = ["Supervisor", "reserve_port", "worker_config"]

log = logging.getLogger("allocator.serving.workers")

CONFIG_ENV = "ALLOCATOR_WORKER_CONFIG"
INDEX_ENV = "ALLOCATOR_WORKER_INDEX"
PARENT_ENV = "ALLOCATOR_WORKER_PARENT"
READY = b"ready\n"
RESTART_DELAY_SECONDS = 1.0
"""Doubled (up to the max) for each death in a row within ``STABLE_SECONDS`` of a start."""
MAX_RESTART_DELAY_SECONDS = 30.0
STABLE_SECONDS = 30.0
START_SECONDS = 300.0
"""How long the workers get to load their models and serve."""
_PR_SET_PDEATHSIG = 1
METRICS_DIR_PREFIX = "allocator-metrics-"
"""``TMPDIR/allocator-metrics-<supervisor pid>-<random>`` holds the workers' metric files."""


def _sweep_metrics_dirs() -> None:
    """Remove the metric directories of supervisors that are gone (a SIGKILL leaves one)."""
    for path in Path(tempfile.gettempdir()).glob(f"{METRICS_DIR_PREFIX}*-*"):
        pid = path.name.removeprefix(METRICS_DIR_PREFIX).split("-", 1)[0]
        if not pid.isdigit() or path.stat().st_uid != os.getuid():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(path, ignore_errors=True)
        except PermissionError:
            continue


def reserve_port(host: str, port: int) -> tuple[int, list[socket.socket]]:
    """Bind (not listen) SO_REUSEPORT sockets on every address of ``host``, keeping processes
    without SO_REUSEPORT off the port; the port and the sockets to keep open."""
    addresses = socket.getaddrinfo(
        host.strip("[]") or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )
    for _ in range(20):  # port 0 may be free on one address and taken on the next: retry
        sockets: list[socket.socket] = []
        try:
            for family, kind, proto, _, address in addresses:
                sock = socket.socket(family, kind, proto)
                sockets.append(sock)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
                if family == socket.AF_INET6 and host.strip("[]") in {"::", ""}:
                    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
                chosen = sockets[0].getsockname()[1] if len(sockets) > 1 else port
                sock.bind((address[0], chosen, *address[2:]))
            return sockets[0].getsockname()[1], sockets
        except OSError:
            for sock in sockets:
                sock.close()
            if port != 0:
                raise
    raise OSError(f"cannot reserve a port on {host} for every address")


def worker_config(config: ServerConfig, index: int, port: int) -> ServerConfig:
    spool = config.spool_dir if index == 0 else config.spool_dir / f"worker-{index}"
    return config.model_copy(
        update={"port": port, "metrics_port": None, "spool_dir": spool, "workers": 1}
    )


@dataclass(eq=False)
class _Worker:
    index: int
    proc: subprocess.Popen[bytes]
    started: float = field(default_factory=time.monotonic)
    ready: bool = False

    def close(self) -> None:
        if self.proc.stdout is not None:
            self.proc.stdout.close()


class Supervisor:
    """Starts the workers, serves their metrics, restarts the ones that die, drains them all."""

    def __init__(self, config: ServerConfig) -> None:
        from prometheus_client import CollectorRegistry

        # Only a supervisor reads the workers' files: imported with prometheus_client, here.
        from allocator.metrics.serving import WorkerFilesCollector, worker_restarts_counter

        self.config = config
        self.port, self._reserved = reserve_port(config.host, config.port)
        _sweep_metrics_dirs()
        self._metrics_dir = tempfile.mkdtemp(prefix=f"{METRICS_DIR_PREFIX}{os.getpid()}-")
        self._env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": self._metrics_dir}
        self.metrics_registry = CollectorRegistry()
        WorkerFilesCollector(self.metrics_registry, path=self._metrics_dir)
        self.restarts = worker_restarts_counter(self.metrics_registry)
        self.metrics_port: int | None = None
        self._metrics_http: object | None = None
        self.workers: list[_Worker] = []
        self._quick_deaths: dict[int, int] = {}  # worker index -> deaths in a row soon after start
        # A flag, not a threading.Event: the signal handler sets it while the main thread may
        # hold the Event's lock in wait(), and that lock is not reentrant (a deadlock).
        self._stopping = False

    @property
    def target(self) -> str:
        return self.config.dial_target(self.port)

    def _spawn(self, index: int) -> _Worker:
        config = worker_config(self.config, index, self.port)
        env = {
            **self._env,
            CONFIG_ENV: config.model_dump_json(),
            INDEX_ENV: str(index),
            PARENT_ENV: str(os.getpid()),
        }
        command = [sys.executable, "-m", "allocator.serving.workers"]
        proc = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE)
        return _Worker(index, proc)

    def start(self) -> Supervisor:
        """Start every worker and wait until each serves; ``RuntimeError`` if one fails first."""
        if self.config.record:
            self._prepare_recording()
        log.info(
            "starting %d workers; their metrics files in %s", self.config.workers, self._metrics_dir
        )
        self.workers = [self._spawn(k) for k in range(self.config.workers)]
        deadline = time.monotonic() + START_SECONDS
        while not all(w.ready for w in self.workers):
            for w in self.workers:
                if not w.ready and w.proc.poll() is not None:
                    self._abort()
                    raise RuntimeError(
                        f"worker {w.index} exited with code {w.proc.returncode} before serving"
                    )
            if time.monotonic() > deadline:
                self._abort()
                raise RuntimeError(f"the workers did not start within {START_SECONDS:g} s")
            self._read_pipes(0.2)
        self._metrics_http, self.metrics_port = self.config.serve_metrics(self.metrics_registry)
        return self

    def _prepare_recording(self) -> None:
        """Warn of spools no worker replays; switch a SQLite database to WAL once, so the workers
        do not race for its lock."""
        for path in sorted(self.config.spool_dir.glob("worker-*")):
            index = path.name.removeprefix("worker-")
            if index.isdigit() and int(index) >= self.config.workers and any(path.iterdir()):
                log.warning(
                    "%s holds a spool no worker replays now: run --workers %d once to replay it",
                    path,
                    int(index) + 1,
                )
        import sqlite3

        # The supervisor imports the recording layer only when it records, and only here.
        from allocator.recording.settings import database_url
        from allocator.recording.sinks import prepare_sqlite

        url = self.config.database_url or database_url()
        try:
            prepare_sqlite(url)
        except sqlite3.Error as exc:
            log.warning("cannot switch %s to WAL before the workers start: %s", url, exc)

    def _read_pipes(self, timeout: float) -> None:
        pipes = {w.proc.stdout.fileno(): w for w in self.workers if w.proc.stdout and not w.ready}
        if not pipes:
            time.sleep(timeout)
            return
        readable, _, _ = select.select(list(pipes), [], [], timeout)
        for fd in readable:
            worker = pipes[fd]
            worker.ready = os.read(fd, len(READY)) == READY
            if worker.ready and worker.proc.poll() is None:
                log.info("worker %d (pid %d) serving", worker.index, worker.proc.pid)

    def run(self) -> None:
        """Until ``stop()``: restart any worker that exits, after a growing pause."""
        while not self._stopping:
            for k, worker in enumerate(self.workers):
                code = worker.proc.poll()
                if code is None or self._stopping:
                    continue
                log.error(
                    "worker %d (pid %d) exited with code %d; starting it again",
                    worker.index,
                    worker.proc.pid,
                    code,
                )
                self._forget(worker)
                quick = time.monotonic() - worker.started < STABLE_SECONDS
                deaths = self._quick_deaths.get(worker.index, 0) + 1 if quick else 1
                self._quick_deaths[worker.index] = deaths
                delay = min(MAX_RESTART_DELAY_SECONDS, RESTART_DELAY_SECONDS * 2 ** (deaths - 1))
                deadline = time.monotonic() + delay
                while not self._stopping and time.monotonic() < deadline:
                    time.sleep(0.05)
                if self._stopping:
                    break
                self.workers[k] = self._spawn(worker.index)
                self.restarts.inc()
            self._read_pipes(0.1)

    def stop(self) -> None:
        self._stopping = True

    def drain(self) -> bool:
        """SIGTERM every worker and wait for each to drain; True when all exited 0."""
        self._stopping = True
        timeout = self.config.drain_seconds + self.config.grace_seconds + 90
        for worker in self.workers:
            if worker.proc.poll() is None:
                worker.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        clean = True
        for worker in self.workers:
            try:
                code = worker.proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.error("worker %d did not drain within %g s: killed", worker.index, timeout)
                worker.proc.kill()
                code = worker.proc.wait()
            if code != 0:
                log.error("worker %d exited with code %d", worker.index, code)
                clean = False
            self._forget(worker)
        self._close()
        return clean

    def _forget(self, worker: _Worker) -> None:
        from prometheus_client.multiprocess import mark_process_dead

        worker.close()
        mark_process_dead(worker.proc.pid, self._metrics_dir)

    def _abort(self) -> None:
        for worker in self.workers:
            if worker.proc.poll() is None:
                worker.proc.kill()
            worker.proc.wait()
            worker.close()
        self._close()

    def _close(self) -> None:
        if self._metrics_http is not None:
            self._metrics_http.shutdown()  # type: ignore[attr-defined]
            self._metrics_http = None
        for sock in self._reserved:
            sock.close()
        shutil.rmtree(self._metrics_dir, ignore_errors=True)


def _die_with_parent(parent: int) -> None:
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:
        os._exit(1)


def worker_main() -> int:
    """Build, announce, serve until SIGTERM/SIGINT, drain; exit 2 when it cannot be built."""
    index = int(os.environ[INDEX_ENV])
    _die_with_parent(int(os.environ[PARENT_ENV]))
    # stdout is the readiness pipe, read once: keep it aside and send anything else printed to
    # stderr, so that no library's output fills a pipe nobody reads any more.
    ready_fd = os.dup(sys.stdout.fileno())
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    logging.basicConfig(
        level=logging.INFO,
        format=f"%(asctime)s %(levelname)s %(name)s[worker {index}]: %(message)s",
    )
    stopping = StopSignals()

    # heavy (grpc, onnxruntime, sqlalchemy): imported once the signal handlers are set, so a
    # SIGTERM that arrives during the seconds of imports drains the worker instead of killing it
    from allocator.recording.sinks import SchemaMissingError
    from allocator.registry.errors import ModelLoadError
    from allocator.serving.server import build_server

    config = ServerConfig.model_validate_json(os.environ[CONFIG_ENV])
    try:
        server = build_server(config, reuse_port=True)
    except (ModelLoadError, SchemaMissingError, ValueError, OSError) as exc:
        print(f"Error: worker {index}: {exc}", file=sys.stderr, flush=True)
        return 2
    server.start()
    os.write(ready_fd, READY)
    os.close(ready_fd)
    stopping.wait()
    server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(worker_main())
