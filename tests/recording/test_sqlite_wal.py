"""SQLite's switch to WAL under a race: processes opening one fresh file together all get it."""

from __future__ import annotations

import multiprocessing
import sqlite3
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Barrier
from pathlib import Path

import pytest

from allocator.recording.migrations import upgrade
from allocator.recording.sinks import (
    SinkUnavailableError,
    SqliteSink,
    enable_wal,
    prepare_sqlite,
)

ROUNDS = 15
PROCESSES = 3


def _switch(path: str, barrier: Barrier, out: Queue) -> None:
    conn = sqlite3.connect(path, timeout=5.0, isolation_level=None)
    barrier.wait()
    try:
        enable_wal(conn, 5.0)
        out.put("ok")
    except sqlite3.Error as exc:
        out.put(repr(exc))
    finally:
        conn.close()


def _fresh(path: Path) -> None:
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE t (x)")
    conn.commit()
    conn.close()


def test_processes_switching_one_fresh_file_to_wal_together_all_succeed(tmp_path: Path) -> None:
    # A bare ``PRAGMA journal_mode = WAL`` here fails one process in ~10 rounds with
    # "database is locked": SQLite does not call the busy handler for that lock.
    ctx = multiprocessing.get_context("fork")
    results: list[str] = []
    for k in range(ROUNDS):
        path = tmp_path / f"race-{k}.sqlite"
        _fresh(path)
        barrier, out = ctx.Barrier(PROCESSES), ctx.Queue()
        procs = [
            ctx.Process(target=_switch, args=(str(path), barrier, out)) for _ in range(PROCESSES)
        ]
        for p in procs:
            p.start()
        for p in procs:
            p.join(30)
        results += [out.get(timeout=5) for _ in procs]
        with sqlite3.connect(path) as conn:
            assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert results == ["ok"] * (ROUNDS * PROCESSES)


def test_prepare_sqlite_switches_an_existing_file_and_leaves_others_alone(tmp_path: Path) -> None:
    path = tmp_path / "trade.db"
    _fresh(path)
    prepare_sqlite(f"sqlite:///{path}")
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    prepare_sqlite(f"sqlite:///{tmp_path / 'absent.db'}")  # the workers' error to report
    assert not (tmp_path / "absent.db").exists()
    prepare_sqlite("postgresql://nobody@127.0.0.1:1/none")  # not SQLite: nothing to do


def test_a_sink_whose_wal_switch_stays_locked_reports_the_database_unavailable(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'trade.db'}"
    upgrade(url)
    holder = sqlite3.connect(tmp_path / "trade.db", isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")  # no other connection may change the journal mode
    try:
        sink = SqliteSink(url, busy_timeout=0.2)
        with pytest.raises(SinkUnavailableError, match="locked"):
            sink.connect()
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    sink.connect()  # the lock gone, the same sink connects
    sink.close()
