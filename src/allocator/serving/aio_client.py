"""The allocation server's client for asyncio (``grpc.aio``): ``AllocatorClient``'s methods,
awaited.

Same channel options (message limits, the retry policy in the service config), the same
bearer token, the same ``AllocatorError`` and result types as the blocking client in
``serving.client``. A retried call resends the same message, so an allocation keeps its
request id across attempts.

Example::

    async with AsyncAllocatorClient("localhost:50051", token=token) as client:
        window = (await client.list_models())[0].window
        allocation = await client.allocate("fund-7", ["AAPL", "MSFT"], prices)
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Callable, Coroutine, Iterable, Sequence
from types import TracebackType
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
    """An ``AllocatorClient`` method as this client's: it returns what ``self._call`` returns,
    here a coroutine of the decoded answer (the cast tells the type checker so)."""
    return cast("Callable[Concatenate[AsyncAllocatorClient, P], Coroutine[Any, Any, T]]", method)


async def _each(items: Iterable[T]) -> AsyncIterator[T]:
    """A plain iterable's items, for ``async for``."""
    for item in items:
        yield item


class AsyncAllocatorClient(ClientChannel):
    """A ``grpc.aio`` channel to one allocation server (arguments: ``ClientChannel``);
    ``async with`` closes it. Create it inside the event loop that will use it.

    ``allocate``, ``allocate_batch``, ``list_models``, ``refused_models`` and
    ``reset_portfolio`` are ``AllocatorClient``'s, awaited."""

    channels = grpc.aio

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
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
        """``AllocatorClient.allocate_stream``, awaited: batches from an (async) iterable,
        answers in order as they come."""

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
        """Status name per service from ``grpc.health.v1.Health/Check`` (as the sync client)."""
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
