"""kill -9 under load: every call answered OK is recorded, exactly once.

A real ``allocator serve`` records into a database with a spool directory while closed-loop
clients send ``Allocate`` calls with unique request ids. The server is SIGKILLed mid-load
(no drain, no flush), restarted on the same spool and database, loaded and killed again, and
finally stopped with SIGTERM. With durable acknowledgement an OK answer means the decision was
committed or fsync'd before it was sent, so no kill may lose one. The Postgres variant cuts the
path to the database before one of the kills, so that round's answers live only in the spool
until the restarted server replays them.
"""

from __future__ import annotations

import secrets
import sqlite3
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool

from allocator.recording.migrations import upgrade
from allocator.serving.client import AllocatorClient
from tests.postgres import reset_schema
from tests.recording.proxy import TcpProxy
from tests.serving.conftest import TINY, write_tiny_model
from tests.serving.load import OWN_CONNECTION, LoadThread, ServeProcess, price_path, wait_until

KILLS = 3
CLIENTS = 4


def sqlite_rows(path: Path) -> Callable[[], list[str]]:
    def read() -> list[str]:
        with sqlite3.connect(path) as db:
            return [row[0] for row in db.execute("SELECT request_id FROM decisions")]

    return read


def postgres_rows(url: str) -> Callable[[], list[str]]:
    def read() -> list[str]:
        engine = create_engine(url, poolclass=NullPool)
        try:
            with engine.connect() as conn:
                return list(conn.execute(text("SELECT request_id FROM decisions")).scalars())
        finally:
            engine.dispose()

    return read


@pytest.fixture
def serve_processes() -> Iterator[list[ServeProcess]]:
    """Processes a test starts; killed afterwards if the test left any running."""
    processes: list[ServeProcess] = []
    yield processes
    for process in processes:
        process.kill()


def serve(args: list[str], cwd: Path, processes: list[ServeProcess]) -> tuple[ServeProcess, str]:
    server = ServeProcess(args, cwd=cwd)
    processes.append(server)
    return server, server.wait_ready()


def load_then_kill(
    target: str,
    server: ServeProcess,
    round_: int,
    before_kill: Callable[[], None] | None = None,
    tag: str = "",
) -> set[str]:
    """Closed-loop clients (no retries: each call's first answer counts) until enough calls
    were answered, then SIGKILL while calls are in flight; the ids answered OK."""
    loaders = [
        LoadThread(
            target,
            f"{tag}kill{round_}-{k}",
            window=TINY.window,
            max_failures=3,
            seed=k,
            retry=None,
            timeout=10,
        )
        for k in range(CLIENTS)
    ]
    for loader in loaders:
        loader.start()
    try:
        wait_until(
            lambda: sum(len(loader.ok) for loader in loaders) >= 150,
            60,
            f"150 answered calls in round {round_}",
        )
        if before_kill is not None:
            before_kill()
        server.proc.kill()
        server.wait(30)
    finally:
        for loader in loaders:
            loader.stop()
            loader.join(30)
    answered: set[str] = set()
    for loader in loaders:
        assert loader.error is None, loader.error
        answered.update(rid for o in loader.ok for rid in o.request_ids)
    # The kill landed while calls were in flight (otherwise it would prove nothing).
    assert any(not o.ok for loader in loaders for o in loader.outcomes)
    return answered


def kill_and_restart(
    args: list[str],
    cwd: Path,
    processes: list[ServeProcess],
    before_kill: dict[int, Callable[[], None]] | None = None,
    after_kill: dict[int, Callable[[], None]] | None = None,
    tag: str = "",
) -> set[str]:
    """``KILLS`` rounds of load and SIGKILL, then a restart that is stopped with SIGTERM."""
    answered: set[str] = set()
    for round_ in range(KILLS):
        server, target = serve(args, cwd, processes)
        answered |= load_then_kill(target, server, round_, (before_kill or {}).get(round_), tag)
        if after_kill and round_ in after_kill:
            after_kill[round_]()
    server, _ = serve(args, cwd, processes)  # replays the spool, if anything is in it
    server.terminate()
    assert server.wait(60) == 0, server.stderr
    return answered


def assert_recorded_exactly_once(answered: set[str], rows: list[str], spool: Path) -> None:
    counts = Counter(rows)
    assert len(answered) >= KILLS * 150
    missing = sorted(answered - counts.keys())
    assert not missing, f"{len(missing)} answered OK but not recorded: {missing[:10]}"
    duplicated = {rid: n for rid, n in counts.items() if n > 1}
    assert not duplicated, duplicated
    # worker K > 0 of ``--workers`` spools in spool/worker-K: every one was replayed
    assert not list(spool.rglob("*.spool")), "the spool was not replayed"


def test_sigkill_under_load_loses_no_decision_answered_ok(
    tmp_path: Path, serve_processes: list[ServeProcess]
) -> None:
    registry = tmp_path / "registry"
    write_tiny_model(registry / "tiny" / "1")
    db_path = tmp_path / "trades.sqlite"
    url = f"sqlite:///{db_path}"
    upgrade(url)
    spool = tmp_path / "spool"
    args = [
        *("--registry", str(registry), "--database-url", url, "--spool-dir", str(spool)),
        *("--metrics-port", "0", "--cpu"),
    ]
    answered = kill_and_restart(args, tmp_path, serve_processes)
    assert_recorded_exactly_once(answered, sqlite_rows(db_path)(), spool)


@pytest.mark.parametrize("workers", [1, 2], ids=["one-process", "workers-2"])
def test_sigkill_during_a_postgres_outage_loses_no_decision_answered_ok(
    workers: int,
    portfolio_tag: str,
    tmp_path: Path,
    serve_processes: list[ServeProcess],
    postgres_url: str,
    request: pytest.FixtureRequest,
) -> None:
    """Round 1 is killed with the database cut off: its answers are only in the spool.

    With ``--workers 2`` the SIGKILL goes to the supervisor and the kernel takes both workers
    with it; each worker spools in its own directory and replays it when it starts again.
    """
    reset_schema(postgres_url)
    upgrade(postgres_url)
    registry = tmp_path / "registry"
    write_tiny_model(registry / "tiny" / "1")
    spool = tmp_path / "spool"
    pg = make_url(postgres_url)
    with TcpProxy(pg.host or "127.0.0.1", pg.port or 5432) as proxy:
        url = pg.set(port=proxy.port).render_as_string(False)
        args = [
            *("--registry", str(registry), "--database-url", url, "--spool-dir", str(spool)),
            *("--metrics-port", "0", "--cpu"),
        ]
        if workers > 1:
            args += ["--workers", str(workers), "--redis-url", request.getfixturevalue("redis_url")]

        def cut() -> None:
            proxy.cut()
            wait_until(lambda: any(spool.rglob("*.spool")), 30, "the server to spool")

        answered = kill_and_restart(
            args,
            tmp_path,
            serve_processes,
            before_kill={1: cut},
            after_kill={1: proxy.restore},
            tag=f"{portfolio_tag}-",
        )
    assert_recorded_exactly_once(answered, postgres_rows(postgres_url)(), spool)


@pytest.fixture
def killed_portfolio(redis_url: str) -> Iterator[str]:
    """A portfolio id of this test only; its Redis state and lock go afterwards."""
    import redis

    portfolio = f"killed-{secrets.token_hex(4)}"
    yield portfolio
    client = redis.Redis.from_url(redis_url)
    try:
        client.delete(f"allocator:state:{portfolio}", f"lock:allocator:state:{portfolio}")
    finally:
        client.close()


def test_a_portfolio_a_killed_server_held_answers_within_a_second_of_the_restart(
    killed_portfolio: str,
    redis_url: str,
    tmp_path: Path,
    serve_processes: list[ServeProcess],
) -> None:
    """SIGKILL while a portfolio's Redis lock is held: the restarted server decides it at once,
    not after the lock's 10 s lifetime (the dead owner's liveness key lapses in 0.5 s)."""
    import redis

    registry = tmp_path / "registry"
    write_tiny_model(registry / "tiny" / "1")
    args = [
        *("--registry", str(registry), "--redis-url", redis_url, "--no-record"),
        *("--metrics-port", "0", "--cpu"),
    ]
    portfolio = killed_portfolio
    server, target = serve(args, tmp_path, serve_processes)
    loader = LoadThread(target, portfolio, window=TINY.window, retry=None, max_failures=3)
    loader.start()
    try:
        wait_until(lambda: len(loader.ok) >= 50, 60, "50 answered calls")
        server.proc.kill()
        server.wait(30)
    finally:
        loader.stop()
        loader.join(30)
    client = redis.Redis.from_url(redis_url)
    lock = f"lock:allocator:state:{portfolio}"
    try:
        # The kill may land between two calls; a lock as a killed server leaves it (an owner
        # whose liveness key is gone, 10 s to live) makes the case certain.
        client.set(lock, b"0123456789abcdef:token", px=10_000, nx=True)
        assert client.pttl(lock) > 5_000
    finally:
        client.close()

    server, target = serve(args, tmp_path, serve_processes)
    prices = price_path(3, TINY.window + 1, 7)
    with AllocatorClient(target, timeout=5, retry=None, options=OWN_CONNECTION) as allocator:
        began = time.monotonic()
        answer = allocator.allocate(
            portfolio, ["A0", "A1", "A2"], prices, request_id=f"{portfolio}-after"
        )
        waited = time.monotonic() - began
    assert answer.request_id == f"{portfolio}-after"
    assert waited < 1.0
    server.terminate()
    assert server.wait(60) == 0, server.stderr
