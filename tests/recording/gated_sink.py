"""The project's real SQLite sink, held at will: a test can look between submit and commit."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Sequence

from allocator.recording.records import DecisionRecord, ModelRecord
from allocator.recording.sinks import SinkUnavailableError, SqliteSink


class GatedSink(SqliteSink):
    """A real SQLite sink whose decision writes wait for ``gate`` and fail while ``down``."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.gate = threading.Event()
        self.gate.set()
        self.down = False
        self.writes: list[int] = []

    def write(self, models: Sequence[ModelRecord], decisions: Sequence[DecisionRecord]) -> int:
        if decisions:
            assert self.gate.wait(30), "the test never released the write"
            if self.down:
                raise SinkUnavailableError("the test took the database down")
            self.writes.append(len(decisions))
        return super().write(models, decisions)


def rows(url: str) -> int:
    """How many decisions the SQLite database at ``url`` holds."""
    with sqlite3.connect(url.removeprefix("sqlite:///")) as db:
        return int(db.execute("SELECT count(*) FROM decisions").fetchone()[0])
