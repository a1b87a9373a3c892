"""A small client of the allocation server, for trading services and notebooks.

Needs grpcio, grpcio-health-checking and numpy only (no onnxruntime, no torch). The bearer
token travels as metadata; every gRPC failure surfaces as ``AllocatorError`` with the status
code and the server's message. Calls refused for now (UNAVAILABLE, RESOURCE_EXHAUSTED) are
retried by the channel (``RetryPolicy``); a retry resends the very same message, so an
allocation keeps its request id and the server answers and records it once.
"""

from __future__ import annotations

import json
import math
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, fields
from typing import Any, Self, TypeAlias, TypeVar

import grpc
import numpy as np
from grpc_health.v1 import health_pb2, health_pb2_grpc
from numpy.typing import ArrayLike, NDArray

from allocator.serving.proto import SERVICE_NAME, allocator_pb2, allocator_pb2_grpc

__all__ = [
    "DEFAULT_RETRY",
    "Allocation",
    "AllocationRequest",
    "AllocatorClient",
    "AllocatorError",
    "ClientChannel",
    "ModelInfo",
    "ModelRefusal",
    "RetryPolicy",
    "StreamAnswer",
    "batch_request",
    "health_status",
    "rpc_errors",
    "stream_request",
]

DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024 * 1024
"""Batch answers for thousands of portfolios exceed gRPC's 4 MiB default."""
MESSAGE_LIMITS = (
    ("grpc.max_receive_message_length", DEFAULT_MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", DEFAULT_MAX_MESSAGE_BYTES),
)

Float64Array = NDArray[np.float64]
T = TypeVar("T")
MAX_GRPC_ATTEMPTS = 5
"""gRPC caps a retry policy's ``maxAttempts`` at 5 (a larger value is silently lowered)."""


@dataclass(frozen=True)
class RetryPolicy:
    """gRPC's ``retryPolicy``: only codes meaning "not now" (the server decided nothing, so a
    resend is safe); throttled per channel, so a refusing server is not sent more load."""

    max_attempts: int = 4
    initial_backoff: float = 0.1
    max_backoff: float = 2.0
    backoff_multiplier: float = 2.0
    codes: tuple[str, ...] = ("UNAVAILABLE", "RESOURCE_EXHAUSTED")

    def __post_init__(self) -> None:
        if not 2 <= self.max_attempts <= MAX_GRPC_ATTEMPTS:
            raise ValueError(
                f"max_attempts must be between 2 and {MAX_GRPC_ATTEMPTS} (gRPC's cap), "
                f"got {self.max_attempts}"
            )
        for name in ("initial_backoff", "max_backoff", "backoff_multiplier"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a positive number, got {value!r}")
        if self.max_backoff < self.initial_backoff:
            raise ValueError(
                f"max_backoff ({self.max_backoff}) is below initial_backoff "
                f"({self.initial_backoff})"
            )
        if not self.codes:
            raise ValueError("codes must name at least one status code")
        for code in self.codes:
            if code not in grpc.StatusCode.__members__ or code == "OK":
                raise ValueError(f"codes: {code!r} is not a gRPC status code name to retry")

    def service_config(self) -> str:
        policy = {
            "maxAttempts": self.max_attempts,
            "initialBackoff": _duration(self.initial_backoff),
            "maxBackoff": _duration(self.max_backoff),
            "backoffMultiplier": self.backoff_multiplier,
            "retryableStatusCodes": list(self.codes),
        }
        return json.dumps(
            {
                "methodConfig": [{"name": [{"service": SERVICE_NAME}], "retryPolicy": policy}],
                "retryThrottling": {"maxTokens": 10, "tokenRatio": 0.1},
            }
        )


DEFAULT_RETRY = RetryPolicy()


def _duration(seconds: float) -> str:
    return f"{seconds:.9f}".rstrip("0").rstrip(".") + "s"


class AllocatorError(Exception):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{code.name}: {details}")
        self.code = code
        self.details = details


@contextmanager
def rpc_errors() -> Iterator[None]:
    try:
        yield
    except grpc.RpcError as error:
        code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
        details = error.details() if hasattr(error, "details") else str(error)
        raise AllocatorError(code or grpc.StatusCode.UNKNOWN, details or "") from None


_CODES = {code.value[0]: code for code in grpc.StatusCode}


def _response_fields(cls: type[T]) -> type[T]:
    """``cls`` as a frozen dataclass with a field per ``AllocateResponse`` field (``model`` as
    ``model_name`` and ``model_version``); one the class does not name yet is added as ``Any``."""
    names = []
    for field in _RESPONSE.fields:
        sub = field.message_type
        names += [f"{field.name}_{f.name}" for f in sub.fields] if sub else [field.name]
    declared = cls.__annotations__
    if unknown := set(declared) - set(names):
        raise TypeError(f"{cls.__name__} names fields AllocateResponse lacks: {sorted(unknown)}")
    cls.__annotations__ = {name: declared.get(name, "Any") for name in names}
    return dataclass(frozen=True)(cls)


_RESPONSE = allocator_pb2.AllocateResponse.DESCRIPTOR


@_response_fields
class Allocation:
    """The server's answer for one portfolio: weights as float64 arrays parallel to
    ``asset_ids`` (``CASH`` first), an absent optional field as ``None``; ``smoothed_weights`` is
    what to execute."""

    request_id: str
    portfolio_id: str
    asset_ids: tuple[str, ...]
    raw_weights: Float64Array
    smoothed_weights: Float64Array
    model_name: str
    model_version: str
    icm_reward: float | None
    turnover: float

    @classmethod
    def from_proto(cls, message: allocator_pb2.AllocateResponse) -> Allocation:
        values: dict[str, Any] = {}
        for field in _RESPONSE.fields:
            value = getattr(message, field.name)
            if field.message_type is not None:
                values |= {
                    f"{field.name}_{f.name}": getattr(value, f.name)
                    for f in value.DESCRIPTOR.fields
                }
            elif field.is_repeated:
                double = field.type == field.TYPE_DOUBLE
                values[field.name] = np.asarray(value, np.float64) if double else tuple(value)
            elif field.has_presence and not message.HasField(field.name):
                values[field.name] = None
            else:
                values[field.name] = value
        make: Callable[..., Allocation] = cls
        return make(**values)

    def to_json(self) -> dict[str, Any]:
        return {
            k: v.tolist() if isinstance(v, np.ndarray) else list(v) if isinstance(v, tuple) else v
            for k, v in vars(self).items()
        }


@dataclass(frozen=True)
class ModelInfo:
    """One loaded model version; requests send ``window + 1`` prices per asset."""

    name: str
    version: str
    algorithm: str
    max_assets: int
    window: int
    beta: float
    has_icm: bool
    provider: str
    is_default: bool

    @classmethod
    def from_proto(cls, message: allocator_pb2.ModelInfo) -> ModelInfo:
        return cls(*(getattr(message, f.name) for f in fields(cls)))


@dataclass(frozen=True)
class ModelRefusal:
    """A version whose files the server refused; ``reason``: ``registry.errors``' reasons."""

    name: str
    version: str
    reason: str
    message: str

    @classmethod
    def from_proto(cls, message: allocator_pb2.ModelRefusal) -> ModelRefusal:
        return cls(*(getattr(message, f.name) for f in fields(cls)))


@dataclass(frozen=True)
class AllocationRequest:
    """One portfolio's request (a dict with these keys works too): ``prices`` of shape
    ``(len(asset_ids), window + 1)``, oldest first; ``current_weights`` CASH first (``None``:
    the server's state); ``request_id`` a fresh uuid4 when ``None`` (reuse it to retry)."""

    portfolio_id: str
    asset_ids: Sequence[str]
    prices: ArrayLike
    current_weights: ArrayLike | None = None
    request_id: str | None = None
    model: str | None = None
    version: str | None = None

    def to_proto(self) -> allocator_pb2.AllocateRequest:
        assets = list(self.asset_ids)
        prices = np.asarray(self.prices, dtype=np.float64)
        if prices.ndim != 2 or prices.shape[0] != len(assets):
            raise ValueError(
                f"prices must have shape (len(asset_ids), window + 1) = ({len(assets)}, ...), "
                f"got {prices.shape}"
            )
        message = allocator_pb2.AllocateRequest(
            portfolio_id=self.portfolio_id,
            request_id=self.request_id or str(uuid.uuid4()),
            asset_ids=assets,
            prices=prices.ravel().tolist(),
        )
        if self.current_weights is not None:
            weights = np.asarray(self.current_weights, dtype=np.float64).ravel()
            message.current_weights.extend(weights.tolist())
        if self.model or self.version:
            message.model.name = self.model or ""
            message.model.version = self.version or ""
        return message


Requests: TypeAlias = Iterable[AllocationRequest | Mapping[str, Any]]


def batch_request(requests: Requests) -> allocator_pb2.AllocateBatchRequest:
    items = (r if isinstance(r, AllocationRequest) else AllocationRequest(**r) for r in requests)
    return allocator_pb2.AllocateBatchRequest(requests=[r.to_proto() for r in items])


def stream_request(sequence: int, requests: Requests) -> allocator_pb2.AllocateStreamRequest:
    message = allocator_pb2.AllocateStreamRequest(sequence=sequence)
    message.batch.requests.extend(batch_request(requests).requests)
    return message


@dataclass(frozen=True)
class StreamAnswer:
    """One stream message's allocations, or the ``error`` a unary call would have got."""

    sequence: int
    allocations: list[Allocation]
    error: AllocatorError | None

    @classmethod
    def from_proto(cls, message: allocator_pb2.AllocateStreamResponse) -> StreamAnswer:
        error = None
        if message.HasField("error"):
            code = _CODES.get(message.error.code, grpc.StatusCode.UNKNOWN)
            error = AllocatorError(code, message.error.message)
        return cls(message.sequence, [Allocation.from_proto(r) for r in message.responses], error)


def health_status(outcome: health_pb2.HealthCheckResponse | AllocatorError) -> str:
    """A check's status name; SERVICE_UNKNOWN for NOT_FOUND; any other failure raised."""
    if isinstance(outcome, AllocatorError):
        if outcome.code is not grpc.StatusCode.NOT_FOUND:
            raise outcome
        return "SERVICE_UNKNOWN"
    return health_pb2.HealthCheckResponse.ServingStatus.Name(outcome.status)


class ClientChannel:
    """The channel both clients hold (``channels``: ``grpc`` or ``grpc.aio``). TLS when any of
    ``root_certificates`` (PEM; ``None`` with a key: the system roots), ``private_key`` and
    ``certificate_chain`` (mTLS, together) is given; ``retry`` ``None`` surfaces every failure."""

    channels: Any = grpc

    def __init__(
        self,
        target: str,
        *,
        token: str | None = None,
        root_certificates: bytes | None = None,
        private_key: bytes | None = None,
        certificate_chain: bytes | None = None,
        timeout: float = 5.0,
        retry: RetryPolicy | None = DEFAULT_RETRY,
        options: Sequence[tuple[str, Any]] = (),
    ) -> None:
        if (private_key is None) != (certificate_chain is None):
            raise ValueError("mTLS needs both private_key and certificate_chain")
        self.target = target
        self.timeout = timeout
        self._metadata: tuple[tuple[str, str], ...] = (
            (("authorization", f"Bearer {token}"),) if token else ()
        )
        retries = (
            [("grpc.enable_retries", 0)]
            if retry is None
            else [("grpc.enable_retries", 1), ("grpc.service_config", retry.service_config())]
        )
        opts = [*MESSAGE_LIMITS, *retries, *options]  # ``options`` may override any of them
        if root_certificates is None and private_key is None:
            self._channel = self.channels.insecure_channel(target, options=opts)
        else:
            credentials = grpc.ssl_channel_credentials(
                root_certificates, private_key, certificate_chain
            )
            self._channel = self.channels.secure_channel(target, credentials, options=opts)
        self._stub = allocator_pb2_grpc.AllocatorStub(self._channel)
        self._health = health_pb2_grpc.HealthStub(self._channel)

    def _unary_options(self, timeout: float | None) -> dict[str, Any]:
        return {"timeout": self.timeout if timeout is None else timeout, "metadata": self._metadata}


class AllocatorClient(ClientChannel):
    """A blocking client; a context manager. Each unary method only builds its request and
    returns ``self._call(...)``: ``AsyncAllocatorClient`` reuses them, awaiting ``_call``."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._channel.close()

    def _call(
        self, method: Any, request: Any, timeout: float | None, decode: Callable[[Any], T]
    ) -> T:
        with rpc_errors():
            return decode(method(request, **self._unary_options(timeout)))

    def allocate(
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
        """Weights for one portfolio now; ``prices``: ``(len(asset_ids), window + 1)``."""
        request = AllocationRequest(
            portfolio_id, asset_ids, prices, current_weights, request_id, model, version
        ).to_proto()
        return self._call(self._stub.Allocate, request, timeout, Allocation.from_proto)

    def allocate_batch(
        self, requests: Requests, *, timeout: float | None = None
    ) -> list[Allocation]:
        """Weights for many portfolios in one call, in request order; all or nothing."""
        return self._call(
            self._stub.AllocateBatch,
            batch_request(requests),
            timeout,
            lambda a: [Allocation.from_proto(r) for r in a.responses],
        )

    def allocate_stream(
        self, batches: Iterable[Requests], *, timeout: float | None = None
    ) -> Iterator[StreamAnswer]:
        """Each batch sent as drawn, numbered from 1, answered in order; a bad one gets its
        ``error``. An early end (a drain) raises ``AllocatorError``: resend the unanswered
        batches, same request ids, on a new stream."""
        messages = (stream_request(i, b) for i, b in enumerate(batches, start=1))
        call = self._stub.AllocateStream(messages, timeout=timeout, metadata=self._metadata)
        try:
            with rpc_errors():
                yield from map(StreamAnswer.from_proto, call)
        finally:
            call.cancel()  # a no-op once the call is over; stops it when the caller left early

    def list_models(self, *, timeout: float | None = None) -> list[ModelInfo]:
        """The loaded versions, sorted by name then version."""
        return self._listed(timeout, lambda a: [ModelInfo.from_proto(m) for m in a.models])

    def refused_models(self, *, timeout: float | None = None) -> list[ModelRefusal]:
        return self._listed(timeout, lambda a: [ModelRefusal.from_proto(m) for m in a.refused])

    def _listed(self, timeout: float | None, decode: Callable[[Any], T]) -> T:
        return self._call(self._stub.ListModels, allocator_pb2.ListModelsRequest(), timeout, decode)

    def reset_portfolio(self, portfolio_id: str, *, timeout: float | None = None) -> bool:
        """True when the server had a state to forget."""
        request = allocator_pb2.ResetPortfolioRequest(portfolio_id=portfolio_id)
        return self._call(self._stub.ResetPortfolio, request, timeout, lambda a: bool(a.existed))

    def health(
        self, services: Sequence[str] = ("", SERVICE_NAME), *, timeout: float | None = None
    ) -> dict[str, str]:
        """Status name per service (``SERVICE_UNKNOWN`` for an unknown one)."""
        return {service: self._status(service, timeout) for service in services}

    def _status(self, service: str, timeout: float | None) -> str:
        request = health_pb2.HealthCheckRequest(service=service)
        try:
            return self._call(self._health.Check, request, timeout, health_status)
        except AllocatorError as error:
            return health_status(error)

    def is_serving(self, *, timeout: float | None = None) -> bool:
        """Whether the server and the Allocator service both report SERVING."""
        return all(s == "SERVING" for s in self.health(timeout=timeout).values())
