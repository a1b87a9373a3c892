"""Requests whose bytes are not a message: INVALID_ARGUMENT naming the method, never the INTERNAL
grpcio answers when its own decoding raises; decoded inside the call instead (docs/architecture.md).
"""

from __future__ import annotations

import inspect
import logging
import time
from collections.abc import AsyncIterator, Callable, Collection
from dataclasses import dataclass
from typing import Any

import grpc

from allocator.serving.security import Context, Continuation, method_kind

__all__ = ["DecodeGuardInterceptor", "Undecodable"]

log = logging.getLogger("allocator.serving")

Deserializer = Callable[[bytes], Any]


@dataclass(frozen=True, slots=True)
class Undecodable:
    """A request or stream message that did not decode, in its place, and the refusal."""

    message: str
    seconds: float = 0.0


class DecodeGuardInterceptor(grpc.aio.ServerInterceptor):
    """Decode requests inside the call; place it after the token check, so a call without a
    token is UNAUTHENTICATED whatever its bytes. ``on_undecodable`` is told the full method name
    of each refused call and the seconds spent on it; ``per_message``: full names of streaming
    methods whose handlers take (and count) ``Undecodable`` items."""

    def __init__(
        self, on_undecodable: Callable[[str, float], None], per_message: Collection[str] = ()
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
        deserialize: Deserializer = handler.request_deserializer
        type_name = _type_name(deserialize)

        def decode(raw: bytes) -> Any:
            start = time.perf_counter()
            try:
                return deserialize(raw)
            # Whatever the deserializer raises about these bytes (upb's DecodeError; the pure
            # Python parser's UnicodeDecodeError or struct errors) is about the client's bytes.
            except Exception as exc:
                size, reason = len(raw), _reason(exc)
                log.warning(
                    "%s: refused %d bytes, not a valid %s (%s)", method, size, type_name, reason
                )
                message = (
                    f"request: the {size} bytes sent to {method} are not a valid {type_name} "
                    f"message ({reason})"
                )
                return Undecodable(message, time.perf_counter() - start)

        async def refuse(item: Undecodable, context: Context) -> None:
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

        kind = method_kind(handler)
        behavior = getattr(handler, kind)

        async def awaited(request: Any, context: Context) -> Any:  # a unary answer, or writes
            if isinstance(request, Undecodable):
                await refuse(request, context)
            return await behavior(request_of(request, context), context)

        async def streamed(request: Any, context: Context) -> AsyncIterator[Any]:
            if isinstance(request, Undecodable):
                await refuse(request, context)
            async for response in behavior(request_of(request, context), context):
                yield response

        wrapped = streamed if inspect.isasyncgenfunction(behavior) else awaited
        make = getattr(grpc, f"{kind}_rpc_method_handler")
        guarded: grpc.RpcMethodHandler = make(
            wrapped, request_deserializer=decode, response_serializer=handler.response_serializer
        )
        return guarded


def _type_name(deserialize: Deserializer) -> str:
    """The message's full name for ``AllocateRequest.FromString``, else the callable's name."""
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
