"""What the in-process server tests share: a tiny recording server on port 0 over real gRPC,
a connection to it, request builders and polls.

Servers are built by ``build_server`` with the tiny exported models of ``tests.serving.conftest``
(``tiny/1`` with an ICM, ``plain/1`` without) and record into a migrated SQLite file, so every
answer has been through the real validation, decision, state store and recorder. Nothing is
mocked; waits poll for an event with a generous bound and no test asserts a duration.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import numpy as np
from grpc_health.v1 import health_pb2, health_pb2_grpc

from allocator.recording.migrations import upgrade
from allocator.serving.proto import SERVICE_NAME
from allocator.serving.proto.v1 import allocator_pb2 as pb
from allocator.serving.proto.v1 import allocator_pb2_grpc as pb_grpc
from allocator.serving.server import AllocationServer, ServerConfig, build_server
from tests.serving.conftest import TINY

WINDOW = TINY.window
PER_ASSET = WINDOW + 1
MAX_ASSETS = TINY.max_assets
BETA = 0.5  # tests.serving.make_manifest's
OK = grpc.StatusCode.OK
INVALID = grpc.StatusCode.INVALID_ARGUMENT
NOT_FOUND = grpc.StatusCode.NOT_FOUND
WAIT = 20.0  # upper bound of a poll for something that happens in milliseconds


def price_window(n: int, seed: int = 0) -> np.ndarray:
    """``(n, window + 1)`` positive closes, a random walk per asset."""
    rng = np.random.default_rng(seed)
    return 100.0 * np.exp(rng.normal(0.0, 0.02, (n, PER_ASSET)).cumsum(axis=1))


def make_request(
    portfolio_id: str = "p",
    assets: tuple[str, ...] = ("A", "B", "C"),
    *,
    prices: Any = None,
    current: Any = None,
    request_id: str | None = None,
    model: str | None = None,
    version: str | None = None,
    seed: int = 0,
) -> pb.AllocateRequest:
    p = price_window(len(assets), seed) if prices is None else np.asarray(prices, dtype=float)
    message = pb.AllocateRequest(
        portfolio_id=portfolio_id,
        request_id=request_id or uuid.uuid4().hex,
        asset_ids=list(assets),
        prices=p.ravel().tolist(),
    )
    if current is not None:
        message.current_weights.extend(np.asarray(current, dtype=float).tolist())
    if model is not None or version is not None:
        message.model.name = model or ""
        message.model.version = version or ""
    return message


def sqlite_url(directory: Path) -> str:
    url = f"sqlite:///{directory / 'trades.db'}"
    upgrade(url)
    return url


def start_server(tmp: Path, registry: Path, **overrides: Any) -> AllocationServer:
    """A started server on free ports; SQLite recording unless ``record``/``database_url``."""
    tmp.mkdir(parents=True, exist_ok=True)
    settings_: dict[str, Any] = {
        "registry": registry,
        "port": 0,
        "metrics_port": None,
        "spool_dir": tmp / "spool",
        "prefer_cuda": False,
        "default_model": "tiny",
        "grace_seconds": 2.0,
        "reload_interval": 60.0,
    }
    settings_.update(overrides)
    if settings_.get("record", True) and "database_url" not in settings_:
        settings_["database_url"] = sqlite_url(tmp)
    return build_server(ServerConfig(**settings_)).start()


@dataclass
class Conn:
    """A server with a plaintext channel and raw stubs to it."""

    server: AllocationServer
    channel: grpc.Channel
    stub: pb_grpc.AllocatorStub
    health: health_pb2_grpc.HealthStub

    def call(self, method: str, request: Any, **kwargs: Any) -> tuple[grpc.StatusCode, str, Any]:
        """(code, details, response or None) of one unary call."""
        kwargs.setdefault("timeout", 10.0)
        try:
            return OK, "", getattr(self.stub, method)(request, **kwargs)
        except grpc.RpcError as error:
            return error.code(), error.details() or "", None

    def call_raw(self, method: str, data: bytes, timeout: float = 10.0) -> tuple[Any, str, Any]:
        """(code, details, response bytes or None) of a unary call of ``method`` (a full name,
        ``/allocator.v1.Allocator/Allocate``) whose request is ``data`` as it is: bytes that
        need not be a message at all."""
        call = self.channel.unary_unary(method)  # no (de)serializers: bytes in, bytes out
        try:
            return OK, "", call(data, timeout=timeout)
        except grpc.RpcError as error:
            return error.code(), error.details() or "", None

    def allocate(self, request: pb.AllocateRequest) -> pb.AllocateResponse:
        code, details, response = self.call("Allocate", request)
        assert code is OK, f"{code.name}: {details}"
        return response

    def health_status(self, service: str = "") -> str:
        reply = self.health.Check(health_pb2.HealthCheckRequest(service=service), timeout=10.0)
        return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)

    def serving(self) -> bool:
        return self.health_status("") == self.health_status(SERVICE_NAME) == "SERVING"

    def state(self, portfolio_id: str) -> Any:
        """The portfolio's stored state (None: never decided, or reset)."""
        with self.server.store.locked([portfolio_id]) as session:
            return session.get()[0]

    def counter(self, name: str, **labels: str) -> float:
        value = self.server.metrics_registry.get_sample_value(name, labels)
        return 0.0 if value is None else value


def connect(server: AllocationServer) -> Conn:
    channel = grpc.insecure_channel(server.target)
    return Conn(
        server, channel, pb_grpc.AllocatorStub(channel), health_pb2_grpc.HealthStub(channel)
    )


def wait_for(predicate: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(0.005)


def weights(response: pb.AllocateResponse, which: str = "smoothed") -> np.ndarray:
    return np.asarray(getattr(response, f"{which}_weights"), dtype=np.float64)


def bad(**kwargs: Any) -> pb.AllocateRequest:
    """A request of a fresh portfolio, ``make_request`` with ``kwargs`` (to be spoiled)."""
    return make_request(portfolio_id=f"bad-{uuid.uuid4().hex[:8]}", **kwargs)


def with_price(i: int, value: float) -> Callable[[], pb.AllocateRequest]:
    """A builder of a request whose ``i``-th price is ``value``."""

    def build() -> pb.AllocateRequest:
        p = price_window(3)
        p.flat[i] = value
        return bad(prices=p)

    return build


def batch_of(*items: pb.AllocateRequest) -> pb.AllocateBatchRequest:
    return pb.AllocateBatchRequest(requests=list(items))
