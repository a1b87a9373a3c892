"""The allocation server's client for asyncio (``grpc.aio``): ``AllocatorClient``'s methods,
awaited, with the same channel options, token, retry policy, errors and result types.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Callable, Coroutine, Iterable, Sequence
from typing import Any, Concatenate, ParamSpec, Self, TypeVar, cast

import grpc
from grpc_health.v1 import health_pb2

from allocator.serving.client import (
    AllocatorClient,
    AllocatorError,
    ClientChannel,
    Requests,
    StreamAnswer,
    health_status,
    rpc_errors,
    stream_request,
)
from allocator.serving.proto import SERVICE_NAME, allocator_pb2

__all__ = ["AsyncAllocatorClient"]

P = ParamSpec("P")
T = TypeVar("T")


def _awaited(
    method: Callable[Concatenate[AllocatorClient, P], T],
) -> Callable[Concatenate[AsyncAllocatorClient, P], Coroutine[Any, Any, T]]:
    """An ``AllocatorClient`` method returning what this ``_call`` returns: a coroutine."""
    return cast("Callable[Concatenate[AsyncAllocatorClient, P], Coroutine[Any, Any, T]]", method)


async def _each(items: Iterable[T]) -> AsyncIterator[T]:
    for item in items:
        yield item


class AsyncAllocatorClient(ClientChannel):
    """``AllocatorClient``'s unary methods, awaited; ``async with`` closes it. Create it inside
    the event loop that will use it."""

    channels = grpc.aio

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._channel.close()

    async def _call(
        self, method: Any, request: Any, timeout: float | None, decode: Callable[[Any], T]
    ) -> T:
        with rpc_errors():
            return decode(await method(request, **self._unary_options(timeout)))

    allocate = _awaited(AllocatorClient.allocate)
    allocate_batch = _awaited(AllocatorClient.allocate_batch)
    list_models = _awaited(AllocatorClient.list_models)
    refused_models = _awaited(AllocatorClient.refused_models)
    reset_portfolio = _awaited(AllocatorClient.reset_portfolio)
    _listed = _awaited(AllocatorClient._listed)

    async def allocate_stream(
        self, batches: AsyncIterable[Requests] | Iterable[Requests], *, timeout: float | None = None
    ) -> AsyncIterator[StreamAnswer]:
        """``AllocatorClient.allocate_stream`` for an (async) iterable of batches."""

        async def messages() -> AsyncIterator[allocator_pb2.AllocateStreamRequest]:
            sequence = 0
            async for batch in batches if isinstance(batches, AsyncIterable) else _each(batches):
                sequence += 1
                yield stream_request(sequence, batch)

        call = self._stub.AllocateStream(messages(), timeout=timeout, metadata=self._metadata)
        try:
            with rpc_errors():
                async for response in call:
                    yield StreamAnswer.from_proto(response)
        finally:
            call.cancel()

    async def health(
        self, services: Sequence[str] = ("", SERVICE_NAME), *, timeout: float | None = None
    ) -> dict[str, str]:
        return {s: await self._status(s, timeout) for s in services}

    async def _status(self, service: str, timeout: float | None) -> str:
        request = health_pb2.HealthCheckRequest(service=service)
        try:
            return await self._call(self._health.Check, request, timeout, health_status)
        except AllocatorError as error:
            return health_status(error)

    async def is_serving(self, *, timeout: float | None = None) -> bool:
        """Whether the server and the Allocator service both report SERVING."""
        return all(s == "SERVING" for s in (await self.health(timeout=timeout)).values())
