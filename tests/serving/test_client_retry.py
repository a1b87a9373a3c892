"""The clients' retry policy over a real channel, and the asyncio client against the real server.

A small gRPC server defined here refuses the first attempt of every request id with a chosen
status code and answers the next, recording every request id it saw: a retried call must
succeed and the server must have seen the same request id twice (gRPC resends the very same
message). Codes that are not "not now" are never retried. The asyncio client then runs every
method against the real allocation server (``build_server`` over the tiny models).
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import numpy as np
import pytest

from allocator.serving.aio_client import AsyncAllocatorClient
from allocator.serving.client import (
    DEFAULT_RETRY,
    AllocationRequest,
    AllocatorClient,
    AllocatorError,
    RetryPolicy,
)
from allocator.serving.proto import allocator_pb2, allocator_pb2_grpc
from tests.serving.server.helpers import PER_ASSET, price_window, start_server

FAST = RetryPolicy(initial_backoff=0.01, max_backoff=0.05)
"""The default policy with short backoffs, so the tests do not sleep."""


@dataclass
class FlakyServicer(allocator_pb2_grpc.AllocatorServicer):
    """Refuses the first ``failures`` attempts of each request id with ``code``, then answers."""

    code: grpc.StatusCode = grpc.StatusCode.UNAVAILABLE
    failures: int = 1
    seen: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def _attempt(self, request_id: str, context: grpc.ServicerContext) -> None:
        with self.lock:
            self.seen.append(request_id)
            attempt = self.seen.count(request_id)
        if attempt <= self.failures:
            context.abort(self.code, f"attempt {attempt} of {request_id} refused")

    @staticmethod
    def _answer(request: allocator_pb2.AllocateRequest) -> allocator_pb2.AllocateResponse:
        n = len(request.asset_ids)
        weights = [1.0 / (n + 1)] * (n + 1)
        return allocator_pb2.AllocateResponse(
            request_id=request.request_id,
            portfolio_id=request.portfolio_id,
            asset_ids=["CASH", *request.asset_ids],
            raw_weights=weights,
            smoothed_weights=weights,
            model=allocator_pb2.ModelRef(name="flaky", version="1"),
        )

    def Allocate(self, request, context):  # noqa: N802 - the generated base class's name
        self._attempt(request.request_id, context)
        return self._answer(request)

    def AllocateBatch(self, request, context):  # noqa: N802
        self._attempt(",".join(r.request_id for r in request.requests), context)
        return allocator_pb2.AllocateBatchResponse(
            responses=[self._answer(r) for r in request.requests]
        )


@pytest.fixture
def flaky() -> Iterator[tuple[str, FlakyServicer]]:
    servicer = FlakyServicer()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    allocator_pb2_grpc.add_AllocatorServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}", servicer
    server.stop(grace=None)


def prices(n: int = 2) -> np.ndarray:
    return np.full((n, 5), 100.0)


@pytest.mark.parametrize("code", [grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED])
def test_a_refused_attempt_is_retried_with_the_same_request_id(
    flaky: tuple[str, FlakyServicer], code: grpc.StatusCode
) -> None:
    target, servicer = flaky
    servicer.code = code
    with AllocatorClient(target, retry=FAST) as client:
        allocation = client.allocate("p", ["A", "B"], prices(), request_id="r-1")
        assert allocation.request_id == "r-1"
        assert servicer.seen == ["r-1", "r-1"]
        batch = client.allocate_batch(
            [AllocationRequest("p", ["A"], prices(1), request_id=f"b-{i}") for i in range(3)]
        )
    assert [a.request_id for a in batch] == ["b-0", "b-1", "b-2"]
    assert servicer.seen[2:] == ["b-0,b-1,b-2", "b-0,b-1,b-2"]


def test_a_fresh_request_id_is_drawn_once_and_resent_on_retry(
    flaky: tuple[str, FlakyServicer],
) -> None:
    target, servicer = flaky
    with AllocatorClient(target, retry=FAST) as client:
        allocation = client.allocate("p", ["A"], prices(1))
    assert servicer.seen == [allocation.request_id, allocation.request_id]


def test_attempts_stop_at_max_attempts_and_the_last_status_surfaces(
    flaky: tuple[str, FlakyServicer],
) -> None:
    target, servicer = flaky
    servicer.failures = 10
    with AllocatorClient(target, retry=FAST) as client, pytest.raises(AllocatorError) as info:
        client.allocate("p", ["A"], prices(1), request_id="r-2")
    assert info.value.code is grpc.StatusCode.UNAVAILABLE
    assert info.value.details == f"attempt {FAST.max_attempts} of r-2 refused"
    assert servicer.seen == ["r-2"] * FAST.max_attempts


@pytest.mark.parametrize(
    "code",
    [grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.INTERNAL, grpc.StatusCode.NOT_FOUND],
)
def test_a_decided_failure_is_not_retried(
    flaky: tuple[str, FlakyServicer], code: grpc.StatusCode
) -> None:
    target, servicer = flaky
    servicer.code = code
    with AllocatorClient(target, retry=FAST) as client, pytest.raises(AllocatorError) as info:
        client.allocate("p", ["A"], prices(1), request_id="r-3")
    assert info.value.code is code
    assert servicer.seen == ["r-3"]


def test_no_policy_means_no_retry(flaky: tuple[str, FlakyServicer]) -> None:
    target, servicer = flaky
    with AllocatorClient(target, retry=None) as client, pytest.raises(AllocatorError) as info:
        client.allocate("p", ["A"], prices(1), request_id="r-4")
    assert info.value.code is grpc.StatusCode.UNAVAILABLE
    assert servicer.seen == ["r-4"]


def test_the_async_client_retries_the_same_way(flaky: tuple[str, FlakyServicer]) -> None:
    target, servicer = flaky

    async def run() -> str:
        async with AsyncAllocatorClient(target, retry=FAST) as client:
            return (await client.allocate("p", ["A"], prices(1), request_id="r-5")).request_id

    assert asyncio.run(run()) == "r-5"
    assert servicer.seen == ["r-5", "r-5"]


def test_the_default_service_config_names_the_service_and_the_retryable_codes() -> None:
    config = json.loads(DEFAULT_RETRY.service_config())
    (method,) = config["methodConfig"]
    assert method["name"] == [{"service": "allocator.v1.Allocator"}]
    assert method["retryPolicy"] == {
        "maxAttempts": 4,
        "initialBackoff": "0.1s",
        "maxBackoff": "2s",
        "backoffMultiplier": 2.0,
        "retryableStatusCodes": ["UNAVAILABLE", "RESOURCE_EXHAUSTED"],
    }


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_attempts": 1}, "max_attempts must be between 2 and 5"),
        ({"max_attempts": 6}, "max_attempts must be between 2 and 5"),
        ({"initial_backoff": 0.0}, "initial_backoff must be a positive number"),
        ({"backoff_multiplier": float("nan")}, "backoff_multiplier must be a positive number"),
        ({"initial_backoff": 3.0}, r"max_backoff \(2.0\) is below initial_backoff \(3.0\)"),
        ({"codes": ()}, "codes must name at least one status code"),
        ({"codes": ("UNAVAILABLE", "BUSY")}, "codes: 'BUSY' is not a gRPC status code name"),
        ({"codes": ("OK",)}, "codes: 'OK' is not a gRPC status code name"),
    ],
)
def test_a_bad_policy_is_refused_naming_the_setting(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RetryPolicy(**kwargs)


# --- the asyncio client against the real server ---------------------------------------------------


def test_the_async_client_against_the_real_server(tiny_registry: Path, tmp_path: Path) -> None:
    server = start_server(tmp_path, tiny_registry)
    window = price_window(3)
    assert window.shape[1] == PER_ASSET

    async def run() -> None:
        async with AsyncAllocatorClient(server.target) as client:
            assert await client.is_serving()
            models = await client.list_models()
            assert {(m.name, m.version) for m in models} == {("tiny", "1"), ("plain", "1")}
            assert await client.refused_models() == []
            first = await client.allocate("fund", ["A", "B", "C"], window, request_id="a-1")
            again = await client.allocate("fund", ["A", "B", "C"], window, request_id="a-1")
            np.testing.assert_array_equal(first.smoothed_weights, again.smoothed_weights)
            assert first.asset_ids == ("CASH", "A", "B", "C")
            assert first.smoothed_weights.sum() == pytest.approx(1.0)
            batch = await client.allocate_batch(
                [
                    {"portfolio_id": f"b{i}", "asset_ids": ["A"], "prices": window[:1]}
                    for i in range(3)
                ]
            )
            assert [a.portfolio_id for a in batch] == ["b0", "b1", "b2"]
            assert await client.reset_portfolio("fund") is True
            assert await client.reset_portfolio("fund") is False
            with pytest.raises(AllocatorError) as info:
                await client.allocate("fund", ["A"], window[:1], model="ghost")
            assert info.value.code is grpc.StatusCode.NOT_FOUND

    try:
        asyncio.run(run())
    finally:
        server.stop()
