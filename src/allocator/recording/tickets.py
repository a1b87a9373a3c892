"""What the recorder answers its callers: tickets and their acknowledgement, refusals, counters.

A ticket counts the decisions submitted so far; records become durable in queue order, so
``wait_durable(ticket)`` waits until that many are committed or fsync'd (``ack="durable"``: an
answer given after it survives a crash), or returns at once (``ack="queued"``: faster, but a crash
loses the last ``flush_interval``). The writer waits ``commit_window`` after a first record, so
concurrent ones commit together: durability costs a commit per group, not per call."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

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
