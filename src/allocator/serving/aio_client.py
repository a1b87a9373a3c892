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

from collections.abc import AsyncIterable, AsyncIterator, Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any, Self

import grpc
from grpc_health.v1 import health_pb2
from numpy.typing import ArrayLike

from allocator.serving.client import (
    Allocation,
    AllocationRequest,
    AllocatorError,
    ClientChannel,
    HealthOutcome,
    ModelInfo,
    ModelRefusal,
    StreamAnswer,
    batch_request,
    health_status,
    stream_request,
)
from allocator.serving.proto import SERVICE_NAME, allocator_pb2

__all__ = ["AsyncAllocatorClient"]


class AsyncAllocatorClient(ClientChannel):
    """A ``grpc.aio`` channel to one allocation server (arguments: ``ClientChannel``);
    ``async with`` closes it. Create it inside the event loop that will use it."""

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

    async def _call(self, method: Any, request: Any, timeout: float | None) -> Any:
        try:
            return await method(
                request,
                timeout=self.timeout if timeout is None else timeout,
                metadata=self._metadata,
            )
        except grpc.RpcError as error:
            raise AllocatorError.from_rpc_error(error) from None

    async def allocate(
        self,
        portfolio_id: str,
        asset_ids: Sequence[str],
        prices: ArrayLike,
        current_weights: ArrayLike | None = None,
        request_id: str | None = None,
        model: str | None = None,
        version: str | None = None,
        *,
        timeout: float | None = None,
    ) -> Allocation:
        """Weights for one portfolio now; ``prices`` has shape ``(len(asset_ids), window + 1)``.

        Retrying with the same ``request_id`` is safe: the server answers it once.
        """
        request = AllocationRequest(
            portfolio_id, asset_ids, prices, current_weights, request_id, model, version
        ).to_proto()
        return Allocation.from_proto(await self._call(self._stub.Allocate, request, timeout))

    async def allocate_batch(
        self,
        requests: Iterable[AllocationRequest | Mapping[str, Any]],
        *,
        timeout: float | None = None,
    ) -> list[Allocation]:
        """Weights for many portfolios in one call, in request order; all or nothing."""
        response = await self._call(self._stub.AllocateBatch, batch_request(requests), timeout)
        return [Allocation.from_proto(r) for r in response.responses]

    async def allocate_stream(
        self,
        batches: AsyncIterable[Iterable[AllocationRequest | Mapping[str, Any]]]
        | Iterable[Iterable[AllocationRequest | Mapping[str, Any]]],
        *,
        timeout: float | None = None,
    ) -> AsyncIterator[StreamAnswer]:
        """``AllocatorClient.allocate_stream``, awaited: batches from an (async) iterable,
        answers in order as they come."""

        async def messages() -> AsyncIterator[Any]:
            sequence = 0
            if isinstance(batches, AsyncIterable):
                async for batch in batches:
                    sequence += 1
                    yield stream_request(sequence, batch)
            else:
                for batch in batches:
                    sequence += 1
                    yield stream_request(sequence, batch)

        call = self._stub.AllocateStream(messages(), timeout=timeout, metadata=self._metadata)
        try:
            async for response in call:
                yield StreamAnswer.from_proto(response)
        except grpc.RpcError as error:
            raise AllocatorError.from_rpc_error(error) from None
        finally:
            call.cancel()

    async def _list(self, timeout: float | None) -> allocator_pb2.ListModelsResponse:
        request = allocator_pb2.ListModelsRequest()
        response: allocator_pb2.ListModelsResponse = await self._call(
            self._stub.ListModels, request, timeout
        )
        return response

    async def list_models(self, *, timeout: float | None = None) -> list[ModelInfo]:
        """The loaded versions, sorted by name then version."""
        return [ModelInfo.from_proto(m) for m in (await self._list(timeout)).models]

    async def refused_models(self, *, timeout: float | None = None) -> list[ModelRefusal]:
        """The versions whose files the server refused as they are now, with why."""
        return [ModelRefusal.from_proto(m) for m in (await self._list(timeout)).refused]

    async def reset_portfolio(self, portfolio_id: str, *, timeout: float | None = None) -> bool:
        """Forget the portfolio's smoothing state; True when the server had any."""
        request = allocator_pb2.ResetPortfolioRequest(portfolio_id=portfolio_id)
        return bool((await self._call(self._stub.ResetPortfolio, request, timeout)).existed)

    async def health(
        self, services: Sequence[str] = ("", SERVICE_NAME), *, timeout: float | None = None
    ) -> dict[str, str]:
        """Status name per service from ``grpc.health.v1.Health/Check`` (as the sync client)."""
        return {s: health_status(await self._check(s, timeout)) for s in services}

    async def _check(self, service: str, timeout: float | None) -> HealthOutcome:
        request = health_pb2.HealthCheckRequest(service=service)
        try:
            return await self._call(self._health.Check, request, timeout)
        except AllocatorError as error:
            return error

    async def is_serving(self, *, timeout: float | None = None) -> bool:
        """Whether the server and the Allocator service both report SERVING."""
        return all(s == "SERVING" for s in (await self.health(timeout=timeout)).values())
