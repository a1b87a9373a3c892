"""A tiny real gRPC server for client tests: the real ``validation`` module and a bearer
token in front of deterministic weights, so a client's encoding, metadata and error mapping
are exercised end to end over a real channel."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent import futures
from contextlib import contextmanager
from dataclasses import dataclass, field

import grpc
import numpy as np
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from allocator.serving.proto import SERVICE_NAME, allocator_pb2, allocator_pb2_grpc
from allocator.serving.validation import (
    InvalidRequest,
    ModelShape,
    validate_batch,
)
from tests.serving.requests import validate_one

TOKEN = "s3cret-token"
MODELS = {
    ("alpha", "1"): ModelShape(max_assets=5, window=4),
    ("alpha", "2"): ModelShape(max_assets=5, window=4),
    ("wide", "10"): ModelShape(max_assets=3, window=9),
}
DEFAULT = "alpha"


def _newest(name: str) -> str:
    return max((v for n, v in MODELS if n == name), key=int)


def raw_weights(prices: np.ndarray) -> np.ndarray:
    """Deterministic stand-in for a policy: cash 0.1, the rest by last price."""
    last = prices[:, -1]
    return np.concatenate([[0.1], 0.9 * last / last.sum()])


@dataclass
class EchoServicer(allocator_pb2_grpc.AllocatorServicer):
    token: str | None = TOKEN
    delay: float = 0.0
    state: dict[str, np.ndarray] = field(default_factory=dict)
    metadata_seen: list[dict[str, str]] = field(default_factory=list)

    def _auth(self, context: grpc.ServicerContext) -> None:
        metadata = dict(context.invocation_metadata())
        self.metadata_seen.append(metadata)
        if self.token is not None and metadata.get("authorization") != f"Bearer {self.token}":
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong bearer token")

    def _resolve(self, name: str | None, version: str | None) -> tuple[str, str]:
        name = name or DEFAULT
        version = version or (_newest(name) if any(n == name for n, _ in MODELS) else "")
        if (name, version) not in MODELS:
            raise KeyError(f"model {name}/{version or '<newest>'} is not loaded")
        return name, version

    def _answer(self, request: allocator_pb2.AllocateRequest) -> allocator_pb2.AllocateResponse:
        name, version = self._resolve(request.model.name or None, request.model.version or None)
        valid = validate_one(request, MODELS[name, version])
        raw = raw_weights(valid.prices)
        previous = self.state.get(valid.portfolio_id)
        smoothed = (
            raw if previous is None or previous.shape != raw.shape else 0.5 * (raw + previous)
        )
        current = valid.current_weights if valid.current_weights is not None else previous
        turnover = 0.0 if current is None else float(np.abs(smoothed - current)[1:].sum())
        self.state[valid.portfolio_id] = smoothed
        response = allocator_pb2.AllocateResponse(
            request_id=valid.request_id,
            portfolio_id=valid.portfolio_id,
            asset_ids=["CASH", *valid.asset_ids],
            raw_weights=raw.tolist(),
            smoothed_weights=smoothed.tolist(),
            model=allocator_pb2.ModelRef(name=name, version=version),
            turnover=turnover,
        )
        if previous is not None:
            response.icm_reward = 0.25
        return response

    def Allocate(self, request, context):  # noqa: N802 - the generated base class's name
        self._auth(context)
        time.sleep(self.delay)
        try:
            return self._answer(request)
        except InvalidRequest as error:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(error))
        except KeyError as error:
            context.abort(grpc.StatusCode.NOT_FOUND, error.args[0])

    def AllocateBatch(self, request, context):  # noqa: N802
        self._auth(context)
        try:
            validate_batch(request, lambda n, v: MODELS[self._resolve(n, v)])
            responses = [self._answer(r) for r in request.requests]
        except InvalidRequest as error:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(error))
        except KeyError as error:
            context.abort(grpc.StatusCode.NOT_FOUND, error.args[0])
        return allocator_pb2.AllocateBatchResponse(responses=responses)

    def ListModels(self, request, context):  # noqa: N802
        self._auth(context)
        return allocator_pb2.ListModelsResponse(
            models=[
                allocator_pb2.ModelInfo(
                    name=name,
                    version=version,
                    algorithm="td3",
                    max_assets=shape.max_assets,
                    window=shape.window,
                    beta=0.5,
                    has_icm=name == "alpha",
                    provider="CPUExecutionProvider",
                    is_default=(name, version) == (DEFAULT, _newest(DEFAULT)),
                )
                for (name, version), shape in sorted(MODELS.items())
            ]
        )

    def ResetPortfolio(self, request, context):  # noqa: N802
        self._auth(context)
        return allocator_pb2.ResetPortfolioResponse(
            existed=self.state.pop(request.portfolio_id, None) is not None
        )


@dataclass
class Server:
    target: str
    servicer: EchoServicer
    health: health.HealthServicer


def start_echo(
    servicer: EchoServicer, credentials: grpc.ServerCredentials | None = None
) -> tuple[grpc.Server, Server]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    allocator_pb2_grpc.add_AllocatorServicer_to_server(servicer, server)
    health_servicer = health.HealthServicer()
    health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    health_servicer.set(SERVICE_NAME, health_pb2.HealthCheckResponse.SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    if credentials is None:
        port = server.add_insecure_port("127.0.0.1:0")
    else:
        port = server.add_secure_port("127.0.0.1:0", credentials)
    assert port > 0
    server.start()
    return server, Server(f"127.0.0.1:{port}", servicer, health_servicer)


def echo_prices(n: int, window: int = 4, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return 100.0 * np.exp(rng.normal(0.0, 0.01, size=(n, window + 1)).cumsum(axis=1))


@contextmanager
def serving_echo() -> Iterator[Server]:
    """An echo server on a free port, stopped at the end."""
    grpc_server, info = start_echo(EchoServicer())
    try:
        yield info
    finally:
        grpc_server.stop(grace=None)
