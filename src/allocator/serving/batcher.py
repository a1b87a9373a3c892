"""Dynamic batching on the server's event loop: concurrent calls decided as one batch.

Calls (a unary call, a batch, a stream message) arriving within ``window`` of the first, up to
``max_size`` decisions, run ``DecisionStep``'s steps once: one lock-and-read, one model call per
model, one durable commit, one write; the next batch forms while one waits for its commit. The
window is waited only while the server has calls in flight that are not waiting yet, so a lone
caller is never kept waiting.
Batches run one after another; a call naming a portfolio or request id an earlier call of the
window names waits for the next batch, so per portfolio it is as if calls came one at a time.
What one call caused fails that call; what the batch shares (recorder, store) fails them all,
storing nothing. A blocking store is waited for on ``executor`` threads, never on the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from allocator.serving.portfolio_state import PortfolioState
from allocator.serving.state import MemoryStateStore, StateSession, StateStore
from allocator.serving.step import Answer, Decided, DecisionStep, Item

__all__ = ["LATE_DURABLE_SECONDS", "DeadlineExceededError", "DecisionBatcher", "call_deadline"]

T = TypeVar("T")

LATE_DURABLE_SECONDS = 30.0
"""How long past the caller's deadline a record may become durable and still advance its
portfolio."""

LATE_MESSAGE = (
    "deadline exceeded before the decision was durable; it was recorded since: retry the "
    "request_id to get it"
)


class DeadlineExceededError(Exception):
    """The caller's deadline passed before deciding (nothing stored), or with ``late``, before
    the decision was durable (stored anyway: a retry of its request id gets it)."""

    def __init__(self, message: str, *, late: bool = False) -> None:
        super().__init__(message)
        self.late = late


def call_deadline(time_remaining: Callable[[], float | None]) -> float | None:
    """A call's deadline (``time_remaining``: seconds left, or None) as a ``time.monotonic()``
    instant (None: it has none)."""
    remaining = time_remaining()
    return None if remaining is None else time.monotonic() + remaining


@dataclass(slots=True)
class _Call:
    """One call's share of a batch; ``deadline`` is ``time.monotonic()`` (None: none)."""

    items: list[Item]
    deadline: float | None
    future: asyncio.Future[list[Answer]]
    answers: list[Answer | None] = field(default_factory=list)


class DecisionBatcher:
    """``window``: seconds a batch waits after its first call; ``max_size``: decisions that close
    it at once; ``executor``: where the store's blocking calls run (None: on the loop);
    ``observe``: told each batch's number of decisions; ``in_flight``: the calls the server is
    answering (None: always wait the window)."""

    def __init__(
        self,
        step: DecisionStep,
        *,
        window: float,
        max_size: int,
        executor: Executor | None = None,
        observe: Callable[[int], None] | None = None,
        in_flight: Callable[[], int] | None = None,
    ) -> None:
        self.step = step
        self.window = window
        self.max_size = max_size
        self.executor = executor
        self.observe = observe
        self.in_flight = in_flight
        self._waiting: deque[_Call] = deque()
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._busy = False  # a batch is being decided

    @property
    def waiting(self) -> int:
        return sum(len(call.items) for call in self._waiting)

    def start(self) -> None:
        self._wake = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._run(), name="allocator-batcher")

    async def close(self, timeout: float = LATE_DURABLE_SECONDS) -> None:
        """Stop once every call handed in so far is answered (or after ``timeout``)."""
        if self._task is None:
            return
        end = time.monotonic() + timeout
        while (self._waiting or self._busy) and time.monotonic() < end:
            await asyncio.sleep(0.001)
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self._task = None

    async def decide(self, items: list[Item], deadline: float | None) -> list[Answer]:
        """The answers to one call's items; a cancelled caller's decision is stored anyway."""
        if self._wake is None:
            raise RuntimeError("the batcher is not started")
        future: asyncio.Future[list[Answer]] = asyncio.get_running_loop().create_future()
        future.add_done_callback(_retrieved)  # a caller that went away never reads it
        self._waiting.append(_Call(items, deadline, future))
        self._wake.set()
        return await asyncio.shield(future)

    async def _run(self) -> None:
        assert self._wake is not None
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._waiting:
                await self._fill()
                batch = self._take()
                self._busy = True
                try:
                    await self._decide(batch)
                except Exception as exc:  # the batch's shared step failed: each call hears it
                    for call in batch:
                        _fail(call, exc)
                finally:
                    self._busy = False

    async def _fill(self) -> None:
        """Wait up to ``window`` for more while another call could join (short waits yield: the
        loop's timers are coarser)."""
        assert self._wake is not None
        end = time.monotonic() + self.window
        while self.waiting < self.max_size and self._others_in_flight():
            left = end - time.monotonic()
            if left <= 0:
                return
            if left < 0.002:
                await asyncio.sleep(0)
                continue
            self._wake.clear()  # set again by the next call handed in: look again then
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), left - 0.001)

    def _others_in_flight(self) -> bool:
        """Whether the server is answering a call not waiting here (one still being read or
        validated, or a batch's caller not yet resumed)."""
        return self.in_flight is None or self.in_flight() > len(self._waiting)

    def _take(self) -> list[_Call]:
        """Waiting calls in arrival order up to ``max_size`` decisions, leaving for the next batch
        any naming a portfolio or request id an earlier call names (so a reused id is refused,
        not answered twice)."""
        batch: list[_Call] = []
        taken: set[tuple[bool, str]] = set()
        blocked: set[tuple[bool, str]] = set()
        size = 0
        kept: deque[_Call] = deque()
        for call in self._waiting:
            ids = {(True, item.request.portfolio_id) for item in call.items}
            ids.update((False, item.request.request_id) for item in call.items)
            fits = not batch or size + len(call.items) <= self.max_size
            if fits and ids.isdisjoint(taken) and ids.isdisjoint(blocked):
                batch.append(call)
                taken |= ids
                size += len(call.items)
            else:
                kept.append(call)
                blocked |= ids
        self._waiting = kept
        return batch

    async def _decide(self, batch: list[_Call]) -> None:
        ids = [item.request.portfolio_id for call in batch for item in call.items]
        locked, session = await self._lock(ids)
        try:
            decided, owners = self._prepare(batch, session.get())
            if decided is not None:
                durable_at = await self._durable(decided, batch)
                states = session.get()
                settled = self.step.settle(decided)
                for (call, slot, index), (state, answer) in zip(owners, settled, strict=True):
                    states[index] = state
                    call.answers[slot] = answer
                await self._blocking(session.put, states)
        finally:
            await self._blocking(locked.__exit__, None, None, None)
        if decided is None:
            return
        self.step.observe(decided)
        if self.observe is not None:
            self.observe(len(decided.items))
        for call in batch:  # a call refused above keeps its error: its future is done
            if durable_at is not None and call.deadline is not None and durable_at > call.deadline:
                _fail(call, DeadlineExceededError(LATE_MESSAGE, late=True))
            else:
                _answer(call)

    def _prepare(
        self, batch: list[_Call], states: Sequence[PortfolioState | None]
    ) -> tuple[Decided | None, list[tuple[_Call, int, int]]]:
        """Check each call's deadline and retries, then decide the rest (None: nothing to); per
        decided item, its call, slot and index in ``states``."""
        now = time.monotonic()
        items: list[Item] = []
        before: list[PortfolioState | None] = []
        owners: list[tuple[_Call, int, int]] = []
        end = 0
        for call in batch:
            at, end = end, end + len(call.items)
            mine = states[at:end]
            try:
                if call.deadline is not None and call.deadline <= now:
                    raise DeadlineExceededError("deadline exceeded before deciding")
                call.answers = self.step.prepare(call.items, mine)
            except Exception as exc:
                _fail(call, exc)
                continue
            for slot, answer in enumerate(call.answers):
                if answer is None:
                    items.append(call.items[slot])
                    before.append(mine[slot])
                    owners.append((call, slot, at + slot))
        if not items:
            for call in batch:
                _answer(call)
            return None, owners
        return self.step.decide(items, before), owners

    async def _durable(self, decided: Decided, batch: list[_Call]) -> float | None:
        """Wait for the batch's commit; its time when that was after a call's deadline, else
        None. Gives up ``LATE_DURABLE_SECONDS`` after the latest deadline."""
        recorder = self.step.recorder
        if decided.ticket is None or recorder is None:
            return None
        deadlines = [c.deadline for c in batch]
        limit = None if None in deadlines else max(d for d in deadlines if d is not None)
        timeout = None if limit is None else limit - time.monotonic() + LATE_DURABLE_SECONDS
        try:
            await asyncio.wait_for(recorder.durable_future(decided.ticket), timeout)
        except TimeoutError as exc:
            raise DeadlineExceededError("deadline exceeded before recording") from exc
        now = time.monotonic()
        return (
            now if limit is not None and now > min(d for d in deadlines if d is not None) else None
        )

    async def _lock(self, ids: list[str]) -> tuple[Any, StateSession]:
        """On the loop when the in-memory store's locks are free now, else on the executor."""
        store = self.step.store
        if isinstance(store, MemoryStateStore):
            locked = store.try_locked(ids)
            if locked is not None:
                return locked, locked.__enter__()
        return await self._blocking(_enter, store, ids, offload=True)

    async def _blocking(self, fn: Callable[..., T], *args: Any, offload: bool = False) -> T:
        """On the executor when the store blocks (Redis; ``offload``: a lock wait), else here."""
        blocks = offload or not isinstance(self.step.store, MemoryStateStore)
        if self.executor is None or not blocks:
            return fn(*args)
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)


def _enter(store: StateStore, ids: list[str]) -> tuple[Any, StateSession]:
    locked = store.locked(ids)
    return locked, locked.__enter__()


def _answer(call: _Call) -> None:
    if not call.future.done():
        call.future.set_result(call.answers)  # type: ignore[arg-type]  # all answered


def _fail(call: _Call, exc: BaseException) -> None:
    if not call.future.done():
        call.future.set_exception(exc)


def _retrieved(future: asyncio.Future[list[Answer]]) -> None:
    if not future.cancelled():
        future.exception()
