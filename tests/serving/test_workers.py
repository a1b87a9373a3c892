"""``allocator serve --workers 2``: two server processes on one port, one supervisor.

Real processes throughout: the supervisor is ``allocator serve`` in a subprocess, and the tests
read what an operator would (its /metrics endpoint, its stderr, the trade database), plus the
workers' multiprocess metric files, to tell which worker answered. Covered here: the refusal
without a shared store, one /metrics endpoint summing every worker, a killed worker started
again while the other keeps answering, and hot reload under load reaching every worker. The
SIGTERM drain and the two-replica tests run with ``--workers 2`` in their own modules.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.mmap_dict import MmapedDict
from prometheus_client.parser import text_string_to_metric_families

from allocator.registry.errors import CHECKSUM_MISMATCH
from allocator.registry.pointer import write_production_pointer
from allocator.serving.client import AllocatorClient
from tests.serving.conftest import TINY, delete_prefixed, write_tiny_model
from tests.serving.load import (
    OWN_CONNECTION,
    LoadThread,
    ServeProcess,
    price_path,
    wait_until,
)
from tests.serving.test_server_process import (
    recorded,
    registered_models,
    runs,
    sqlite_database,
    stage_version,
)

REQUESTS = 'allocator_serving_requests_total{grpc_code="OK",grpc_method="Allocate"}'


class Workers:
    """``allocator serve --workers 2`` and what it prints: target, metrics port, files dir."""

    def __init__(self, args: list[str], cwd: Path) -> None:
        self.process = ServeProcess(["--workers", "2", "--metrics-port", "0", *args], cwd=cwd)
        self.target = self.process.wait_ready()
        stderr = self.process.stderr
        self.metrics_port = int(re.findall(r"metrics on port (\d+)", stderr)[-1])
        self.metrics_dir = Path(re.findall(r"their metrics files in (\S+)", stderr)[-1])

    def scrape(self) -> dict[str, float]:
        """Every sample of the one /metrics endpoint, keyed ``name{label="value",...}``."""
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as reply:
            text = reply.read().decode()
        samples = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
                samples[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
        return samples

    def model_versions(self) -> dict[str, str]:
        """pid -> the version each worker's model info reads 1 for (its default)."""
        out = {}
        for key, value in self.scrape().items():
            if key.startswith("allocator_serving_model_info{") and value == 1:
                labels = dict(re.findall(r'(\w+)="([^"]*)"', key))
                out[labels["pid"]] = labels["version"]
        return out

    def requests_per_worker(self) -> dict[int, float]:
        """pid -> OK ``Allocate`` calls it counted, from the workers' own metric files."""
        out = {}
        for path in self.metrics_dir.glob("counter_*.db"):
            pid = int(path.stem.rsplit("_", 1)[1])
            for key, value, *_ in MmapedDict.read_all_values_from_file(str(path)):
                _, name, labels, _ = json.loads(key)
                if name == "allocator_serving_requests_total" and labels == {
                    "grpc_method": "Allocate",
                    "grpc_code": "OK",
                }:
                    out[pid] = out.get(pid, 0.0) + value
        return out

    def stop(self) -> int:
        self.process.terminate()
        return self.process.wait(90)


@pytest.fixture
def started() -> Iterator[list[Workers]]:
    servers: list[Workers] = []
    yield servers
    for server in servers:
        server.process.kill()


@pytest.fixture
def tag(redis_url: str) -> Iterator[str]:
    """Portfolio ids of this test only; their Redis state and lock keys go afterwards."""
    import redis

    tag = f"workers-{secrets.token_hex(4)}"
    yield tag
    client = redis.Redis.from_url(redis_url)
    try:
        prefix = f"allocator:state:{tag}"
        delete_prefixed(client, prefix, f"lock:{prefix}")
    finally:
        client.close()


def test_more_than_one_worker_needs_redis(tiny_registry: Path, tmp_path: Path) -> None:
    """Workers answer any portfolio: without a shared store the smoothing would fork."""
    result = subprocess.run(
        [
            *(sys.executable, "-m", "allocator.cli", "serve", "--registry", str(tiny_registry)),
            *("--workers", "2", "--no-record", "--cpu"),
        ],
        cwd=tmp_path,
        env=os.environ,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2, result.stderr
    assert "--workers 2 needs --redis-url" in result.stderr
    assert "Traceback" not in result.stderr


def test_one_metrics_endpoint_sums_both_workers(
    tiny_registry: Path, redis_url: str, tag: str, tmp_path: Path, started: list[Workers]
) -> None:
    args = ["--registry", str(tiny_registry), "--model", "tiny", "--redis-url", redis_url]
    server = Workers([*args, "--no-record", "--cpu"], tmp_path)
    started.append(server)
    # The kernel spreads connections, not calls: 24 clients, a connection each (without
    # OWN_CONNECTION, on a loaded machine, all 120 calls once reached one worker).
    path = price_path(3, TINY.window + 1, seed=3)
    for k in range(24):
        with AllocatorClient(server.target, options=OWN_CONNECTION) as client:
            for i in range(5):
                client.allocate(f"{tag}-{k}", ["A", "B", "C"], path, request_id=f"{tag}-{k}-{i}")
    per_worker = server.requests_per_worker()
    samples = server.scrape()
    assert server.stop() == 0, server.process.stderr

    assert len(per_worker) == 2, per_worker
    assert all(n > 0 for n in per_worker.values()), per_worker
    assert sum(per_worker.values()) == 120
    assert samples[REQUESTS] == 120  # one endpoint, both workers summed
    info = [k for k in samples if k.startswith("allocator_serving_model_info{")]
    assert len(info) == 2, info  # one series per worker (pid label)
    assert samples["allocator_serving_worker_restarts_total"] == 0


def test_a_killed_worker_is_started_again_and_calls_go_on(
    tiny_registry: Path, redis_url: str, tag: str, tmp_path: Path, started: list[Workers]
) -> None:
    url, db_path = sqlite_database(tmp_path)
    args = ["--registry", str(tiny_registry), "--model", "tiny", "--redis-url", redis_url]
    server = Workers(
        [*args, "--database-url", url, "--spool-dir", str(tmp_path / "spool"), "--cpu"],
        tmp_path,
    )
    started.append(server)
    pids = set(server.model_versions())
    assert len(pids) == 2
    # Clients with the default retry policy: the call in flight on the killed worker comes
    # back UNAVAILABLE and is retried, on a new connection, by the surviving worker. A portfolio
    # whose Redis lock the killed worker held waits for its liveness key to lapse (0.5 s).
    loaders = [
        LoadThread(server.target, f"{tag}-{k}", window=TINY.window, seed=k, timeout=20)
        for k in range(4)
    ]
    for loader in loaders:
        loader.start()
    try:
        wait_until(lambda: sum(len(x.ok) for x in loaders) >= 100, 60, "100 answered calls")
        victim = sorted(pids)[0]
        os.kill(int(victim), 9)
        wait_until(
            lambda: len(set(server.model_versions()) - pids) == 1, 60, "a new worker serving"
        )
        restarted = server.scrape()["allocator_serving_worker_restarts_total"]
        before = sum(len(x.ok) for x in loaders)
        wait_until(lambda: sum(len(x.ok) for x in loaders) >= before + 100, 60, "100 more calls")
        serving = server.model_versions()
    finally:
        for loader in loaders:
            loader.stop()
        for loader in loaders:
            loader.join(30)
    assert server.stop() == 0, server.process.stderr

    assert restarted == 1
    assert f"(pid {victim}) exited with code -9; starting it again" in server.process.stderr
    assert victim not in serving  # the dead worker's series went
    assert len(serving) == 2
    answered = set()
    for loader in loaders:
        assert loader.error is None, loader.error
        assert not [o for o in loader.outcomes if not o.ok], loader.name
        answered |= {rid for o in loader.ok for rid in o.request_ids}
    # Every OK answer is recorded once, the killed worker's included (durable acks).
    assert set(recorded(db_path)) == answered


def test_reload_under_load_reaches_every_worker(
    redis_url: str, tag: str, tmp_path: Path, started: list[Workers]
) -> None:
    """New version: every worker swaps it in; corrupted: refused; pointer: followed. Each
    client stays on its worker's connection, so each sees 1, then 2, then 1, no failure."""
    registry = tmp_path / "registry"
    model_dir = registry / "tiny"
    write_tiny_model(model_dir / "1")
    url, db_path = sqlite_database(tmp_path)
    server = Workers(
        [
            *("--registry", str(registry), "--redis-url", redis_url, "--reload-interval", "0.2"),
            *("--database-url", url, "--spool-dir", str(tmp_path / "spool"), "--cpu"),
        ],
        tmp_path,
    )
    started.append(server)
    window = TINY.window
    unpinned = [
        LoadThread(server.target, f"{tag}-u{k}", window=window, rate=40, seed=k) for k in range(4)
    ]
    pinned = LoadThread(
        server.target, f"{tag}-p", window=window, rate=40, model="tiny", version="1", seed=9
    )
    loaders = [*unpinned, pinned]

    def answered(version: str, since: list[int] | None = None) -> bool:
        since = since or [0] * len(unpinned)
        return all(
            sum(o.version == version for o in u.outcomes[s:]) >= 20
            for u, s in zip(unpinned, since, strict=True)
        )

    try:
        for loader in loaders:
            loader.start()
        wait_until(lambda: answered("1"), 60, "every client answered by version 1")
        os.rename(stage_version(model_dir), model_dir / "2")
        wait_until(lambda: answered("2"), 60, "every client answered by version 2")
        assert set(server.model_versions().values()) == {"2"}
        assert len(server.model_versions()) == 2

        os.rename(stage_version(model_dir, corrupt=True), model_dir / "3")
        reason = f'allocator_serving_models_refused{{reason="{CHECKSUM_MISMATCH}"}}'
        wait_until(lambda: server.scrape()[reason] == 1, 60, "tiny/3 refused")
        since = [len(u.outcomes) for u in unpinned]
        wait_until(lambda: answered("2", since), 60, "calls answered by 2 after tiny/3")

        write_production_pointer(registry, "tiny", "1")
        since = [len(u.outcomes) for u in unpinned]
        wait_until(lambda: answered("1", since), 60, "every client answered by 1 again")
        versions = server.model_versions()
    finally:
        for loader in loaders:
            loader.stop()
        for loader in loaders:
            loader.join(30)
    assert server.stop() == 0, server.process.stderr

    assert set(versions.values()) == {"1"}
    assert len(versions) == 2
    for loader in loaders:
        assert loader.error is None, loader.error
        failed = [o for o in loader.outcomes if not o.ok]
        assert not failed, f"{loader.name}: {len(failed)} failed calls, first {failed[0]}"
    for loader in unpinned:
        assert [v for v, _ in runs(loader.versions())] == ["1", "2", "1"], loader.name
    assert set(pinned.versions()) == {"1"}
    answers = {o.request_ids[0]: ("tiny", o.version) for loader in loaders for o in loader.outcomes}
    assert recorded(db_path) == answers
    assert registered_models(db_path) == {("tiny", "1"), ("tiny", "2")}
    assert len(answers) == sum(len(x.outcomes) for x in loaders)


def test_the_reserved_port_admits_only_reuseport_sockets() -> None:
    """The supervisor's socket keeps the port: workers (SO_REUSEPORT) bind it, others cannot,
    and as it never listens it takes no connection itself."""
    import socket

    from allocator.serving.workers import reserve_port

    port, reserved = reserve_port("127.0.0.1", 0)
    try:
        assert port > 0
        with socket.socket() as plain, pytest.raises(OSError, match="in use"):
            plain.bind(("127.0.0.1", port))
        with socket.socket() as refused, pytest.raises(ConnectionRefusedError):
            refused.connect(("127.0.0.1", port))
        with socket.socket() as worker:
            worker.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            worker.bind(("127.0.0.1", port))
            worker.listen()
            with socket.create_connection(("127.0.0.1", port), timeout=5):
                accepted, _ = worker.accept()
                accepted.close()
    finally:
        for sock in reserved:
            sock.close()


def test_each_worker_gets_its_own_spool_and_no_metrics_port(tmp_path: Path) -> None:
    """Worker 0 keeps --spool-dir (a switch from one process strands nothing), K > 0 a
    directory of its own; the supervisor alone serves /metrics."""
    from allocator.serving.config import ServerConfig
    from allocator.serving.workers import worker_config

    config = ServerConfig(
        registry=tmp_path, spool_dir=tmp_path / "spool", workers=3, redis_url="redis://x"
    )
    configs = [worker_config(config, k, 5000) for k in range(3)]
    assert [c.spool_dir for c in configs] == [
        tmp_path / "spool",
        tmp_path / "spool" / "worker-1",
        tmp_path / "spool" / "worker-2",
    ]
    assert {(c.port, c.metrics_port, c.workers) for c in configs} == {(5000, None, 1)}


def test_two_workers_start_every_time_on_a_fresh_sqlite_database(
    tiny_registry: Path, redis_url: str, tmp_path: Path
) -> None:
    # Workers opening a new SQLite file together raced for the lock that switching it to WAL
    # takes, and one exited now and then ("database is locked"). bench/worker_starts.py runs
    # the same start 50 times.
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    from worker_starts import start_once

    runs = [
        start_once(tiny_registry, "tiny", redis_url, 2, tmp_path / f"start-{k}", 120)
        for k in range(3)
    ]
    assert [run["ok"] for run in runs] == [True] * 3, runs
