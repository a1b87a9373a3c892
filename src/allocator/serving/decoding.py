"""Requests whose bytes are not a message: INVALID_ARGUMENT naming the method, never INTERNAL.

grpcio decodes a request with its handler's ``request_deserializer`` before any servicer code
runs. When that raises (``ff``, a truncated field, a string field that is not UTF-8), grpcio
answers ``INTERNAL: Exception deserializing request!``, logs a traceback, and the call reaches
neither the handler nor the request metrics. Any client can send any bytes, so that is the
client's error to fix, and the server must say so.

``DecodeGuardInterceptor`` hands grpcio, for every method of every service (health and
reflection included), a handler that takes the raw bytes and decodes them itself with the
method's own deserializer. A failure aborts the call with INVALID_ARGUMENT, ``request: ...``
naming the method and the message type; it is reported to ``on_undecodable`` (the server counts
it in its request metrics) and logged as one line, without a traceback. The servicers see
decoded messages exactly as before, and the generated code stays as ``make proto`` writes it.

Inside a client stream each message is framed on its own, so one undecodable message need not
end the call: for the methods named ``per_message`` (``AllocateStream``) the handler's request
iterator yields an ``Undecodable`` in that message's place, and the handler answers it with
an error reply of its own while the stream goes on. Other streaming methods (reflection) end
with INVALID_ARGUMENT as unary calls do.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass
from typing import Any, NoReturn

import grpc

__all__ = ["DecodeGuardInterceptor", "Undecodable", "UndecodableHandler"]

log = logging.getLogger("allocator.serving")

UndecodableHandler = Callable[[str, float], None]
"""Told the full method name (``/allocator.v1.Allocator/Allocate``) of each refused call and the
seconds spent on it."""

Deserializer = Callable[[bytes], Any]


@dataclass(frozen=True, slots=True)
class Undecodable:
    """A stream message that did not decode, in its place in the stream (``per_message``).

    ``message`` is what a unary call would have been refused with, ``request: ...``.
    """

    message: str


class DecodeGuardInterceptor(grpc.ServerInterceptor):
    """Decode requests inside the call, refusing undecodable bytes with INVALID_ARGUMENT.

    It must come after interceptors that refuse calls without reading them (the token check),
    so a call without a token is UNAUTHENTICATED whatever its bytes. A method's guarded handler
    is built once and reused while the service keeps the same handler. ``per_message``: full
    names of client-streaming methods whose handlers take ``Undecodable`` items (they count
    them; ``on_undecodable`` is not told).
    """

    def __init__(
        self,
        on_undecodable: UndecodableHandler | None = None,
        per_message: Collection[str] = (),
    ) -> None:
        self._on_undecodable = on_undecodable
        self._per_message = frozenset(per_message)
        self._guarded: dict[str, tuple[grpc.RpcMethodHandler, grpc.RpcMethodHandler]] = {}
        self._lock = threading.Lock()

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler | None],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        handler = continuation(handler_call_details)
        if handler is None or handler.request_deserializer is None:
            return handler  # an unknown method (UNIMPLEMENTED), or one that takes raw bytes
        method = handler_call_details.method
        cached = self._guarded.get(method)
        if cached is not None and cached[0] is handler:
            return cached[1]
        guarded = self._guard(handler, method)
        with self._lock:
            self._guarded[method] = (handler, guarded)
        return guarded

    def _guard(self, handler: grpc.RpcMethodHandler, method: str) -> grpc.RpcMethodHandler:
        deserialize: Deserializer = handler.request_deserializer
        type_name = _type_name(deserialize)

        def decode(raw: bytes, context: grpc.ServicerContext) -> Any:
            start = time.perf_counter()
            try:
                return deserialize(raw)
            # Whatever the deserializer raises about these bytes (upb's DecodeError; the pure
            # Python parser's UnicodeDecodeError or struct errors) is about the client's bytes.
            except Exception as exc:
                self._refuse(method, type_name, raw, exc, context, start)

        serialize = handler.response_serializer
        if not handler.request_streaming:
            if handler.response_streaming:
                unary_stream = handler.unary_stream
                return grpc.unary_stream_rpc_method_handler(
                    lambda raw, context: unary_stream(decode(raw, context), context),
                    response_serializer=serialize,
                )
            unary_unary = handler.unary_unary
            return grpc.unary_unary_rpc_method_handler(
                lambda raw, context: unary_unary(decode(raw, context), context),
                response_serializer=serialize,
            )

        def requests(raws: Iterator[bytes], context: grpc.ServicerContext) -> Iterator[Any]:
            for raw in raws:
                yield decode(raw, context)

        def tolerant(raws: Iterator[bytes], context: grpc.ServicerContext) -> Iterator[Any]:
            for raw in raws:
                try:
                    yield deserialize(raw)
                except Exception as exc:  # as in decode: the client's bytes
                    yield Undecodable(_refusal(method, type_name, raw, exc))

        if method in self._per_message:
            requests = tolerant

        if handler.response_streaming:
            stream_stream = handler.stream_stream
            return grpc.stream_stream_rpc_method_handler(
                lambda raws, context: stream_stream(requests(raws, context), context),
                response_serializer=serialize,
            )
        stream_unary = handler.stream_unary
        return grpc.stream_unary_rpc_method_handler(
            lambda raws, context: stream_unary(requests(raws, context), context),
            response_serializer=serialize,
        )

    def _refuse(
        self,
        method: str,
        type_name: str,
        raw: bytes,
        exc: Exception,
        context: grpc.ServicerContext,
        start: float,
    ) -> NoReturn:
        message = _refusal(method, type_name, raw, exc)
        if self._on_undecodable is not None:
            self._on_undecodable(method, time.perf_counter() - start)
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, message)
        raise AssertionError("unreachable: context.abort raises")


def _refusal(method: str, type_name: str, raw: bytes, exc: Exception) -> str:
    """The client's message for undecodable bytes, logged as one line (no traceback)."""
    reason = _reason(exc)
    log.warning("%s: refused %d bytes, not a valid %s (%s)", method, len(raw), type_name, reason)
    return (
        f"request: the {len(raw)} bytes sent to {method} are not a valid {type_name} "
        f"message ({reason})"
    )


def _type_name(deserialize: Deserializer) -> str:
    """``allocator.v1.AllocateRequest`` for ``AllocateRequest.FromString``; else the callable's
    name (a deserializer that is not a message class's)."""
    owner = getattr(deserialize, "__self__", None)
    descriptor = getattr(owner, "DESCRIPTOR", None)
    full_name = getattr(descriptor, "full_name", None)
    if isinstance(full_name, str):
        return full_name
    return getattr(deserialize, "__qualname__", type(deserialize).__name__)


def _reason(exc: Exception) -> str:
    """The parser's own words without its preamble: ``String field had bad UTF-8``."""
    text = str(exc) or type(exc).__name__
    _, sep, rest = text.partition("': ")
    return rest if sep and text.startswith("Error parsing message") else text
