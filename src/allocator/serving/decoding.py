"""Requests whose bytes are not a message: INVALID_ARGUMENT naming the method, never INTERNAL.

grpcio decodes a request with its handler's ``request_deserializer`` before any servicer code
runs. When that raises (``ff``, a truncated field, a string field that is not UTF-8), grpcio
answers ``INTERNAL: Exception deserializing request!``, logs a traceback, and the call reaches
neither the handler nor the request metrics. Any client can send any bytes, so that is the
client's error to fix, and the server must say so.

``DecodeGuardInterceptor`` hands grpcio, for every method of every service (health and
reflection included), a handler that decodes the bytes with the method's own deserializer
inside the call. A failure aborts the call with INVALID_ARGUMENT, ``request: ...``
naming the method and the message type; it is reported to ``on_undecodable`` (the server counts
it in its request metrics) and logged as one line, without a traceback. The servicers see
decoded messages exactly as before, and the generated code stays as ``make proto`` writes it.

It runs on the server's event loop (``grpc.aio``): the method's deserializer is wrapped so that
it never raises, and the handler refuses what it returned in place of a message.

Inside a client stream each message is framed on its own, so one undecodable message need not
end the call: for the methods named ``per_message`` (``AllocateStream``) the handler's request
iterator yields an ``Undecodable`` in that message's place, and the handler answers it with
an error reply of its own while the stream goes on. Other streaming methods (reflection) end
with INVALID_ARGUMENT as unary calls do.
"""

from __future__ import annotations

import inspect
import logging
import time
from collections.abc import AsyncIterator, Callable, Collection
from dataclasses import dataclass
from typing import Any

import grpc

from allocator.serving.security import Context, Continuation

__all__ = ["DecodeGuardInterceptor", "Undecodable", "UndecodableHandler"]

log = logging.getLogger("allocator.serving")

UndecodableHandler = Callable[[str, float], None]
"""Told the full method name (``/allocator.v1.Allocator/Allocate``) of each refused call and the
seconds spent on it."""

Deserializer = Callable[[bytes], Any]


@dataclass(frozen=True, slots=True)
class Undecodable:
    """A request (or stream message) that did not decode, in its place (``per_message``).

    ``message`` is what a unary call is refused with, ``request: ...``; ``seconds`` the time
    spent on it.
    """

    message: str
    seconds: float = 0.0


class DecodeGuardInterceptor(grpc.aio.ServerInterceptor):
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

    async def intercept_service(
        self, continuation: Continuation, handler_call_details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler | None:
        handler = await continuation(handler_call_details)
        if handler is None or handler.request_deserializer is None:
            return handler  # an unknown method (UNIMPLEMENTED), or one that takes raw bytes
        method = handler_call_details.method
        cached = self._guarded.get(method)
        if cached is not None and cached[0] is handler:
            return cached[1]
        guarded = self._guard(handler, method)
        self._guarded[method] = (handler, guarded)  # one event loop: no lock
        return guarded

    def _guard(self, handler: grpc.RpcMethodHandler, method: str) -> grpc.RpcMethodHandler:
        """The handler with a deserializer that never raises (an ``Undecodable`` in place of
        what does not decode) and a behavior that refuses an ``Undecodable`` request."""
        deserialize: Deserializer = handler.request_deserializer
        type_name = _type_name(deserialize)

        def decode(raw: bytes) -> Any:
            start = time.perf_counter()
            try:
                return deserialize(raw)
            # Whatever the deserializer raises about these bytes (upb's DecodeError; the pure
            # Python parser's UnicodeDecodeError or struct errors) is about the client's bytes.
            except Exception as exc:
                message = _refusal(method, type_name, raw, exc)
                return Undecodable(message, time.perf_counter() - start)

        async def refuse(item: Undecodable, context: Context) -> None:
            if self._on_undecodable is not None:
                self._on_undecodable(method, item.seconds)
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, item.message)

        async def checked(requests: AsyncIterator[Any], context: Context) -> AsyncIterator[Any]:
            async for item in requests:
                if isinstance(item, Undecodable):
                    await refuse(item, context)
                yield item

        def request_of(request: Any, context: Context) -> Any:
            if not handler.request_streaming or method in self._per_message:
                return request
            return checked(request, context)

        kind = _kind(handler)
        behavior = getattr(handler, kind)

        async def unary(request: Any, context: Context) -> Any:
            if isinstance(request, Undecodable):
                await refuse(request, context)
            return await behavior(request_of(request, context), context)

        async def streamed(request: Any, context: Context) -> AsyncIterator[Any]:
            if isinstance(request, Undecodable):
                await refuse(request, context)
            async for response in behavior(request_of(request, context), context):
                yield response

        async def written(request: Any, context: Context) -> None:  # responses via context.write
            if isinstance(request, Undecodable):
                await refuse(request, context)
            await behavior(request_of(request, context), context)

        if not handler.response_streaming:
            wrapped: Any = unary
        elif inspect.isasyncgenfunction(behavior):
            wrapped = streamed
        else:
            wrapped = written
        make = getattr(grpc, f"{kind}_rpc_method_handler")
        guarded: grpc.RpcMethodHandler = make(
            wrapped, request_deserializer=decode, response_serializer=handler.response_serializer
        )
        return guarded


def _kind(handler: grpc.RpcMethodHandler) -> str:
    """``unary_unary``, ``unary_stream``, ``stream_unary`` or ``stream_stream``."""
    request = "stream" if handler.request_streaming else "unary"
    response = "stream" if handler.response_streaming else "unary"
    return f"{request}_{response}"


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
