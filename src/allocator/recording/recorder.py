"""The durable decision recorder: off the request path, batched, spooled through outages. One
writer thread writes batches to the database (``sinks``), or to the fsync'd ``Spool`` while it is
down, replayed later behind live batches (``backlog``; ``serving.restore`` orders rows by
``decided_at``, not arrival). Never a silent drop: a record is refused at the door
(``RecorderRefusedError``) when the queue or the spool is full; an accepted one is kept in the
database, the spool, or, when the database refuses it, the spool's quarantine file.

A ticket counts the decisions submitted so far; records become durable in queue order, so
``wait_durable(ticket)`` waits until that many are committed or fsync'd (``ack="durable"``: an
answer given after it survives a crash), or returns at once (``ack="queued"``: faster, but a crash
loses the last ``flush_interval``). The writer waits ``commit_window`` after a first record, so
concurrent ones commit together: durability costs a commit per group, not per call."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from prometheus_client import CollectorRegistry

from allocator.metrics.recorder import RecorderMetrics
from allocator.recording.backlog import BacklogReplay, ReplayCursor
from allocator.recording.records import DecisionRecord, ModelRecord
from allocator.recording.sinks import (
    RecordRejectedError,
    SchemaMissingError,
    Sink,
    SinkUnavailableError,
    make_sink,
)
from allocator.recording.spool import Spool, SpoolError

__all__ = ["ACK_MODES", "NotDurableError", "Recorder", "RecorderRefusedError", "RecorderStats"]

log = logging.getLogger(__name__)

ACK_MODES = ("durable", "queued")


class RecorderRefusedError(RuntimeError):
    """The recorder did not accept a record (queue full, spool quota, closed); nothing of it
    was kept, so the caller must not act as if it were recorded."""


class NotDurableError(RecorderRefusedError):
    """Accepted but not durable in time: the caller must not answer OK (a retry under the same
    request id is safe); ``timed_out``: its deadline passed, rather than the writer being stuck."""

    def __init__(self, message: str, *, timed_out: bool = False) -> None:
        super().__init__(message)
        self.timed_out = timed_out


@dataclass(frozen=True)
class RecorderStats:
    """Counters since start, for logs and tests (the same figures as the metrics)."""

    submitted: int
    durable: int
    written: int
    spooled_records: int
    spool_bytes: int
    replayed: int
    rejected: int
    quarantined: int
    queue_depth: int
    database_up: bool


class AckFutures:
    """Event-loop waiters for tickets, completed from the writer thread (under the recorder's
    lock) through their loop's ``call_soon_threadsafe``."""

    def __init__(self) -> None:
        self._waiting: list[tuple[int, asyncio.Future[None]]] = []

    def future(self, ticket: int, state: NotDurableError | bool | None) -> asyncio.Future[None]:
        """A future for ``ticket`` in ``state`` (False: acknowledged; None: waits; or the error)."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if state is False:
            future.set_result(None)
        elif isinstance(state, NotDurableError):
            future.set_exception(state)
        else:
            self._waiting.append((ticket, future))
        return future

    def settle(self, durable: int) -> None:
        for ticket, future in self._waiting:
            if ticket <= durable:
                _post(future, None)
        self._waiting = [(t, f) for t, f in self._waiting if t > durable]

    def fail(self, error: NotDurableError) -> None:
        for _, future in self._waiting:
            _post(future, error)
        self._waiting = []


def _post(future: asyncio.Future[None], error: NotDurableError | None) -> None:
    """Complete ``future`` on its loop; a loop already closed (its server stopped) has no
    waiter left, and its refusal must not end the writer thread that settles the others."""
    try:
        future.get_loop().call_soon_threadsafe(_complete, future, error)
    except RuntimeError:  # "Event loop is closed"
        if not future.get_loop().is_closed():
            raise


def _complete(future: asyncio.Future[None], error: NotDurableError | None) -> None:
    """On the future's loop: its outcome, unless its waiter gave up (cancelled) meanwhile."""
    if future.done():
        return
    if error is None:
        future.set_result(None)
    else:
        future.set_exception(error)


class Recorder(BacklogReplay):
    """Record decisions into ``database_url`` through a spool in ``spool_dir``. ``flush_interval``:
    how long the writer fills a batch with ``ack="queued"`` (and how often an idle one looks at the
    spool); ``ack``, ``commit_window``: see the module docstring; ``retry_interval``: the first
    and longest wait between reconnects."""

    def __init__(
        self,
        database_url: str,
        spool_dir: str | Path,
        *,
        metrics: RecorderMetrics | None = None,
        queue_size: int = 200_000,
        batch_size: int = 5_000,
        flush_interval: float = 0.02,
        spool_quota_bytes: int = 1 << 30,
        retry_interval: tuple[float, float] = (0.05, 2.0),
        sink: Sink | None = None,
        ack: str = "durable",
        commit_window: float = 0.001,
    ) -> None:
        if queue_size < 1 or batch_size < 1:
            raise ValueError("queue_size and batch_size must be >= 1")
        if ack not in ACK_MODES:
            raise ValueError(f"ack must be one of {ACK_MODES}, not {ack!r}")
        self.sink = sink if sink is not None else make_sink(database_url)
        self.spool = Spool(spool_dir)
        # Without a registry to report to, the figures go to one nobody reads.
        self.metrics = metrics if metrics is not None else RecorderMetrics(CollectorRegistry())
        self.queue_size = queue_size
        self.batch_size = batch_size
        self.flush_interval = flush_interval
        self.ack = ack
        self.commit_window = commit_window
        self.spool_quota_bytes = spool_quota_bytes
        self._retry_min, self._retry_max = retry_interval
        self._queue: deque[ModelRecord | DecisionRecord] = deque()
        self._cond = threading.Condition()
        self._models: dict[tuple[str, str], ModelRecord] = {}
        # counters since start, in records (``stats``)
        self._submitted = self._durable = self._written = self._replayed = 0
        self._rejected = self._quarantined = 0
        self._closing = self._closed = False
        self._stalled = False  # the pending batch reached neither the database nor the spool
        self._db_up = False
        self._next_attempt = 0.0
        self._backoff = self._retry_min
        self._replaying: ReplayCursor | None = None
        self._waiters = AckFutures()
        self._spool_bytes = self.spool.bytes
        self._spool_records = self.spool.records
        self._thread = threading.Thread(target=self._run, name="allocator-recorder", daemon=True)
        self.metrics.queue_depth.set_function(lambda: len(self._queue))
        self._update_spool_gauges()

    def start(self) -> Recorder:
        """Connect (a database down is retried in the background) and start writing;
        ``SchemaMissingError`` for a database never migrated: a deployment error, no outage."""
        try:
            self.sink.connect()
            self._db_up = True
        except SinkUnavailableError as exc:
            log.warning("recorder: database unreachable at start, spooling: %s", exc)
            self._mark_down()
        if len(self.spool):
            log.info(
                "recorder: %d spooled records in %s will be replayed",
                self.spool.records,
                self.spool.directory,
            )
        self._thread.start()
        return self

    def __enter__(self) -> Recorder:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self, timeout: float | None = None) -> bool:
        """Stop accepting, make everything accepted durable, stop the writer; False only if
        ``timeout`` ran out first."""
        with self._cond:
            if self._closed:
                return True
            self._closing = True
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout)
        done = not self._thread.is_alive()
        if done:
            self._closed = True
            self.sink.close()
            self.spool.close()
        return done

    def register_model(self, model: ModelRecord) -> None:
        """Make a model version known; decisions name it by (name, version). Idempotent."""
        with self._cond:
            if self._closing:
                raise RecorderRefusedError("the recorder is closed")
            if model.key not in self._models:
                self._models[model.key] = model
                self._queue.append(model)
                self._cond.notify()

    def submit(self, decision: DecisionRecord) -> int:
        """Queue one decision; raises ``RecorderRefusedError`` if it cannot be kept."""
        return self.submit_many((decision,))

    def submit_many(self, decisions: Sequence[DecisionRecord]) -> int:
        """Queue decisions all-or-nothing; returns the ticket for ``wait_durable``."""
        n = len(decisions)
        with self._cond:
            reason = self._refusal(decisions)
            if reason is not None:
                self._rejected += n
                self.metrics.rejected.inc(n)
                raise RecorderRefusedError(reason)
            idle = not self._queue
            self._queue.extend(decisions)
            self._submitted += n
            if len(self._queue) >= self.batch_size or (idle and self.ack == "durable"):
                self._cond.notify()
            return self._submitted

    def wait_durable(self, ticket: int, timeout: float | None = None) -> None:
        """Return once the decisions up to ``ticket`` are durable (at once with ``queued``);
        ``NotDurableError`` after ``timeout``, or at once while nothing can be made durable."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while (error := self._ack_error(ticket)) is not False:
                if isinstance(error, NotDurableError):
                    raise error
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise NotDurableError("not durable before the deadline", timed_out=True)
                self._cond.wait(0.1 if remaining is None else min(remaining, 0.1))

    def durable_future(self, ticket: int) -> asyncio.Future[None]:
        """``wait_durable`` for an event loop: a future of the running loop that the writer
        thread completes (``AckFutures``); the caller bounds the wait."""
        with self._cond:
            return self._waiters.future(ticket, self._ack_error(ticket))

    def _ack_error(self, ticket: int) -> NotDurableError | bool | None:
        """False: acknowledged; None: not yet; else why it cannot be (``_cond`` held)."""
        if self.ack == "queued" or self._durable >= ticket:
            return False
        if self._stalled:
            return NotDurableError("neither the database nor the spool takes records")
        if not self._thread.is_alive() and self._thread.ident is not None:
            return NotDurableError("the recorder's writer stopped")
        return None

    def _refusal(self, decisions: Sequence[DecisionRecord]) -> str | None:
        """Why ``decisions`` cannot be accepted now, or None (with ``_cond`` held)."""
        n = len(decisions)
        if self._closing:
            return "the recorder is closed"
        if self._stalled and self.ack == "durable":  # it could only hold them in memory
            return "neither the database nor the spool takes records"
        if len(self._queue) + n > self.queue_size:
            return f"the recorder queue is full ({self.queue_size} records)"
        if self._spool_bytes >= self.spool_quota_bytes:
            return (
                f"the recorder spool reached its quota ({self._spool_bytes} of "
                f"{self.spool_quota_bytes} bytes) while the database is unreachable"
            )
        for d in decisions:
            if d.model_key not in self._models:
                return f"model {d.model_name}/{d.model_version} is not registered with the recorder"
        return None

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every decision submitted before the call is durable; False on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            target = self._submitted
            self._cond.notify_all()
            while self._durable < target:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                if not self._thread.is_alive() and self._thread.ident is not None:
                    return False
                self._cond.wait(0.05 if remaining is None else min(remaining, 0.05))
            return True

    def stats(self) -> RecorderStats:
        with self._cond:
            return RecorderStats(
                submitted=self._submitted,
                durable=self._durable,
                written=self._written,
                spooled_records=self._spool_records,
                spool_bytes=self._spool_bytes,
                replayed=self._replayed,
                rejected=self._rejected,
                quarantined=self._quarantined,
                queue_depth=len(self._queue),
                database_up=self._db_up,
            )

    def _take(self, idle: bool = True) -> tuple[list[ModelRecord], list[DecisionRecord]] | None:
        """The next batch, or None once closing with nothing left; ``idle`` False: a replay
        waits, so an empty batch at once when nothing is queued."""
        with self._cond:
            if not idle and not self._queue:
                return None if self._closing else ([], [])
            window = self.flush_interval
            if self.ack == "durable":
                # Sleep until a record arrives, then give concurrent ones a window to join.
                self._cond.wait_for(lambda: self._queue or self._closing, self.flush_interval)
                window = self.commit_window if self._queue else 0.0
            if not idle:  # a replay waits: take what is queued without filling a batch
                window = min(window, self.commit_window)
            self._cond.wait_for(
                lambda: len(self._queue) >= self.batch_size or self._closing, window
            )
            if not self._queue:
                return None if self._closing else ([], [])
            models: list[ModelRecord] = []
            decisions: list[DecisionRecord] = []
            queue = self._queue
            while queue and len(decisions) < self.batch_size:
                item = queue.popleft()
                if isinstance(item, DecisionRecord):
                    decisions.append(item)
                else:
                    models.append(item)
            return models, decisions

    def _run(self) -> None:
        pending: tuple[list[ModelRecord], list[DecisionRecord]] | None = None
        while True:
            if len(self.spool) and self._attempt_due():
                self._replay_slice()
            if pending is None:
                pending = self._take(idle=not (len(self.spool) and self._db_up))
                if pending is None:  # closing, and everything accepted is durable
                    with self._cond:
                        self._waiters.fail(NotDurableError("the recorder's writer stopped"))
                    return
            models, decisions = pending
            if (models or decisions) and not self._persist(models, decisions):
                # Neither the database nor the disk took it: keep it (the door stays shut by
                # the refusal checks), fail the callers waiting on it, and try again shortly.
                with self._cond:
                    self._stalled = True
                    self._waiters.fail(
                        NotDurableError("neither the database nor the spool takes records")
                    )
                    self._cond.notify_all()
                time.sleep(self._retry_min)
                continue
            pending = None

    def _attempt_due(self) -> bool:
        return self._db_up or time.monotonic() >= self._next_attempt

    def _mark_down(self, failure: str | None = None) -> None:
        """The database is down: retry after the backoff; ``failure`` counts a failed write."""
        if failure is not None:
            self.metrics.failed_writes.labels(failure).inc()
        self._db_up = False
        self._next_attempt = time.monotonic() + self._backoff
        self._backoff = min(self._backoff * 2, self._retry_max)

    def _persist(self, models: list[ModelRecord], decisions: list[DecisionRecord]) -> bool:
        """Write the batch, or spool it; True once it is durable one way or the other."""
        if self._attempt_due():
            try:
                # A model registered during the outage may be in the spool only: until the
                # backlog is replayed, live batches bring the models they name (upserts).
                self._write(
                    self._self_contained(models, decisions) if len(self.spool) else models,
                    decisions,
                )
                self._done(len(decisions))
                return True
            except SinkUnavailableError as exc:
                log.warning("recorder: database unreachable, spooling: %s", exc)
                self._mark_down("unavailable")
            except SchemaMissingError as exc:
                log.error("recorder: %s; spooling until it is migrated", exc)
                self._mark_down("schema")
            except RecordRejectedError as exc:
                self._write_one_by_one(models, decisions, exc, spool_on_outage=True)
                self._done(len(decisions))
                return True
            except Exception:
                # Neither an outage we recognise nor a refused record: keep the batch safe on
                # disk, say so loudly, and retry the database later as after an outage.
                log.exception("recorder: unexpected error writing a batch; spooling it")
                self._mark_down("error")
        try:
            self._append_spool(models, decisions)
        except SpoolError as exc:
            log.error("recorder: %s; %d records held in memory", exc, len(decisions))
            self.metrics.failed_writes.labels("spool").inc()
            return False
        self._done(len(decisions))
        return True

    def _write(self, models: Sequence[ModelRecord], decisions: Sequence[DecisionRecord]) -> int:
        start = time.perf_counter()
        try:
            if not self._db_up:
                self.sink.connect()
            inserted = self.sink.write(models, decisions)
        except BaseException:
            self.metrics.batch_write_latency.observe(time.perf_counter() - start)
            raise
        if not self._db_up:
            log.info("recorder: database reachable again")
        self._db_up = True
        self._backoff = self._retry_min
        self.metrics.observe_write(inserted, time.perf_counter() - start)
        with self._cond:
            self._written += inserted
        return inserted

    def _write_one_by_one(
        self,
        models: list[ModelRecord],
        decisions: list[DecisionRecord],
        error: Exception,
        spool_on_outage: bool,
    ) -> None:
        """A batch the database refused: write it record by record, quarantining the refused
        ones. An outage mid-way spools the record (a live batch) or propagates (a replay, whose
        segment stays on disk to retry)."""
        log.error("recorder: the database refused a batch (%s); retrying record by record", error)
        singles: list[tuple[list[ModelRecord], list[DecisionRecord]]] = [([m], []) for m in models]
        singles += [([], [d]) for d in decisions]
        for one_model, one_decision in singles:
            try:
                self._write(one_model, one_decision)
            except RecordRejectedError as exc:
                self.metrics.failed_writes.labels("rejected").inc()
                self._quarantine(one_model, one_decision, exc)
            except Exception:
                if not spool_on_outage:
                    raise
                self._mark_down()
                self._append_spool(one_model, one_decision)

    def _quarantine(
        self, models: list[ModelRecord], decisions: list[DecisionRecord], error: Exception
    ) -> None:
        payload = {"m": [m.to_json() for m in models], "d": [d.to_json() for d in decisions]}
        path = self.spool.quarantine({**payload, "error": f"{type(error).__name__}: {error}"})
        with self._cond:
            self._quarantined += len(decisions)
        log.error("recorder: quarantined %d records in %s: %s", len(decisions), path, error)

    def _done(self, n: int) -> None:
        with self._cond:
            self._stalled = False
            self._durable += n
            self._waiters.settle(self._durable)
            self._cond.notify_all()

    def _update_spool_gauges(self) -> None:
        self.metrics.spooled_records.set(self._spool_records)
        self.metrics.spool_bytes.set(self._spool_bytes)
