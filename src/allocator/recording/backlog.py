"""Replaying the spool's backlog behind live traffic, in slices between which the live queue goes
first: a replay of thousands of records never holds a live acknowledgement for longer than a
slice. A chunk an outage stopped is written again; the request ids absorb what it had written."""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from allocator.metrics.recorder import RecorderMetrics
from allocator.recording.records import DecisionRecord, ModelRecord
from allocator.recording.sinks import RecordRejectedError
from allocator.recording.spool import Segment, Spool

log = logging.getLogger("allocator.recording.recorder")

REPLAY_SLICE_SECONDS = 0.005
"""A slice's length (at least one chunk; it ends early once a live record waits)."""
REPLAY_CHUNK = 500
"""Decisions per replay commit: a spooled frame of a large batch goes in several."""


@dataclass
class ReplayCursor:
    """The segment being replayed, its frames (decoded as reached), the chunks left of one."""

    segment: Segment
    frames: Iterator[dict[str, Any]]
    chunks: deque[tuple[list[ModelRecord], list[DecisionRecord]]] = field(default_factory=deque)


class BacklogReplay:
    """The replay half of ``Recorder``'s writer thread, on the recorder's state declared below."""

    spool: Spool
    metrics: RecorderMetrics
    _queue: deque[Any]
    _cond: threading.Condition
    _models: dict[tuple[str, str], ModelRecord]
    _replaying: ReplayCursor | None
    _replayed: int
    _spool_bytes: int
    _spool_records: int
    _write: Callable[[Sequence[ModelRecord], Sequence[DecisionRecord]], int]
    _write_one_by_one: Callable[[list[ModelRecord], list[DecisionRecord], Exception, bool], None]
    _mark_down: Callable[[str | None], None]
    _update_spool_gauges: Callable[[], None]

    def _replay_slice(self) -> None:
        """Replay spooled frames, oldest first, for about ``REPLAY_SLICE_SECONDS`` (at least
        one frame, fewer once a live record waits); an outage pauses it where it stopped."""
        began = time.monotonic()
        while True:
            cursor = self._replaying
            if cursor is None:
                segments = self.spool.segments()
                if not segments:
                    return
                segment = segments[0]
                # Live batches spooled from now on go to a new segment: this one is deleted
                # once replayed, and must not take any frame it was not read with.
                self.spool.seal(segment)
                cursor = self._replaying = ReplayCursor(segment, self.spool.read(segment))
            if not cursor.chunks:
                frame = next(cursor.frames, None)
                if frame is not None:
                    cursor.chunks.extend(self._chunks(frame))
            if cursor.chunks:
                try:
                    self._replay_chunk(*cursor.chunks[0])
                except Exception as exc:
                    log.warning("recorder: replay paused, database unreachable: %s", exc)
                    self._mark_down("unavailable")
                    return
                cursor.chunks.popleft()
            else:
                segment = cursor.segment
                self.spool.remove(segment)
                with self._cond:
                    self._replayed += segment.records
                    self._spool_bytes = max(0, self._spool_bytes - segment.size)
                    self._spool_records = max(0, self._spool_records - segment.records)
                self.metrics.replayed.inc(segment.records)
                self._update_spool_gauges()
                log.info("recorder: replayed %d spooled records", segment.records)
                self._replaying = None
            if time.monotonic() - began >= REPLAY_SLICE_SECONDS or self._queue:
                return

    def _chunks(
        self, frame: dict[str, Any]
    ) -> list[tuple[list[ModelRecord], list[DecisionRecord]]]:
        """A spooled frame as replay steps; each names the frame's models (upserts that cost
        nothing once done), so any step can be written on its own after a reconnect."""
        models = [ModelRecord.from_json(m) for m in frame.get("m", ())]
        decisions = [DecisionRecord.from_json(d) for d in frame.get("d", ())]
        for model in models:
            with self._cond:
                self._models.setdefault(model.key, model)
        return [
            (models, decisions[i : i + REPLAY_CHUNK])
            for i in range(0, max(len(decisions), 1), REPLAY_CHUNK)  # a frame of models: one step
        ]

    def _replay_chunk(self, models: list[ModelRecord], decisions: list[DecisionRecord]) -> None:
        try:  # ``_write`` reconnects a database marked down
            self._write(models, decisions)
        except RecordRejectedError as exc:
            self._write_one_by_one(models, decisions, exc, False)  # already spooled

    def _self_contained(
        self, models: Sequence[ModelRecord], decisions: Sequence[DecisionRecord]
    ) -> list[ModelRecord]:
        """``models`` plus every model ``decisions`` name: a batch that registers its own."""
        needed = {m.key: m for m in models}
        with self._cond:
            for key in {d.model_key for d in decisions}:
                if key not in needed and key in self._models:
                    needed[key] = self._models[key]
        return list(needed.values())

    def _append_spool(
        self, models: Sequence[ModelRecord], decisions: Sequence[DecisionRecord]
    ) -> None:
        # A segment replayed later must be self-contained: it names the models its decisions
        # use, whatever the database or a restarted process knows by then.
        payload = {
            "m": [m.to_json() for m in self._self_contained(models, decisions)],
            "d": [d.to_json() for d in decisions],
        }
        size = self.spool.append(payload)
        with self._cond:
            self._spool_bytes += size
            self._spool_records += len(decisions)
        self._update_spool_gauges()
