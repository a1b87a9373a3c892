"""A restart of a server with in-memory state is invisible to its clients.

The starting server rebuilds every portfolio's state from the recorded decisions, so the next
answer's smoothed weights are exactly what the old process would have answered, and a retry of
the latest request before the restart gets its first answer back, not a second step or row.
Checked in process on SQLite and Postgres (after a graceful stop), and with ``allocator serve``
processes stopped by SIGTERM and by SIGKILL. The expected answers come from one server that
answers the whole sequence without interruption.

The sequence reorders a portfolio's assets and swaps one for another before the restart, so
the slot layout to restore differs from the last request's asset order.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Iterator, Sequence
from pathlib import Path

import grpc
import numpy as np
import pytest
import sqlalchemy as sa

from allocator.recording.migrations import upgrade
from allocator.serving.proto.v1 import allocator_pb2 as pb
from allocator.serving.proto.v1 import allocator_pb2_grpc as pb_grpc
from allocator.serving.restore import restore_states
from allocator.serving.server import AllocationServer, ServerConfig, build_server
from allocator.serving.state import MemoryStateStore
from tests.postgres import reset_schema
from tests.recording.proxy import TcpProxy
from tests.serving.load import ServeProcess, wait_until
from tests.serving.server.helpers import make_request, sqlite_url

PORTFOLIOS = ("r-0", "r-1", "r-2")
UNIVERSES: tuple[tuple[str, ...], ...] = (
    ("A", "B", "C"),
    ("A", "B", "C"),
    ("A", "B", "C"),
    ("C", "A", "B"),  # reordered: the slots stay A, B, C
    ("C", "A", "B"),
    ("A", "C", "D"),  # B leaves, D takes its slot: slots A, D, C
    ("A", "C", "D"),
    ("D", "A"),
    ("A", "C", "D", "E"),
    ("A", "C", "D", "E"),
)
CUT = 6 * len(PORTFOLIOS)
"""Requests answered before the restart: every portfolio has just swapped B for D."""


def sequence() -> list[pb.AllocateRequest]:
    """Every portfolio's requests, round-robin; some send current weights, most do not."""
    rng = np.random.default_rng(5)
    out = []
    for t, assets in enumerate(UNIVERSES):
        for k, pid in enumerate(PORTFOLIOS):
            current = rng.dirichlet(np.ones(len(assets) + 1)) if (t + k) % 4 == 1 else None
            out.append(
                make_request(
                    pid, assets, seed=100 * k + t, current=current, request_id=f"{pid}-{t}"
                )
            )
    return out


REQUESTS = sequence()


def answer_all(target: str, requests: Sequence[pb.AllocateRequest]) -> list[pb.AllocateResponse]:
    with grpc.insecure_channel(target) as channel:
        stub = pb_grpc.AllocatorStub(channel)
        return [stub.Allocate(r, timeout=30) for r in requests]


def config(registry: Path, tmp: Path, url: str | None) -> ServerConfig:
    return ServerConfig(
        registry=registry,
        port=0,
        metrics_port=None,
        database_url=url,
        record=url is not None,
        spool_dir=tmp / "spool",
        prefer_cuda=False,
        default_model="tiny",
        reload_interval=60.0,
        grace_seconds=2.0,
    )


def start(registry: Path, tmp: Path, url: str | None) -> AllocationServer:
    return build_server(config(registry, tmp, url)).start()


@pytest.fixture(scope="module")
def reference(tiny_registry: Path, tmp_path_factory: pytest.TempPathFactory) -> list:
    """The whole sequence answered by one server that never stops."""
    server = start(tiny_registry, tmp_path_factory.mktemp("reference"), None)
    try:
        return answer_all(server.target, REQUESTS)
    finally:
        server.stop()


def assert_continues(got: list[pb.AllocateResponse], want: list[pb.AllocateResponse]) -> None:
    """Identical answers, bit for bit, except the ICM reward of each portfolio's first answer
    after the restart (the previous observation is not recorded, so there is none)."""
    first_after = set(PORTFOLIOS)
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert list(g.asset_ids) == list(w.asset_ids), i
        np.testing.assert_array_equal(g.smoothed_weights, w.smoothed_weights, err_msg=str(i))
        np.testing.assert_array_equal(g.raw_weights, w.raw_weights, err_msg=str(i))
        assert g.turnover == w.turnover, i
        if g.portfolio_id in first_after:
            first_after.discard(g.portfolio_id)
            assert not g.HasField("icm_reward"), i
            assert w.HasField("icm_reward"), i
        else:
            assert g == w, i


def count_rows(url: str) -> int:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return int(conn.execute(sa.text("SELECT count(*) FROM decisions")).scalar_one())
    finally:
        engine.dispose()


def test_the_comparison_is_sensitive(reference: list[pb.AllocateResponse]) -> None:
    """After the cut the smoothing carries state (a fresh start would answer raw == smoothed)."""
    for answer in reference[CUT : CUT + len(PORTFOLIOS)]:
        assert not np.allclose(answer.smoothed_weights, answer.raw_weights, atol=1e-6)
        assert answer.HasField("icm_reward")


@pytest.fixture(params=["sqlite", "postgresql"])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A migrated trade database on each backend, empty."""
    if request.param == "sqlite":
        return sqlite_url(tmp_path)
    url = request.getfixturevalue("postgres_url")
    reset_schema(url)
    upgrade(url)
    return url


def test_a_restart_continues_every_portfolio_where_it_stopped(
    tiny_registry: Path, tmp_path: Path, database: str, reference: list[pb.AllocateResponse]
) -> None:
    first = start(tiny_registry, tmp_path, database)
    try:
        before = answer_all(first.target, REQUESTS[:CUT])
        with first.store.locked(PORTFOLIOS) as session:
            old_states = session.get()
    finally:
        first.stop()
    assert before == reference[:CUT]

    second = start(tiny_registry, tmp_path, database)
    try:
        with second.store.locked(PORTFOLIOS) as session:
            restored = session.get()
        # The latest request of each portfolio, retried after the restart: its first answer.
        retried = answer_all(second.target, REQUESTS[CUT - len(PORTFOLIOS) : CUT])
        assert second.recorder is not None
        assert second.recorder.stats().submitted == 0  # answered, not decided again
        after = answer_all(second.target, REQUESTS[CUT:])
    finally:
        second.stop()

    for old, new in zip(old_states, restored, strict=True):
        assert old is not None
        assert new is not None
        assert new.slots == old.slots
        np.testing.assert_array_equal(new.smoothed, old.smoothed)
        assert (new.model, new.steps, new.last) == (old.model, old.steps, old.last)
        assert new.observation is None  # the ICM's inputs are not kept
        assert new.action is None
    assert restored[0].slots == ("A", "D", "C", "")  # not the request's order (A, C, D)
    assert retried == before[-len(PORTFOLIOS) :]
    assert_continues(after, reference[CUT:])
    assert count_rows(database) == len(REQUESTS)


def test_rows_without_a_slot_layout_and_an_unreadable_database_start_again(
    tiny_registry: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A row recorded before the slot layout was (NULL) cannot be continued exactly: that
    portfolio starts again, the others are restored. A database that cannot be read is logged
    and nothing is restored from it; neither stops the server."""
    url = sqlite_url(tmp_path)
    first = start(tiny_registry, tmp_path, url)
    try:
        answer_all(first.target, REQUESTS[: 2 * len(PORTFOLIOS)])
    finally:
        first.stop()
    with sqlite3.connect(tmp_path / "trades.db") as db:
        db.execute("UPDATE decisions SET slots = NULL WHERE portfolio_id = 'r-1'")
    store = MemoryStateStore()
    with caplog.at_level(logging.WARNING, "allocator.serving"):
        assert restore_states(url, None, store) == 2
    with store.locked(PORTFOLIOS) as session:
        assert [s is not None for s in session.get()] == [True, False, True]
    assert "1 portfolio(s) recorded without a slot layout" in caplog.text

    caplog.clear()
    with caplog.at_level(logging.ERROR, "allocator.serving"):
        missing = f"sqlite:///{tmp_path / 'no-such-dir' / 'trades.db'}"
        assert restore_states(missing, None, MemoryStateStore()) == 0
    assert "cannot read the recorded decisions" in caplog.text


def test_decisions_still_in_the_spool_are_restored_too(
    tiny_registry: Path, tmp_path: Path, postgres_url: str, reference: list[pb.AllocateResponse]
) -> None:
    """The database went away before the last decisions: they are in the spool, not in the
    table, and the restart continues from them (restored before the spool replays)."""
    reset_schema(postgres_url)
    upgrade(postgres_url)
    url = sa.make_url(postgres_url)
    recorded = CUT - len(PORTFOLIOS)
    with TcpProxy(url.host or "127.0.0.1", url.port or 5432) as proxy:
        proxied = url.set(port=proxy.port).render_as_string(False)
        first = start(tiny_registry, tmp_path, proxied)
        try:
            before = answer_all(first.target, REQUESTS[:recorded])
            wait_until(lambda: count_rows(postgres_url) == recorded, 30, "the first rows")
            proxy.cut()
            before += answer_all(first.target, REQUESTS[recorded:CUT])
            assert first.recorder is not None
            wait_until(
                lambda: first.recorder.stats().spooled_records == len(PORTFOLIOS),  # type: ignore[union-attr]
                30,
                "the last decisions spooled",
            )
        finally:
            first.stop()
        assert count_rows(postgres_url) == recorded
        proxy.restore()
        second = start(tiny_registry, tmp_path, proxied)
        try:
            retried = answer_all(second.target, REQUESTS[recorded:CUT])
            after = answer_all(second.target, REQUESTS[CUT:])
            assert second.recorder is not None
            assert second.recorder.flush(30)
            # The retries were answered from the restored state: nothing decided for them.
            assert second.recorder.stats().submitted == len(REQUESTS) - CUT
        finally:
            second.stop()
    assert before == reference[:CUT]
    assert retried == before[recorded:]
    assert_continues(after, reference[CUT:])
    assert count_rows(postgres_url) == len(REQUESTS)


# --- allocator serve processes, stopped by SIGTERM or killed -------------------------------------


@pytest.fixture
def processes() -> Iterator[list[ServeProcess]]:
    started: list[ServeProcess] = []
    yield started
    for process in started:
        process.kill()


def sqlite_rows(path: Path) -> int:
    with sqlite3.connect(path) as db:
        return int(db.execute("SELECT count(*) FROM decisions").fetchone()[0])


@pytest.mark.parametrize("stop", ["sigterm", "sigkill"])
def test_a_killed_or_stopped_process_restarts_where_it_stopped(
    stop: str,
    tiny_registry: Path,
    tmp_path: Path,
    reference: list[pb.AllocateResponse],
    processes: list[ServeProcess],
) -> None:
    url = sqlite_url(tmp_path)
    path = tmp_path / "trades.db"
    args = [
        "--registry",
        str(tiny_registry),
        "--model",
        "tiny",
        "--database-url",
        url,
        "--spool-dir",
        str(tmp_path / "spool"),
        "--metrics-port",
        "0",
        "--cpu",
    ]
    first = ServeProcess(args, cwd=tmp_path)
    processes.append(first)
    before = answer_all(first.wait_ready(), REQUESTS[:CUT])
    if stop == "sigterm":
        first.terminate()
        assert first.wait(60) == 0, first.stderr
    else:
        # What a SIGKILL loses is what was not durable yet; wait for the rows, then kill.
        wait_until(lambda: sqlite_rows(path) == CUT, 30, "the answered decisions recorded")
        first.proc.kill()
        first.wait(30)
    assert sqlite_rows(path) == CUT

    second = ServeProcess(args, cwd=tmp_path)
    processes.append(second)
    target = second.wait_ready()
    retried = answer_all(target, REQUESTS[CUT - len(PORTFOLIOS) : CUT])
    after = answer_all(target, REQUESTS[CUT:])
    second.terminate()
    assert second.wait(60) == 0, second.stderr
    assert "restored 3 portfolio states" in second.stderr

    assert before == reference[:CUT]
    assert retried == before[-len(PORTFOLIOS) :]
    assert_continues(after, reference[CUT:])
    assert sqlite_rows(path) == len(REQUESTS)
