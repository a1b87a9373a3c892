"""Coalesce concurrent unary calls into one batched decision, without a timer.

One decision for one portfolio costs ~175 us, nearly all of it fixed numpy and onnxruntime
call overhead; a batch of 64 costs ~20 us per decision. Under concurrency the server therefore
decides for every call that is waiting at once. It never waits to fill a batch (the leader/
follower pattern of group commit): the first caller to find no batch running becomes the
leader and decides for itself and everyone queued behind it; whoever arrives meanwhile queues,
and once the leader has its own answer it hands leadership to the oldest waiting caller. At
concurrency 1 a call is simply decided alone, as before.

A group holds one call per portfolio (a portfolio's steps stay in arrival order, one per
batch) and one model; the rest wait for the next group.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

__all__ = ["Coalescer"]

I = TypeVar("I")  # noqa: E741  (item)
O = TypeVar("O")  # noqa: E741  (outcome)


@dataclass(eq=False)
class _Slot(Generic[I, O]):
    group: Hashable
    portfolio: str
    item: I
    done: threading.Event = field(default_factory=threading.Event)
    lead: bool = False
    result: Any = None
    error: BaseException | None = None


class Coalescer(Generic[I, O]):
    """Run ``decide(group_key, items) -> outcomes`` for batches of concurrent ``submit`` calls.

    ``decide`` returns one outcome per item, or an exception instance for an item that failed
    alone; an exception it raises fails every item of that batch.
    """

    def __init__(
        self,
        decide: Callable[[Hashable, Sequence[I]], Sequence[O | BaseException]],
        max_batch: int = 256,
    ) -> None:
        self._decide = decide
        self.max_batch = max_batch
        self._lock = threading.Lock()
        self._queue: list[_Slot[I, O]] = []
        self._leading = False

    def submit(self, group: Hashable, portfolio: str, item: I) -> O:
        """Decide ``item`` (with whatever else is waiting); blocks until it is decided."""
        slot: _Slot[I, O] = _Slot(group, portfolio, item)
        with self._lock:
            self._queue.append(slot)
            if not self._leading:
                self._leading = slot.lead = True
        if not slot.lead:
            slot.done.wait()  # set when decided, or when handed the lead
        if slot.lead:
            self._lead(slot)
        if slot.error is not None:
            raise slot.error
        return slot.result  # type: ignore[no-any-return]

    def _take(self) -> list[_Slot[I, O]]:
        """The next batch: the oldest call's group, one call per portfolio, in order."""
        with self._lock:
            first = self._queue[0]
            batch: list[_Slot[I, O]] = []
            seen: set[str] = set()
            rest: list[_Slot[I, O]] = []
            for s in self._queue:
                if (
                    len(batch) < self.max_batch
                    and s.group == first.group
                    and s.portfolio not in seen
                ):
                    batch.append(s)
                    seen.add(s.portfolio)
                else:
                    rest.append(s)
            self._queue = rest
            return batch

    def _lead(self, me: _Slot[I, O]) -> None:
        while True:
            batch = self._take()
            try:
                outcomes = self._decide(batch[0].group, [s.item for s in batch])
                if len(outcomes) != len(batch):
                    raise RuntimeError(f"{len(outcomes)} outcomes for {len(batch)} items")
            except BaseException as exc:
                outcomes = [exc] * len(batch)
            for s, outcome in zip(batch, outcomes, strict=True):
                if isinstance(outcome, BaseException):
                    s.error = outcome
                else:
                    s.result = outcome
                s.lead = False
                if s is not me:
                    s.done.set()
            if me in batch:
                break
        with self._lock:
            if self._queue:
                nxt = self._queue[0]
                nxt.lead = True
                nxt.done.set()
            else:
                self._leading = False
