"""Durable acknowledgement: a ticket completes only once its records are committed or fsync'd.

The sink is the project's real SQLite sink; a small subclass (``GatedSink``) only holds a write
until the test releases it (or fails it as an outage would), to look at the moment in between.
"""

from __future__ import annotations

import asyncio
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from allocator.recording.migrations import upgrade
from allocator.recording.recorder import NotDurableError, Recorder, RecorderRefusedError
from tests.recording.decisions import MODEL, make_decision
from tests.recording.gated_sink import GatedSink, rows

FAST = {"batch_size": 200, "flush_interval": 0.005, "retry_interval": (0.02, 0.1)}


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'trade.db'}"
    upgrade(url)
    return url


def waiter(
    recorder: Recorder, ticket: int, seen: list[object], look: Callable[[], object]
) -> threading.Thread:
    """Wait on ``ticket`` in a thread; record what ``look()`` says the moment it completes."""

    def run() -> None:
        try:
            recorder.wait_durable(ticket, 30)
            seen.append(look())
        except NotDurableError as exc:
            seen.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_a_ticket_completes_only_once_its_decision_is_committed(
    sqlite_url: str, tmp_path: Path
) -> None:
    sink = GatedSink(sqlite_url)
    with Recorder(sqlite_url, tmp_path / "spool", sink=sink, **FAST) as recorder:
        recorder.register_model(MODEL)
        sink.gate.clear()
        ticket = recorder.submit(make_decision(1))
        seen: list[object] = []
        thread = waiter(recorder, ticket, seen, lambda: rows(sqlite_url))
        thread.join(0.3)
        assert thread.is_alive(), "acknowledged before the commit"
        assert not seen
        assert rows(sqlite_url) == 0
        sink.gate.set()
        thread.join(10)
        assert seen == [1]  # the row was committed when the wait returned


def test_during_an_outage_a_ticket_completes_once_fsynced_to_the_spool(
    sqlite_url: str, tmp_path: Path
) -> None:
    sink = GatedSink(sqlite_url)
    with Recorder(sqlite_url, tmp_path / "spool", sink=sink, **FAST) as recorder:
        recorder.register_model(MODEL)
        sink.gate.clear()
        sink.down = True
        ticket = recorder.submit(make_decision(2))
        seen: list[object] = []
        thread = waiter(recorder, ticket, seen, lambda: recorder.spool.records)
        thread.join(0.3)
        assert thread.is_alive()
        assert not seen
        sink.gate.set()
        thread.join(10)
        assert seen == [1]  # in the spool, not the database, when the wait returned
        assert rows(sqlite_url) == 0
        sink.down = False
        assert recorder.flush(10)
        deadline = time.monotonic() + 10
        while recorder.stats().spooled_records and time.monotonic() < deadline:
            time.sleep(0.02)
    assert rows(sqlite_url) == 1


def test_concurrent_decisions_share_one_commit(sqlite_url: str, tmp_path: Path) -> None:
    sink = GatedSink(sqlite_url)
    with Recorder(sqlite_url, tmp_path / "spool", sink=sink, commit_window=0.2, **FAST) as recorder:
        recorder.register_model(MODEL)
        start = threading.Barrier(8)

        def call(i: int) -> None:
            start.wait()
            recorder.wait_durable(recorder.submit(make_decision(i)), 10)

        threads = [threading.Thread(target=call, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
    assert sum(sink.writes) == 8
    assert sink.writes == [8], "8 callers within one window should share one commit"


def test_a_wait_fails_at_its_deadline_and_while_nothing_can_be_made_durable(
    sqlite_url: str, tmp_path: Path
) -> None:
    sink = GatedSink(sqlite_url)
    spool = tmp_path / "spool"
    with Recorder(sqlite_url, spool, sink=sink, **FAST) as recorder:
        recorder.register_model(MODEL)
        sink.gate.clear()
        ticket = recorder.submit(make_decision(3))
        began = time.monotonic()
        with pytest.raises(NotDurableError, match="deadline"):
            recorder.wait_durable(ticket, 0.1)
        assert time.monotonic() - began < 1
        # Database down and the spool gone: the writer can keep the record nowhere but memory.
        sink.down = True
        shutil.rmtree(spool)
        sink.gate.set()
        began = time.monotonic()
        with pytest.raises(NotDurableError, match="neither"):
            recorder.wait_durable(ticket, 20)
        assert time.monotonic() - began < 5, "a stalled writer should fail the wait at once"
        with pytest.raises(RecorderRefusedError, match="neither"):  # nothing more is taken in
            recorder.submit(make_decision(4))
        spool.mkdir()  # the disk is back: the record held in memory is spooled after all
        assert recorder.flush(10)
        recorder.wait_durable(ticket, 1)
        assert recorder.spool.records == 1


def test_queued_acks_do_not_wait_for_the_commit(sqlite_url: str, tmp_path: Path) -> None:
    sink = GatedSink(sqlite_url)
    with Recorder(sqlite_url, tmp_path / "spool", sink=sink, ack="queued", **FAST) as recorder:
        recorder.register_model(MODEL)
        sink.gate.clear()
        ticket = recorder.submit(make_decision(4))
        began = time.monotonic()
        recorder.wait_durable(ticket, 10)
        assert time.monotonic() - began < 0.05
        assert rows(sqlite_url) == 0
        sink.gate.set()
    assert rows(sqlite_url) == 1


def test_an_unknown_ack_mode_is_refused(sqlite_url: str, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="ack"):
        Recorder(sqlite_url, tmp_path / "spool", ack="eventually")


def test_a_waiter_whose_loop_closed_does_not_stop_the_acknowledgements(
    sqlite_url: str, tmp_path: Path
) -> None:
    """A server stopped with a decision still in flight closes its loop before the commit: the
    writer thread settles that ticket into nothing and goes on acknowledging the others."""
    sink = GatedSink(sqlite_url)
    with Recorder(sqlite_url, tmp_path / "spool", sink=sink, **FAST) as recorder:
        recorder.register_model(MODEL)
        sink.gate.clear()
        orphan = recorder.submit(make_decision(1))

        async def wait_on(ticket: int, seconds: float) -> None:
            await asyncio.wait_for(recorder.durable_future(ticket), seconds)

        gone = asyncio.new_event_loop()
        pending = gone.create_task(wait_on(orphan, 30))
        gone.run_until_complete(asyncio.sleep(0.05))  # the task holds its ticket's future
        gone.close()  # the server's loop is gone, its waiter with it
        sink.gate.set()
        asyncio.run(wait_on(recorder.submit(make_decision(2)), 10))
        assert not pending.done()
    assert rows(sqlite_url) == 2
