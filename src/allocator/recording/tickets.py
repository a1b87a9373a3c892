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

import asyncio
from dataclasses import dataclass

__all__ = ["ACK_MODES", "AckFutures", "NotDurableError", "RecorderRefusedError", "RecorderStats"]

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


class AckFutures:
    """Event-loop waiters for tickets (``Recorder.durable_future``): each future is completed on
    its own loop through ``call_soon_threadsafe`` by the writer thread, under the recorder's
    lock, once its ticket is durable or nothing can be made durable."""

    def __init__(self) -> None:
        self._waiting: list[tuple[int, asyncio.Future[None]]] = []

    def future(self, ticket: int, state: NotDurableError | bool | None) -> asyncio.Future[None]:
        """A future of the running loop for ``ticket``, given the recorder's ``state`` of it
        (False: acknowledged; None: not yet, so it waits here; an error: failed with it)."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if state is False:
            future.set_result(None)
        elif isinstance(state, NotDurableError):
            future.set_exception(state)
        else:
            self._waiting.append((ticket, future))
        return future

    def settle(self, durable: int) -> None:
        """Resolve every future whose ticket is at most ``durable``."""
        if not self._waiting:
            return
        keep: list[tuple[int, asyncio.Future[None]]] = []
        for ticket, future in self._waiting:
            if ticket <= durable:
                future.get_loop().call_soon_threadsafe(_complete, future, None)
            else:
                keep.append((ticket, future))
        self._waiting = keep

    def fail(self, error: NotDurableError) -> None:
        """Fail every waiting future with ``error``."""
        for _, future in self._waiting:
            future.get_loop().call_soon_threadsafe(_complete, future, error)
        self._waiting = []


def _complete(future: asyncio.Future[None], error: NotDurableError | None) -> None:
    """On the future's loop: its outcome, unless its waiter gave up (cancelled) meanwhile."""
    if future.done():
        return
    if error is None:
        future.set_result(None)
    else:
        future.set_exception(error)
