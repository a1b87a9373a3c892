"""What the recorder answers its callers: tickets and their acknowledgement, refusals, counters.

``Recorder.submit_many`` returns a ticket, the count of decisions submitted so far; records are
made durable in queue order, so ``wait_durable(ticket)`` waits until that many are.

With ``ack="durable"`` (the default) it returns only once the ticket's records are committed to
the database or fsync'd to the spool, so an answer given after it survives a crash. The writer
then wakes at the first record, waits ``commit_window`` (about 1 ms) for concurrent ones, and
commits them together: one transaction or one fsync for the whole group. With ``ack="queued"``
it returns at once and the writer fills batches for ``flush_interval``: faster, but a crash
(kill -9, OOM, power) loses what was answered in the last ``flush_interval``.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ACK_MODES", "NotDurableError", "RecorderRefusedError", "RecorderStats"]

ACK_MODES = ("durable", "queued")


class RecorderRefusedError(RuntimeError):
    """The recorder did not accept a record (queue full, spool quota, closed); nothing of it
    was kept, so the caller must not act as if it were recorded."""


class NotDurableError(RecorderRefusedError):
    """Accepted but not durable in time (deadline, or neither database nor spool writable).

    The caller must not answer OK. The record may still be written later; a retry under the
    same request id is safe, the database keeps one row per request id. ``timed_out``: the
    caller's deadline passed (rather than the writer being stuck).
    """

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
