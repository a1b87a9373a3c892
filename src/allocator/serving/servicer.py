"""The ``allocator.v1.Allocator`` service's handlers, on the server's event loop: calls in,
statuses out (``serving.status``), each call timed by outcome; ``AllocateStream`` is
``serving.stream``'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from concurrent import futures
from typing import TypeVar

import grpc

from allocator.metrics.serving import ServingMetrics
from allocator.recording.recorder import Recorder
from allocator.serving.batcher import DecisionBatcher, call_deadline
from allocator.serving.catalog import CatalogSnapshot, ModelCatalog
from allocator.serving.config import ServerConfig
from allocator.serving.proto.v1 import allocator_pb2 as pb
from allocator.serving.proto.v1 import allocator_pb2_grpc as pb_grpc
from allocator.serving.security import Context
from allocator.serving.state import StateStore
from allocator.serving.status import error_status
from allocator.serving.step import Answer, DecisionStep, batch_response
from allocator.serving.stream import AllocationStreams
from allocator.serving.validation import required_id

__all__ = ["AllocatorServicer"]

T = TypeVar("T")


class _Refusal(Exception):  # noqa: N818  (control flow, never leaves this module)
    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class AllocatorServicer(pb_grpc.AllocatorServicer):
    """The service over a registry, a state store and a recorder; ``executor`` runs the store's
    blocking calls."""

    def __init__(
        self,
        registry: ModelCatalog,
        store: StateStore,
        metrics: ServingMetrics,
        recorder: Recorder | None,
        config: ServerConfig,
        executor: futures.Executor,
    ) -> None:
        self.registry = registry
        self.store = store
        self.metrics = metrics
        self.executor = executor
        self.step = DecisionStep(store, recorder, metrics, config.idempotency_cache)
        self.batcher = DecisionBatcher(
            self.step,
            window=config.batch_window_ms / 1000,
            max_size=config.batch_max_decisions,
            executor=executor,
            observe=metrics.decided_batch_size.observe,
            in_flight=lambda: self.in_flight,
        )
        self.limit = config.max_concurrent_rpcs
        self.in_flight = 0  # calls of this service being answered (an open stream counts)
        self.draining = False
        self.last_call = 0.0  # time.monotonic() of the latest call, for the drain
        self.streams = AllocationStreams(
            self.step,
            self.batcher,
            lambda: self.registry.snapshot.resolve,
            metrics,
            lambda: self.draining,
            self._touch,
        )

    def _touch(self) -> None:
        self.last_call = time.monotonic()

    async def _call(
        self,
        method: str,
        context: Context,
        handler: Callable[[], Awaitable[T]],
        decisions: int = 1,
    ) -> T:
        """Run ``handler``, map refusals to status codes, time the call per decision."""
        start = time.perf_counter()
        self.last_call = time.monotonic()
        self.metrics.grpc.observe_started(method)
        code = grpc.StatusCode.OK
        message = ""
        model = version = ""
        try:
            if self.draining:
                raise _Refusal(grpc.StatusCode.UNAVAILABLE, "server shutting down, retry")
            with self._slot():
                result = await handler()
            model, version = _answered_by(result)
            return result
        except _Refusal as exc:
            code, message = exc.code, exc.message
        except asyncio.CancelledError:  # grpc ends the handler: deadline passed, or client left
            remaining = context.time_remaining()
            expired = remaining is not None and remaining <= 0
            code = grpc.StatusCode.DEADLINE_EXCEEDED if expired else grpc.StatusCode.CANCELLED
            raise
        except Exception as exc:
            code, message = error_status(exc, method)
        finally:
            self.metrics.observe_request(
                method,
                code,
                time.perf_counter() - start,
                decisions,
                model=model,
                version=version,
            )
        await context.abort(code, message)
        raise AssertionError("unreachable: context.abort raises")

    @contextlib.contextmanager
    def _slot(self) -> Iterator[None]:
        """One of the ``max_concurrent_rpcs`` calls, or RESOURCE_EXHAUSTED at once; counted on
        the loop, so exact, and never refusing health checks or reflection."""
        if self.in_flight >= self.limit:
            raise _Refusal(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"the server is answering its limit of {self.limit} concurrent calls; retry",
            )
        self.in_flight += 1
        try:
            yield
        finally:
            self.in_flight -= 1

    def _decide(
        self,
        request: pb.AllocateRequest | pb.AllocateBatchRequest,
        context: Context,
        respond: Callable[[list[Answer]], T],
    ) -> Callable[[], Awaitable[T]]:
        start = time.perf_counter()

        async def handle() -> T:
            items = self.step.items(request, self.registry.snapshot.resolve, start)
            return respond(await self.batcher.decide(items, call_deadline(context.time_remaining)))

        return handle

    async def Allocate(  # noqa: N802  (gRPC method name)
        self, request: pb.AllocateRequest, context: Context
    ) -> pb.AllocateResponse:
        handle = self._decide(request, context, lambda answers: answers[0].response)
        return await self._call("Allocate", context, handle)

    async def AllocateBatch(  # noqa: N802
        self, request: pb.AllocateBatchRequest, context: Context
    ) -> pb.AllocateBatchResponse:
        handle = self._decide(request, context, batch_response)
        return await self._call("AllocateBatch", context, handle, len(request.requests))

    async def AllocateStream(  # noqa: N802
        self, request_iterator: AsyncIterator[pb.AllocateStreamRequest], context: Context
    ) -> AsyncIterator[pb.AllocateStreamResponse]:
        try:
            with self._slot():
                async for response in self.streams.serve(request_iterator, context):
                    yield response
        except _Refusal as exc:  # only the slot refuses: the stream never started
            self.metrics.observe_rejected("AllocateStream", exc.code, 0.0)
            await context.abort(exc.code, exc.message)

    async def ListModels(  # noqa: N802
        self, request: pb.ListModelsRequest, context: Context
    ) -> pb.ListModelsResponse:
        async def handle() -> pb.ListModelsResponse:
            return _list_models(self.registry.snapshot)

        return await self._call("ListModels", context, handle)

    async def ResetPortfolio(  # noqa: N802
        self, request: pb.ResetPortfolioRequest, context: Context
    ) -> pb.ResetPortfolioResponse:
        async def handle() -> pb.ResetPortfolioResponse:
            portfolio_id = required_id(request.portfolio_id, "portfolio_id")
            # On a thread: the portfolio's lock may be held by a batch waiting for its commit.
            loop = asyncio.get_running_loop()
            existed = await loop.run_in_executor(self.executor, self.store.reset, portfolio_id)
            return pb.ResetPortfolioResponse(existed=existed)

        return await self._call("ResetPortfolio", context, handle)


def _answered_by(response: object) -> tuple[str, str]:
    """The one model version that answered a call, for its metric labels, else empty."""
    if isinstance(response, pb.AllocateResponse):
        return response.model.name, response.model.version
    if isinstance(response, pb.AllocateBatchResponse):
        models = {(r.model.name, r.model.version) for r in response.responses}
        if len(models) == 1:
            return models.pop()
    return "", ""


def _list_models(snapshot: CatalogSnapshot) -> pb.ListModelsResponse:
    out = pb.ListModelsResponse()
    for (name, version), model in sorted(snapshot.models.items()):
        manifest = model.manifest
        out.models.append(
            pb.ModelInfo(
                name=name,
                version=version,
                algorithm=manifest.algorithm,
                max_assets=model.max_request_assets,
                window=model.prices_per_asset - 1,
                beta=manifest.beta,
                has_icm=model.icm_session is not None,
                provider=model.provider,
                is_default=(
                    snapshot.default_name == name and snapshot.defaults.get(name) == version
                ),
            )
        )
    for (name, version), refusal in sorted(snapshot.refused.items()):
        out.refused.append(
            pb.ModelRefusal(
                name=name, version=version, reason=refusal.reason, message=refusal.message
            )
        )
    return out
