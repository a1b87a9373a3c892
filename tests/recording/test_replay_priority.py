"""A spool replay after an outage never starves live decisions of their acknowledgement."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from allocator.recording import backlog
from allocator.recording.migrations import upgrade
from allocator.recording.recorder import Recorder
from allocator.recording.records import DecisionRecord, ModelRecord
from allocator.recording.sinks import SinkUnavailableError
from allocator.recording.spool import Spool
from tests.recording.decisions import MODEL, make_decision
from tests.recording.gated_sink import GatedSink, rows

FRAMES = 150
PER_FRAME = 100
LIVE = 60


def spool_backlog(directory: Path) -> int:
    """A spool as a long outage leaves it: ``FRAMES`` fsync'd batches; the records it holds."""
    spool = Spool(directory)
    for f in range(FRAMES):
        decisions = [make_decision(f * PER_FRAME + k) for k in range(PER_FRAME)]
        spool.append({"m": [MODEL.to_json()], "d": [d.to_json() for d in decisions]})
    spool.close()
    return FRAMES * PER_FRAME


@pytest.mark.parametrize("ack", ["durable", "queued"])
def test_live_decisions_are_durable_within_a_slice_while_the_spool_replays(
    tmp_path: Path, ack: str
) -> None:
    url = f"sqlite:///{tmp_path / 'trade.db'}"
    upgrade(url)
    backlog = spool_backlog(tmp_path / "spool")
    waits: list[float] = []
    replaying_when_live: list[int] = []
    with Recorder(url, tmp_path / "spool", flush_interval=0.005, ack=ack) as recorder:
        recorder.register_model(MODEL)
        began = time.monotonic()
        for i in range(LIVE):
            sent = time.monotonic()
            recorder.wait_durable(recorder.submit(make_decision(10_000_000 + i)), 10)
            waits.append(time.monotonic() - sent)
            replaying_when_live.append(recorder.stats().spooled_records)
            time.sleep(0.005)
        assert recorder.flush(60)
        deadline = time.monotonic() + 60
        while recorder.stats().spooled_records and time.monotonic() < deadline:
            time.sleep(0.01)
        replay_seconds = time.monotonic() - began
        stats = recorder.stats()
    with sqlite3.connect(tmp_path / "trade.db") as db:
        rows = db.execute("SELECT count(*) FROM decisions").fetchone()[0]
    assert rows == backlog + LIVE
    assert stats.replayed == backlog
    # The live calls overlapped the replay (else this proves nothing) ...
    assert replaying_when_live[LIVE // 2] > 0, (replaying_when_live, replay_seconds)
    # ... and none waited for it: a replay slice is ~5 ms, one frame of 100 at least, while a
    # call that waited for the replay would wait about as long as the replay ran (a machine
    # under load slows both alike).
    waits.sort()
    assert waits[-1] < max(0.25, replay_seconds / 3), (waits[-5:], replay_seconds)


def test_a_large_spooled_frame_is_replayed_in_chunks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(backlog, "REPLAY_CHUNK", 100)
    url = f"sqlite:///{tmp_path / 'trade.db'}"
    upgrade(url)
    spool = Spool(tmp_path / "spool")
    decisions = [make_decision(k) for k in range(1_000)]
    spool.append({"m": [MODEL.to_json()], "d": [d.to_json() for d in decisions]})
    spool.close()
    sink = GatedSink(url)
    with Recorder(url, tmp_path / "spool", sink=sink, flush_interval=0.005) as recorder:
        deadline = time.monotonic() + 30
        while recorder.stats().spooled_records and time.monotonic() < deadline:
            time.sleep(0.01)
        assert recorder.stats().replayed == 1_000
    assert sink.writes == [100] * 10
    assert rows(url) == 1_000


class _DownSink(GatedSink):
    """Every write fails while ``down``, a model's alone too."""

    def write(self, models: Sequence[ModelRecord], decisions: Sequence[DecisionRecord]) -> int:
        if self.down:
            raise SinkUnavailableError("the test took the database down")
        return super().write(models, decisions)


def test_a_live_decision_written_before_the_replay_brings_its_model(tmp_path: Path) -> None:
    """A model registered during an outage is in the spool only; a live decision written to
    the database ahead of the replay must not be refused for naming it."""
    url = f"sqlite:///{tmp_path / 'trade.db'}"
    upgrade(url)
    sink = _DownSink(url)
    sink.down = True
    # The writer idles up to 2 s for live records, and retries the database 0.2 s after the
    # outage: a live record arriving in between is written before the replay starts.
    recorder = Recorder(
        url, tmp_path / "spool", sink=sink, flush_interval=2.0, retry_interval=(0.2, 0.2)
    ).start()
    try:
        recorder.register_model(MODEL)
        recorder.wait_durable(recorder.submit_many([make_decision(k) for k in range(10)]), 10)
        assert recorder.stats().spooled_records == 10
        sink.down = False
        time.sleep(0.5)
        recorder.wait_durable(recorder.submit(make_decision(10)), 10)
        deadline = time.monotonic() + 30
        while recorder.stats().spooled_records and time.monotonic() < deadline:
            time.sleep(0.01)
        stats = recorder.stats()
    finally:
        recorder.close(10)
    assert stats.quarantined == 0
    assert rows(url) == 11
