"""The server under traffic: hot reload, SIGTERM drain, and replicas sharing state in Redis.

These are the issue's acceptance checks that only mean something while calls are flowing:

- a new version published into the registry (as the exporter does: staged beside, renamed into
  place) takes over unpinned calls with no failed call and no flip-flop; a corrupted version is
  refused while the old one keeps answering; moving the production pointer moves the calls back;
- SIGTERM to ``allocator serve`` under load: every call answered OK is in the decisions table
  (and nothing else is), every refused call is UNAVAILABLE (none hangs), the process exits 0;
- two ``allocator serve`` processes sharing Redis, answering one portfolio alternately, give
  the same sequence as one server answering it alone.
"""

from __future__ import annotations

import os
import re
import secrets
import sqlite3
import uuid
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest

from allocator.recording.migrations import upgrade
from allocator.registry.pointer import write_production_pointer
from allocator.serving.client import Allocation, AllocatorClient
from allocator.serving.server import AllocationServer, ServerConfig, build_server
from tests.serving.conftest import TINY, delete_prefixed, write_tiny_model
from tests.serving.load import HealthWatch, LoadThread, ServeProcess, price_path, wait_until

OK = grpc.StatusCode.OK
UNAVAILABLE = grpc.StatusCode.UNAVAILABLE


# --- helpers -------------------------------------------------------------------------------------


def sqlite_database(directory: Path) -> tuple[str, Path]:
    """A migrated SQLite trade database: its URL and its file."""
    path = directory / "trades.sqlite"
    url = f"sqlite:///{path}"
    upgrade(url)
    return url, path


def recorded(path: Path) -> dict[str, tuple[str, str]]:
    """request id -> (model name, version) of every recorded decision."""
    with sqlite3.connect(path) as db:
        rows = db.execute(
            "SELECT d.request_id, m.name, m.version FROM decisions d "
            "JOIN model_versions m ON m.id = d.model_version_id"
        ).fetchall()
    return {request_id: (name, version) for request_id, name, version in rows}


def registered_models(path: Path) -> set[tuple[str, str]]:
    with sqlite3.connect(path) as db:
        return set(db.execute("SELECT name, version FROM model_versions").fetchall())


def stage_version(model_dir: Path, *, corrupt: bool = False) -> Path:
    """Write a complete version where the exporter stages one (``NAME/.tmp-<uuid>``).

    ``corrupt`` flips one byte of model.onnx after the manifest recorded its sha256: what a
    disk or a copy gone wrong leaves behind.
    """
    staging = write_tiny_model(model_dir / f".tmp-{uuid.uuid4().hex}")
    if corrupt:
        onnx_file = staging / "model.onnx"
        data = bytearray(onnx_file.read_bytes())
        data[len(data) // 2] ^= 0xFF
        onnx_file.write_bytes(bytes(data))
    return staging


def start_server(config: ServerConfig) -> AllocationServer:
    return build_server(config).start()


def runs(versions: list[str]) -> list[tuple[str, int]]:
    """Run-length encoding: ``["1", "1", "2"]`` -> ``[("1", 2), ("2", 1)]``."""
    out: list[tuple[str, int]] = []
    for v in versions:
        if out and out[-1][0] == v:
            out[-1] = (v, out[-1][1] + 1)
        else:
            out.append((v, 1))
    return out


# --- reload under load ---------------------------------------------------------------------------


def test_reload_under_load_switches_versions_without_a_failed_call(tmp_path: Path) -> None:
    """New version: loaded beside, swapped in; corrupted version: refused; pointer: followed."""
    registry = tmp_path / "registry"
    model_dir = registry / "tiny"
    write_tiny_model(model_dir / "1")
    url, db_path = sqlite_database(tmp_path)
    server = start_server(
        ServerConfig(
            registry=registry,
            port=0,
            metrics_port=None,
            reload_interval=0.2,
            database_url=url,
            spool_dir=tmp_path / "spool",
            prefer_cuda=False,
        )
    )
    window = TINY.window
    unpinned = LoadThread(server.target, "reload-unpinned", window=window, rate=150, seed=1)
    pinned = LoadThread(
        server.target, "reload-pinned", window=window, rate=50, model="tiny", version="1", seed=2
    )
    loaders = [unpinned, pinned]

    def answered(version: str, since: int = 0) -> int:
        return sum(o.version == version for o in unpinned.outcomes[since:])

    try:
        for loader in loaders:
            loader.start()
        wait_until(lambda: len(unpinned.outcomes) >= 30, 30, "calls answered by version 1")

        # Publish 2 as `allocator export` does. The staged directory is complete (manifest
        # included) before the rename, so a scan in between must not take it for a version.
        staging = stage_version(model_dir)
        server.registry.refresh()
        assert set(server.registry.snapshot.models) == {("tiny", "1")}
        os.rename(staging, model_dir / "2")
        published_2 = len(unpinned.outcomes)
        wait_until(lambda: answered("2") >= 100, 30, "100 calls answered by version 2")

        # A corrupted 3 is refused by its checksum; 2 keeps answering.
        os.rename(stage_version(model_dir, corrupt=True), model_dir / "3")
        wait_until(lambda: ("tiny", "3") in server.registry.snapshot.refused, 30, "tiny/3 refused")
        refused_3 = len(unpinned.outcomes)
        wait_until(lambda: len(unpinned.outcomes) >= refused_3 + 100, 30, "100 calls after tiny/3")

        # The promotion gate moves production back to 1: unpinned calls follow it.
        write_production_pointer(registry, "tiny", "1")
        pointer_moved = len(unpinned.outcomes)
        wait_until(lambda: answered("1", pointer_moved) >= 100, 30, "100 calls answered by 1 again")
        snapshot = server.registry.snapshot
        failures = dict(server.registry.snapshot.refused)
    finally:
        for loader in loaders:
            loader.stop()
        for loader in loaders:
            loader.join(30)
        server.stop()

    for loader in loaders:
        assert loader.error is None, loader.error
        failed = [o for o in loader.outcomes if not o.ok]
        assert not failed, f"{loader.name}: {len(failed)} failed calls, first {failed[0]}"
    assert set(snapshot.models) == {("tiny", "1"), ("tiny", "2")}
    assert "model.onnx" in failures[("tiny", "3")].message
    assert "sha256" in failures[("tiny", "3")].message

    # Unpinned: 1, then 2 (never back while 2 is production, tiny/3 refused), then 1 again.
    versions = unpinned.versions()
    assert [v for v, _ in runs(versions)] == ["1", "2", "1"], runs(versions)
    (_, n1), (_, n2), (_, n3) = runs(versions)
    assert n1 >= published_2  # nothing answered by 2 before it was published
    assert n1 + n2 >= pointer_moved  # 2 answered through tiny/3's refusal, until the pointer
    assert n1 + n2 > refused_3
    assert n3 >= 100
    # Pinned to 1: loaded beside 2, so it answered throughout.
    assert set(pinned.versions()) == {"1"}

    # Every answer was recorded under the version that gave it; the refused version never was.
    answers = {o.request_ids[0]: ("tiny", o.version) for loader in loaders for o in loader.outcomes}
    assert recorded(db_path) == answers
    assert registered_models(db_path) == {("tiny", "1"), ("tiny", "2")}


# --- SIGTERM under load --------------------------------------------------------------------------


@pytest.fixture
def serve_processes() -> Iterator[list[ServeProcess]]:
    """Processes a test starts; killed afterwards if the test left any running."""
    processes: list[ServeProcess] = []
    yield processes
    for process in processes:
        process.kill()


@pytest.mark.parametrize("workers", [1, 2], ids=["one-process", "workers-2"])
def test_sigterm_under_load_answers_and_records_every_accepted_call(
    workers: int,
    portfolio_tag: str,
    tmp_path: Path,
    serve_processes: list[ServeProcess],
    request: pytest.FixtureRequest,
) -> None:
    """Drain: NOT_SERVING, in-flight calls finish, later calls UNAVAILABLE, all OKs recorded.

    With ``--workers 2`` every worker drains (each client's connection is to one of them) and
    records into the same database; the supervisor exits 0 once both did.
    """
    registry = tmp_path / "registry"
    write_tiny_model(registry / "tiny" / "1")
    url, db_path = sqlite_database(tmp_path)
    shared = (
        ["--workers", str(workers), "--redis-url", request.getfixturevalue("redis_url")]
        if workers > 1
        else []
    )
    server = ServeProcess(
        [
            *("--registry", str(registry), "--database-url", url),
            *("--spool-dir", str(tmp_path / "spool"), "--metrics-port", "0", "--cpu"),
            *shared,
        ],
        cwd=tmp_path,
    )
    serve_processes.append(server)
    target = server.wait_ready()
    watch = HealthWatch(target)
    watch.start()
    wait_until(lambda: watch.statuses == ["SERVING"], 30, "the health watch to report SERVING")

    # Closed-loop clients (a call in flight nearly all the time), one of them sending batches.
    # Without retries: the test is about what the draining server answers, and a retrying client
    # would carry its refused calls past the drain to the closed port (with replicas behind a
    # balancer, to another replica).
    loaders = [
        LoadThread(
            target, f"{portfolio_tag}-{k}", window=TINY.window, max_failures=3, seed=k, retry=None
        )
        for k in range(3)
    ]
    loaders.append(
        LoadThread(
            target,
            f"{portfolio_tag}-batch",
            window=TINY.window,
            batch=64,
            max_failures=3,
            seed=9,
            retry=None,
        )
    )
    for loader in loaders:
        loader.start()
    try:
        wait_until(
            lambda: (
                sum(len(loader.ok) for loader in loaders) >= 300
                and all(loader.ok for loader in loaders)
            ),
            60,
            "300 answered calls from every client",
        )
        server.terminate()
        code = server.wait(60)
    finally:
        for loader in loaders:
            loader.join(60)  # each stops after 3 failures in a row: the server is gone
        watch.join(30)

    assert code == 0, server.stderr
    assert "draining" in server.stderr
    assert "allocation server stopped" in server.stderr
    for k in range(workers if workers > 1 else 0):
        assert f"[worker {k}]: allocation server stopped" in server.stderr
    assert not re.search(r"\b(ERROR|Traceback)\b", server.stderr), server.stderr
    # The health watch saw the flip before the port closed.
    assert watch.statuses == ["SERVING", "NOT_SERVING"], (watch.statuses, watch.end)

    answered: set[str] = set()
    drained: list[str] = []
    for loader in loaders:
        assert loader.error is None, loader.error
        assert not loader.is_alive()
        codes = [o.code for o in loader.outcomes]
        # OK until shutdown began, then UNAVAILABLE (not a hang, not a cancelled call).
        assert set(codes) == {OK, UNAVAILABLE}, {o.code: o.details for o in loader.outcomes}
        first_refused = codes.index(UNAVAILABLE)
        assert all(c is OK for c in codes[:first_refused])
        assert all(c is UNAVAILABLE for c in codes[first_refused:]), loader.name
        drained.append(loader.outcomes[first_refused].details)
        answered.update(rid for o in loader.ok for rid in o.request_ids)
    assert len(answered) >= 300
    # The drain answered the first refusals itself, before the port closed.
    assert any("shutting down" in details for details in drained), drained
    # Exactly the calls answered OK were recorded: none lost in the drain, none extra.
    assert set(recorded(db_path)) == answered


# --- two replicas sharing Redis ------------------------------------------------------------------


def alternating_steps(n: int = 30, seed: int = 11) -> list[tuple[list[str], np.ndarray]]:
    """A price path for one portfolio; one asset is swapped for another halfway through."""
    path = price_path(4, n + TINY.window + 1, seed)
    rows = {"A0": 0, "A1": 1, "A2": 2, "A3": 3}
    steps = []
    for t in range(n):
        assets = ["A0", "A1", "A2"] if t < n // 2 else ["A0", "A1", "A3"]
        prices = path[[rows[a] for a in assets], t : t + TINY.window + 1]
        steps.append((assets, prices))
    return steps


def replay(targets: list[str], portfolio_id: str) -> list[Allocation]:
    """The steps in order, step ``i`` to ``targets[i % len(targets)]``, no current weights."""
    clients = [AllocatorClient(target) for target in targets]
    try:
        return [
            clients[i % len(clients)].allocate(
                portfolio_id, assets, prices, request_id=f"{portfolio_id}-{i}"
            )
            for i, (assets, prices) in enumerate(alternating_steps())
        ]
    finally:
        for client in clients:
            client.close()


@pytest.fixture
def shared_portfolio(redis_url: str) -> Iterator[str]:
    """A portfolio id no other test uses; its Redis state and lock keys go afterwards.

    The servers keep state under the default ``allocator:state:`` prefix, so the id itself
    keeps these keys apart from every other test's.
    """
    import redis

    portfolio_id = f"replicas-{secrets.token_hex(6)}"
    yield portfolio_id
    client = redis.Redis.from_url(redis_url)
    try:
        delete_prefixed(
            client, f"allocator:state:{portfolio_id}", f"lock:allocator:state:{portfolio_id}"
        )
    finally:
        client.close()


@pytest.fixture(scope="module")
def replica_registry(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("replica-registry")
    write_tiny_model(root / "tiny" / "1")
    return root


@pytest.fixture(scope="module")
def reference(replica_registry: Path) -> list[Allocation]:
    """The sequence one server with in-memory state gives."""
    server = start_server(
        ServerConfig(
            registry=replica_registry,
            port=0,
            metrics_port=None,
            record=False,
            prefer_cuda=False,
        )
    )
    try:
        return replay([server.target], "reference")
    finally:
        server.stop()


def assert_same_sequence(got: list[Allocation], want: list[Allocation]) -> None:
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g.asset_ids == w.asset_ids, i
        np.testing.assert_allclose(g.raw_weights, w.raw_weights, rtol=0, atol=1e-12, err_msg=i)
        np.testing.assert_allclose(
            g.smoothed_weights, w.smoothed_weights, rtol=0, atol=1e-12, err_msg=str(i)
        )
        assert g.turnover == pytest.approx(w.turnover, abs=1e-12), i
        assert (g.icm_reward is None) == (w.icm_reward is None), i
        if w.icm_reward is not None:
            assert g.icm_reward == pytest.approx(w.icm_reward, abs=1e-9), i


def test_reference_sequence_depends_on_the_carried_state(reference: list[Allocation]) -> None:
    """The comparison below is sensitive: each step smooths from, and the ICM reads, the last."""
    half = len(reference) // 2
    assert [a.icm_reward is None for a in reference] == [
        i in (0, half) for i in range(len(reference))
    ]  # first step, and the step whose universe changed: no transition for the ICM
    for a in reference[1:]:
        assert not np.allclose(a.smoothed_weights, a.raw_weights, atol=1e-6)


def test_two_in_process_servers_sharing_redis_match_one_server(
    replica_registry: Path, redis_url: str, shared_portfolio: str, reference: list[Allocation]
) -> None:
    config = ServerConfig(
        registry=replica_registry,
        port=0,
        metrics_port=None,
        record=False,
        redis_url=redis_url,
        prefer_cuda=False,
    )
    servers = [start_server(config), start_server(config)]
    try:
        got = replay([s.target for s in servers], shared_portfolio)
    finally:
        for s in servers:
            s.stop()
    assert_same_sequence(got, reference)


@pytest.mark.parametrize("workers", [1, 2], ids=["one-process", "workers-2"])
def test_two_server_processes_sharing_redis_match_one_server(
    workers: int,
    replica_registry: Path,
    redis_url: str,
    shared_portfolio: str,
    reference: list[Allocation],
    serve_processes: list[ServeProcess],
    tmp_path: Path,
) -> None:
    """``allocator serve`` x 2, one Redis: A, B, A, B, ... equals one server's sequence (with
    ``--workers 2``, four processes behind two ports)."""
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        serve_processes.append(
            ServeProcess(
                [
                    "--registry",
                    str(replica_registry),
                    "--redis-url",
                    redis_url,
                    "--no-record",
                    "--metrics-port",
                    "0",
                    "--cpu",
                    *("--workers", str(workers)),
                ],
                cwd=tmp_path / name,
            )
        )
    targets = [p.wait_ready() for p in serve_processes]
    assert targets[0] != targets[1]
    got = replay(targets, shared_portfolio)
    for process in serve_processes:
        process.terminate()
    for process in serve_processes:
        assert process.wait(60) == 0, process.stderr
    assert_same_sequence(got, reference)
