"""``AllocateStream``: many allocations over one call, each message a batch with its own answer,
in request order; how a bad message and a drain are answered is docs/architecture.md's.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, Final

import grpc

from allocator.metrics.serving import ServingMetrics
from allocator.serving.batcher import DecisionBatcher, call_deadline
from allocator.serving.decoding import Undecodable
from allocator.serving.proto.v1 import allocator_pb2 as pb
from allocator.serving.security import Context
from allocator.serving.status import error_status
from allocator.serving.step import DecisionStep, ModelResolver, stream_response

__all__ = ["METHOD", "READ_AHEAD", "AllocationStreams"]

METHOD: Final = "AllocateStream"
READ_AHEAD: Final = 8
"""Messages read off the wire ahead of the one being answered; beyond it the reader waits and
gRPC's flow control slows the client."""
_END: Final = object()
"""The client closed its side (or the call is over): answer nothing more."""
_DRAINED: Final = object()
"""The server is draining and every message received before has been answered."""


class _Inbox:
    def __init__(self, limit: int) -> None:
        self._items: deque[Any] = deque()
        self._limit = limit
        self._cond = asyncio.Condition()
        self._ended = False  # the reader has finished (the handler's end cancels it)
        self._drain_left: int | None = None  # messages still to answer once draining

    async def put(self, item: Any) -> None:
        """Wait while full."""
        async with self._cond:
            while len(self._items) >= self._limit:
                await self._cond.wait()
            self._items.append(item)
            self._cond.notify_all()

    async def get(self, draining: Callable[[], bool]) -> Any:
        async with self._cond:
            while True:
                if draining() and self._drain_left is None:
                    self._drain_left = len(self._items)  # what had arrived: answer it
                if self._drain_left is not None:
                    if self._drain_left == 0:  # all answered; more to come unless it ended
                        return _END if self._ended and not self._items else _DRAINED
                    self._drain_left -= 1
                if self._items:
                    item = self._items.popleft()
                    self._cond.notify_all()
                    return item
                if self._ended:
                    return _END
                await self._cond.wait()

    async def wake(self, *, ended: bool = False) -> None:
        """Wake the waiters; ``ended``: the reader finished."""
        async with self._cond:
            self._ended |= ended
            self._cond.notify_all()


async def _read(requests: AsyncIterator[Any], inbox: _Inbox) -> None:
    try:
        async for item in requests:
            await inbox.put(item)
    except Exception:  # a cancelled or finished call: the handler sees _END
        pass
    finally:
        await inbox.wake(ended=True)


@dataclass(eq=False)
class AllocationStreams:
    """The open ``AllocateStream`` calls of one servicer. ``resolver`` is read per message (the
    catalog's snapshot of the moment); ``touch`` is told of every message (for the drain)."""

    step: DecisionStep
    batcher: DecisionBatcher
    resolver: Callable[[], ModelResolver]
    metrics: ServingMetrics
    draining: Callable[[], bool]
    touch: Callable[[], None]
    _open: set[_Inbox] = field(default_factory=set, init=False)

    async def wake(self) -> None:
        """Make every open stream look at the drain flag now."""
        for inbox in list(self._open):
            await inbox.wake()

    async def serve(
        self, requests: AsyncIterator[Any], context: Context
    ) -> AsyncIterator[pb.AllocateStreamResponse]:
        start = time.perf_counter()
        self.metrics.grpc.observe_started(METHOD)
        code = grpc.StatusCode.CANCELLED  # unless it ends otherwise: the client went away
        inbox = _Inbox(READ_AHEAD)
        self._open.add(inbox)
        reader = asyncio.get_running_loop().create_task(_read(requests, inbox))
        try:
            while True:
                item = await inbox.get(self.draining)
                if item is _END:
                    code = grpc.StatusCode.OK
                    return
                if item is _DRAINED:
                    code = grpc.StatusCode.UNAVAILABLE
                    self.metrics.observe_request(METHOD, code, 0.0)
                    await context.abort(
                        grpc.StatusCode.UNAVAILABLE,
                        "server shutting down: every message received was answered; send the "
                        "rest on a new stream",
                    )
                yield await self.answer(item, context)
        finally:
            self._open.discard(inbox)
            reader.cancel()  # also one waiting for room in the inbox
            self.metrics.grpc.observe_handled(METHOD, code, time.perf_counter() - start)

    async def answer(
        self, item: pb.AllocateStreamRequest | Undecodable, context: Context
    ) -> pb.AllocateStreamResponse:
        start = time.perf_counter()
        self.touch()
        if isinstance(item, Undecodable):
            self.metrics.observe_request(METHOD, grpc.StatusCode.INVALID_ARGUMENT, 0.0)
            return _error(0, grpc.StatusCode.INVALID_ARGUMENT, item.message)
        decisions = len(item.batch.requests)
        try:
            items = self.step.items(item.batch, self.resolver(), start)
            answers = await self.batcher.decide(items, call_deadline(context.time_remaining))
        except Exception as exc:
            code, message = error_status(exc, METHOD)
            self.metrics.observe_request(METHOD, code, time.perf_counter() - start, decisions)
            return _error(item.sequence, code, message)
        response = stream_response(item.sequence, answers)
        self.metrics.observe_request(
            METHOD, grpc.StatusCode.OK, time.perf_counter() - start, decisions
        )
        return response


def _error(sequence: int, code: grpc.StatusCode, message: str) -> pb.AllocateStreamResponse:
    number: int = code.value[0]
    return pb.AllocateStreamResponse(
        sequence=sequence, error=pb.StreamError(code=number, message=message)
    )
