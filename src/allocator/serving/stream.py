"""``AllocateStream``: many allocations over one call, each message a batch with its own answer.

Every message goes through the very same ``DecisionStep.allocate_batch`` as an
``AllocateBatch`` call (validation, idempotency, the portfolio locks, recording before the
state advances), one message at a time, so responses come in request order. A message that
decides nothing gets a response carrying its error (the status code and message a unary call
would have been refused with, ``serving.status``) and the stream goes on; so does a message
whose bytes do not decode (``serving.decoding.Undecodable``). Each message is counted in the
request metrics under ``AllocateStream``, its time divided by its decisions, as a batch is.

A reader thread per stream takes messages off the wire into a short in-order inbox, so the
handler can notice a drain while the client is quiet: a draining server answers the messages
it has already received, then ends the stream with UNAVAILABLE (the client resends what was
not answered, with the same request ids, on a new stream). An open stream holds one handler
thread (and its reader) for as long as it is open.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any, Final

import grpc

from allocator.metrics.serving import ServingMetrics
from allocator.serving.decoding import Undecodable
from allocator.serving.proto.v1 import allocator_pb2 as pb
from allocator.serving.status import error_status
from allocator.serving.step import DecisionStep, ModelResolver, stream_response

__all__ = ["METHOD", "READ_AHEAD", "AllocationStreams"]

log = logging.getLogger("allocator.serving")

METHOD: Final = "AllocateStream"
READ_AHEAD: Final = 8
"""Messages read off the wire ahead of the one being answered; beyond it the reader waits and
gRPC's flow control slows the client."""
_END: Final = object()
"""The client closed its side (or the call is over): answer nothing more."""
_DRAINED: Final = object()
"""The server is draining and every message received before has been answered."""


class _Inbox:
    """Messages in arrival order between one stream's reader thread and its handler."""

    def __init__(self, limit: int) -> None:
        self._items: deque[Any] = deque()
        self._limit = limit
        self._cond = threading.Condition()
        self._ended = False  # the reader has finished
        self._closed = False  # the handler has finished
        self._drain_left: int | None = None  # messages still to answer once draining

    def put(self, item: Any) -> bool:
        """Queue ``item``, waiting while the inbox is full; False once the handler left."""
        with self._cond:
            while len(self._items) >= self._limit and not self._closed:
                self._cond.wait()
            if self._closed:
                return False
            self._items.append(item)
            self._cond.notify_all()
            return True

    def get(self, draining: threading.Event) -> Any:
        """The next message, ``_END`` or ``_DRAINED``; waits while there is none."""
        with self._cond:
            while True:
                if draining.is_set() and self._drain_left is None:
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
                self._cond.wait()

    def end(self) -> None:
        with self._cond:
            self._ended = True
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def wake(self) -> None:
        with self._cond:
            self._cond.notify_all()


def _read(requests: Iterator[Any], inbox: _Inbox) -> None:
    """Move the call's messages into ``inbox`` until the client closes or the call ends."""
    try:
        for item in requests:
            if not inbox.put(item):
                return
    except Exception:  # a cancelled or finished call: the handler sees _END
        pass
    finally:
        inbox.end()


class AllocationStreams:
    """The open ``AllocateStream`` calls of one servicer, and how each is answered.

    ``resolver`` gives the current model resolver (the catalog's snapshot of the moment, read
    per message); ``draining`` is the servicer's drain flag; ``touch`` is told of every
    message (the drain waits until messages stop coming).
    """

    def __init__(
        self,
        step: DecisionStep,
        resolver: Callable[[], ModelResolver],
        metrics: ServingMetrics,
        draining: threading.Event,
        touch: Callable[[], None],
    ) -> None:
        self.step = step
        self.resolver = resolver
        self.metrics = metrics
        self.draining = draining
        self.touch = touch
        self._open: set[_Inbox] = set()
        self._lock = threading.Lock()

    @property
    def open_streams(self) -> int:
        with self._lock:
            return len(self._open)

    def wake(self) -> None:
        """Make every open stream look at the drain flag now (the server is draining)."""
        with self._lock:
            inboxes = list(self._open)
        for inbox in inboxes:
            inbox.wake()

    def serve(
        self, requests: Iterator[Any], context: grpc.ServicerContext
    ) -> Iterator[pb.AllocateStreamResponse]:
        """The responses of one call, in request order (``requests`` yield decoded messages,
        or ``Undecodable`` in place of one that did not decode)."""
        start = time.perf_counter()
        self.metrics.observe_started(METHOD)
        code = grpc.StatusCode.CANCELLED  # unless it ends otherwise: the client went away
        inbox = _Inbox(READ_AHEAD)
        with self._lock:
            self._open.add(inbox)
        reader = threading.Thread(
            target=_read, args=(requests, inbox), name="allocator-stream-reader", daemon=True
        )
        reader.start()
        try:
            while True:
                item = inbox.get(self.draining)
                if item is _END:
                    code = grpc.StatusCode.OK
                    return
                if item is _DRAINED:
                    code = grpc.StatusCode.UNAVAILABLE
                    self.metrics.observe_request(METHOD, code, 0.0)
                    context.abort(
                        grpc.StatusCode.UNAVAILABLE,
                        "server shutting down: every message received was answered; send the "
                        "rest on a new stream",
                    )
                yield self.answer(item, context)
        finally:
            inbox.close()
            with self._lock:
                self._open.discard(inbox)
            self.metrics.observe_stream_end(METHOD, code, time.perf_counter() - start)

    def answer(
        self, item: pb.AllocateStreamRequest | Undecodable, context: grpc.ServicerContext
    ) -> pb.AllocateStreamResponse:
        """One message's response: its allocations, or the error that decided nothing."""
        start = time.perf_counter()
        self.touch()
        if isinstance(item, Undecodable):
            self.metrics.observe_request(METHOD, grpc.StatusCode.INVALID_ARGUMENT, 0.0)
            return _error(0, grpc.StatusCode.INVALID_ARGUMENT, item.message)
        decisions = len(item.batch.requests)
        try:
            answers = self.step.allocate_batch(
                item.batch,
                self.resolver(),
                started=start,
                time_remaining=context.time_remaining,
            )
        except Exception as exc:
            code, message = error_status(exc)
            if code is grpc.StatusCode.INTERNAL:
                log.exception("%s failed", METHOD)
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
