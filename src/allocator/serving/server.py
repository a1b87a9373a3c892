"""The gRPC allocation server: validate, decide under the portfolio's lock, record, answer.

One request, step by step: resolve the model (its pin, else the default from the registry's
current snapshot), validate the request against that model's shape, then, holding the
portfolio's lock (in memory, or in Redis when replicas share portfolios), read its state,
decide (``decision.decide_batch``: observation, ONNX, mask-and-renormalize, EMA, ICM), hand
the record to the recorder, and only then store the new state. If the recorder refuses the
record (its spool is full), the state does not advance and the client gets UNAVAILABLE: no
decision is acted on that was not recorded.

Failure modes map to status codes a client can act on: INVALID_ARGUMENT (names the field),
NOT_FOUND (unknown model pin), UNAUTHENTICATED, RESOURCE_EXHAUSTED (over the concurrency
limit, refused at once by grpc), DEADLINE_EXCEEDED, UNAVAILABLE (recording or Redis down).
Only a bug gives INTERNAL; the server stays SERVING through all of them.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import grpc
import numpy as np
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from prometheus_client import CollectorRegistry, start_http_server
from pydantic import BaseModel, ConfigDict, Field, model_validator

from allocator.metrics.prometheus import ServingMetrics
from allocator.recording.recorder import Recorder, RecorderRefusedError
from allocator.recording.records import DecisionRecord, ModelRecord, RecordError
from allocator.serving.decision import DecisionError, DecisionInput, DecisionOutput, decide_batch
from allocator.serving.loader import LoadedModel, ModelNotFoundError
from allocator.serving.proto.v1 import allocator_pb2 as pb
from allocator.serving.proto.v1 import allocator_pb2_grpc as pb_grpc
from allocator.serving.registry import ModelRegistry, RegistrySnapshot
from allocator.serving.security import TokenAuthInterceptor, read_tokens, server_credentials
from allocator.serving.state import (
    MemoryStateStore,
    RedisStateStore,
    StateLockLostError,
    StateLockTimeoutError,
    StateStore,
)
from allocator.serving.validation import (
    InvalidRequest,
    ModelShape,
    ValidRequest,
    model_pin,
    validate_batch,
    validate_request,
)

__all__ = ["AllocationServer", "AllocatorServicer", "ServerConfig", "build_server"]

log = logging.getLogger("allocator.serving")

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Allocator"].full_name
_DRAIN_QUIET_SECONDS = 0.1
"""The drain ends once no call came for this long: the clients have moved on."""
T = TypeVar("T")


class ServerConfig(BaseModel):
    """Everything ``allocator serve`` takes; the factory and tests build it directly."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    registry: Path = Field(description="model registry directory (REGISTRY/NAME/VERSION)")
    host: str = Field("127.0.0.1", description="address to bind ([::] for every interface)")
    port: int = Field(50051, ge=0, le=65535, description="gRPC port (0: any free port)")
    metrics_port: int | None = Field(
        9464, ge=0, le=65535, description="Prometheus /metrics port (None: not exposed)"
    )
    database_url: str | None = Field(
        None, description="trade database (None: DATABASE_URL, else sqlite:///allocator.db)"
    )
    record: bool = Field(True, description="record every decision (off only for experiments)")
    spool_dir: Path = Field(Path("spool"), description="the recorder's durable spool")
    spool_quota_bytes: int = Field(1 << 30, ge=1, description="spool size that closes the door")
    redis_url: str | None = Field(None, description="share smoothing state through Redis")
    auth_token_file: Path | None = Field(None, description="require this bearer token")
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_client_ca: Path | None = Field(None, description="require client certificates (mTLS)")
    latency_budget_ms: float = Field(10.0, gt=0, description="P95 budget: metrics and alerts")
    max_concurrent_rpcs: int = Field(64, ge=1, description="beyond it: RESOURCE_EXHAUSTED")
    workers: int = Field(8, ge=1, description="handler threads")
    reload_interval: float = Field(2.0, gt=0, description="seconds between registry scans")
    default_model: str | None = Field(None, description="model answering unpinned requests")
    prefer_cuda: bool = Field(True, description="use onnxruntime's CUDA provider if it loads")
    idempotency_cache: int = Field(100_000, ge=0, description="answers kept for retries")
    grace_seconds: float = Field(10.0, ge=0, description="SIGTERM: time for in-flight calls")
    drain_seconds: float = Field(
        2.0, ge=0, description="SIGTERM: at most this long, new calls get UNAVAILABLE first"
    )

    @model_validator(mode="after")
    def _check_tls(self) -> ServerConfig:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("--tls-cert and --tls-key go together")
        if self.tls_client_ca is not None and self.tls_cert is None:
            raise ValueError("--tls-client-ca (mTLS) needs --tls-cert and --tls-key")
        return self


class _Refusal(Exception):  # noqa: N818  (control flow, never leaves this module)
    """A request refused with a status code and a message for the client."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True, slots=True)
class _Answered:
    portfolio_id: str
    fingerprint: int
    response: pb.AllocateResponse


def _fingerprint(r: ValidRequest) -> int:
    """What makes a retry the same request: its inputs, not only its id (an answer for other
    assets, returned under a reused id, would be applied to the wrong assets)."""
    current = None if r.current_weights is None else r.current_weights.tobytes()
    return hash((r.asset_ids, r.prices.tobytes(), current, r.model_name, r.model_version))


class _IdempotencyCache:
    """Recent answers by request id: a retried request gets the same answer without a second
    step of the portfolio's smoothing (per server process)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._lock = threading.Lock()
        self._items: OrderedDict[str, _Answered] = OrderedDict()

    def get(self, r: ValidRequest) -> pb.AllocateResponse | None:
        if not self.capacity:
            return None
        with self._lock:
            hit = self._items.get(r.request_id)
        if hit is None:
            return None
        if hit.portfolio_id != r.portfolio_id:
            raise _Refusal(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"request_id: {r.request_id!r} was already used for another portfolio",
            )
        if hit.fingerprint != _fingerprint(r):
            raise _Refusal(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"request_id: {r.request_id!r} was already used for a request with other "
                "inputs (assets, prices, current weights or model); a retry resends the same",
            )
        return hit.response

    def put(self, r: ValidRequest, response: pb.AllocateResponse) -> None:
        if not self.capacity:
            return
        with self._lock:
            self._items[r.request_id] = _Answered(r.portfolio_id, _fingerprint(r), response)
            while len(self._items) > self.capacity:
                self._items.popitem(last=False)


def _shape(model: LoadedModel) -> ModelShape:
    spec = model.manifest.feature_spec
    return ModelShape(spec.max_assets, spec.window)


def _model_record(model: LoadedModel) -> ModelRecord:
    manifest = model.manifest.model_dump(mode="json")
    return ModelRecord(
        model.name, model.version, model.manifest.algorithm, manifest, dict(model.manifest.files)
    )


class AllocatorServicer(pb_grpc.AllocatorServicer):
    """The ``allocator.v1.Allocator`` service over a registry, a state store and a recorder."""

    def __init__(
        self,
        registry: ModelRegistry,
        store: StateStore,
        metrics: ServingMetrics,
        recorder: Recorder | None,
        idempotency_cache: int = 100_000,
    ) -> None:
        self.registry = registry
        self.store = store
        self.metrics = metrics
        self.recorder = recorder
        self._answers = _IdempotencyCache(idempotency_cache)
        self.draining = threading.Event()
        self.last_call = 0.0  # time.monotonic() of the latest call, for the drain

    # --- plumbing ------------------------------------------------------------------------

    def _call(self, method: str, context: grpc.ServicerContext, handler: Callable[[], T]) -> T:
        """Run ``handler``, map refusals to status codes, and time the call by outcome."""
        start = time.perf_counter()
        self.last_call = time.monotonic()
        code = grpc.StatusCode.OK
        message = ""
        try:
            if self.draining.is_set():
                raise _Refusal(grpc.StatusCode.UNAVAILABLE, "server shutting down, retry")
            return handler()
        except _Refusal as exc:
            code, message = exc.code, exc.message
        except InvalidRequest as exc:
            code, message = grpc.StatusCode.INVALID_ARGUMENT, str(exc)
        except DecisionError as exc:
            code, message = grpc.StatusCode.INVALID_ARGUMENT, str(exc)
        except RecordError as exc:
            code, message = grpc.StatusCode.INVALID_ARGUMENT, str(exc)
        except ModelNotFoundError as exc:
            code, message = grpc.StatusCode.NOT_FOUND, _naming_field(exc)
        except RecorderRefusedError as exc:
            code, message = grpc.StatusCode.UNAVAILABLE, f"decision not recorded, retry: {exc}"
        except (StateLockTimeoutError, StateLockLostError) as exc:
            code, message = grpc.StatusCode.UNAVAILABLE, f"portfolio busy, retry: {exc}"
        except Exception as exc:
            if _is_redis_error(exc):
                code, message = grpc.StatusCode.UNAVAILABLE, f"state store unavailable: {exc}"
            else:
                log.exception("%s failed", method)
                code, message = grpc.StatusCode.INTERNAL, f"internal error ({type(exc).__name__})"
        finally:
            self.metrics.observe_request(method, code, time.perf_counter() - start)
        context.abort(code, message)
        raise AssertionError("unreachable: context.abort raises")

    # --- deciding ------------------------------------------------------------------------

    def _decide(
        self,
        model: LoadedModel,
        requests: Sequence[ValidRequest],
        context: grpc.ServicerContext,
        start: float,
    ) -> list[pb.AllocateResponse]:
        """Decide for distinct portfolios under their locks; record; then store states.

        The answers cache is read again and written under the locks: a duplicate of a request
        that was in flight while this call waited gets that answer, not a second step. A call
        whose deadline passed while it waited for the locks decides nothing.
        """
        ids = [r.portfolio_id for r in requests]
        with self.store.locked(ids) as session:
            remaining = context.time_remaining()
            if remaining is not None and remaining <= 0:
                raise _Refusal(
                    grpc.StatusCode.DEADLINE_EXCEEDED, "deadline exceeded before deciding"
                )
            states = session.get()
            answers = [self._answers.get(r) for r in requests]
            todo = [i for i, answer in enumerate(answers) if answer is None]
            results = decide_batch(
                model,
                [
                    DecisionInput(r.asset_ids, r.prices, r.current_weights)
                    for r in (requests[i] for i in todo)
                ],
                [states[i] for i in todo],
            )
            decided_at = dt.datetime.now(dt.UTC)
            latency = time.perf_counter() - start
            if self.recorder is not None and todo:
                self.recorder.submit_many(
                    [
                        self._record(model, requests[i], out, decided_at, latency)
                        for i, (out, _) in zip(todo, results, strict=True)
                    ]
                )
            for i, (_, state) in zip(todo, results, strict=True):
                states[i] = state
            session.put(states)
            for i, (out, _) in zip(todo, results, strict=True):
                answers[i] = response = _response(model, requests[i], out)
                self._answers.put(requests[i], response)
        for out, _ in results:
            self.metrics.observe_decision(
                out.raw_weights, out.smoothed_weights, out.turnover, out.icm_reward
            )
        return answers  # type: ignore[return-value]  # every None was decided above

    @staticmethod
    def _record(
        model: LoadedModel,
        request: ValidRequest,
        out: DecisionOutput,
        decided_at: dt.datetime,
        latency: float,
    ) -> DecisionRecord:
        return DecisionRecord.from_validated(
            request_id=request.request_id,
            portfolio_id=request.portfolio_id,
            decided_at=decided_at,
            model_name=model.name,
            model_version=model.version,
            asset_ids=out.asset_ids,
            raw_weights=out.raw_weights,
            smoothed_weights=out.smoothed_weights,
            current_weights=request.current_weights,
            turnover=out.turnover,
            icm_reward=out.icm_reward,
            latency_seconds=latency,
        )

    # --- the service ---------------------------------------------------------------------

    def Allocate(  # noqa: N802  (gRPC method name)
        self, request: pb.AllocateRequest, context: grpc.ServicerContext
    ) -> pb.AllocateResponse:
        start = time.perf_counter()

        def handle() -> pb.AllocateResponse:
            snapshot = self.registry.snapshot
            pin = model_pin(request)
            try:
                model = snapshot.resolve(*pin)
            except ModelNotFoundError as exc:
                exc.add_note("model")
                raise
            valid = validate_request(request, _shape(model), pin=pin)
            cached = self._answers.get(valid)
            if cached is not None:
                return cached
            return self._decide(model, [valid], context, start)[0]

        return self._call("Allocate", context, handle)

    def AllocateBatch(  # noqa: N802
        self, request: pb.AllocateBatchRequest, context: grpc.ServicerContext
    ) -> pb.AllocateBatchResponse:
        start = time.perf_counter()

        def handle() -> pb.AllocateBatchResponse:
            snapshot = self.registry.snapshot
            models: dict[tuple[str | None, str | None], LoadedModel] = {}

            def shape_for(name: str | None, version: str | None) -> ModelShape:
                model = models[(name, version)] = snapshot.resolve(name, version)
                return _shape(model)

            valid = validate_batch(request, shape_for)
            self.metrics.observe_batch(len(valid))
            answers: list[pb.AllocateResponse | None] = [None] * len(valid)
            groups: dict[tuple[str, str], list[int]] = {}
            by_key: dict[tuple[str, str], LoadedModel] = {}
            for i, r in enumerate(valid):
                cached = self._answers.get(r)
                if cached is not None:
                    answers[i] = cached
                    continue
                model = models[(r.model_name, r.model_version)]
                key = (model.name, model.version)
                by_key[key] = model
                groups.setdefault(key, []).append(i)
            for key, members in groups.items():
                decided = self._decide(by_key[key], [valid[i] for i in members], context, start)
                for i, response in zip(members, decided, strict=True):
                    answers[i] = response
            return pb.AllocateBatchResponse(responses=answers)

        return self._call("AllocateBatch", context, handle)

    def ListModels(  # noqa: N802
        self, request: pb.ListModelsRequest, context: grpc.ServicerContext
    ) -> pb.ListModelsResponse:
        def handle() -> pb.ListModelsResponse:
            return _list_models(self.registry.snapshot)

        return self._call("ListModels", context, handle)

    def ResetPortfolio(  # noqa: N802
        self, request: pb.ResetPortfolioRequest, context: grpc.ServicerContext
    ) -> pb.ResetPortfolioResponse:
        def handle() -> pb.ResetPortfolioResponse:
            if not request.portfolio_id:
                raise InvalidRequest("portfolio_id", "is required (a non-empty string)")
            return pb.ResetPortfolioResponse(existed=self.store.reset(request.portfolio_id))

        return self._call("ResetPortfolio", context, handle)


def _naming_field(exc: Exception) -> str:
    """``field: message``, the field from the note a validator attached (``requests[2].model``),
    so an unknown pin in a batch says which item named it."""
    notes = getattr(exc, "__notes__", None)
    return f"{notes[-1]}: {exc}" if notes else str(exc)


def _is_redis_error(exc: Exception) -> bool:
    try:
        import redis
    except ImportError:  # pragma: no cover - redis is a serve dependency
        return False
    return isinstance(exc, redis.RedisError)


def _response(model: LoadedModel, r: ValidRequest, out: DecisionOutput) -> pb.AllocateResponse:
    response = pb.AllocateResponse(
        request_id=r.request_id,
        portfolio_id=r.portfolio_id,
        asset_ids=out.asset_ids,
        raw_weights=out.raw_weights.tolist(),
        smoothed_weights=out.smoothed_weights.tolist(),
        model=pb.ModelRef(name=model.name, version=model.version),
        turnover=out.turnover,
    )
    if out.icm_reward is not None and np.isfinite(out.icm_reward):
        response.icm_reward = out.icm_reward
    return response


def _list_models(snapshot: RegistrySnapshot) -> pb.ListModelsResponse:
    out = pb.ListModelsResponse()
    for (name, version), model in sorted(snapshot.models.items()):
        manifest = model.manifest
        out.models.append(
            pb.ModelInfo(
                name=name,
                version=version,
                algorithm=manifest.algorithm,
                max_assets=manifest.feature_spec.max_assets,
                window=manifest.feature_spec.window,
                beta=manifest.beta,
                has_icm=model.icm_session is not None,
                provider=model.provider,
                is_default=(
                    snapshot.default_name == name and snapshot.defaults.get(name) == version
                ),
            )
        )
    return out


class AllocationServer:
    """A built server: start it, read its port, stop it gracefully (what SIGTERM does)."""

    def __init__(
        self,
        config: ServerConfig,
        server: grpc.Server,
        port: int,
        servicer: AllocatorServicer,
        health_servicer: health.HealthServicer,
        registry: ModelRegistry,
        recorder: Recorder | None,
        store: StateStore,
        metrics_registry: CollectorRegistry,
    ) -> None:
        self.config = config
        self.server = server
        self.port = port
        self.servicer = servicer
        self.health = health_servicer
        self.registry = registry
        self.recorder = recorder
        self.store = store
        self.metrics_registry = metrics_registry
        self.metrics_port: int | None = None
        self._metrics_http: Any = None
        self._stopped = threading.Event()

    @property
    def target(self) -> str:
        host = self.config.host
        host = "127.0.0.1" if host in {"0.0.0.0", "[::]", "::"} else host
        return f"{host}:{self.port}"

    def start(self) -> AllocationServer:
        if self.config.metrics_port is not None:
            http, _ = start_http_server(
                self.config.metrics_port,
                addr=self.config.host.strip("[]"),  # gRPC writes [::]; getaddrinfo wants ::
                registry=self.metrics_registry,
            )
            self._metrics_http = http
            self.metrics_port = http.server_port
        self.server.start()
        self._set_health(serving=self.registry.snapshot.default_name is not None)
        self.registry.watch(self.config.reload_interval)
        log.info("allocation server listening on %s", self.target)
        return self

    def _set_health(self, serving: bool) -> None:
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if serving
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        self.health.set("", status)
        self.health.set(SERVICE_NAME, status)

    def stop(self, grace: float | None = None) -> None:
        """Drain: NOT_SERVING, refuse new calls, finish in-flight ones, flush the recorder."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        self._set_health(serving=False)
        self.registry.stop()
        self._drain()
        done = self.server.stop(self.config.grace_seconds if grace is None else grace)
        done.wait()
        if self.recorder is not None and not self.recorder.close(60):
            log.error("recorder did not finish within 60 s; the spool keeps the rest")
        self.store.close()
        if self._metrics_http is not None:
            self._metrics_http.shutdown()
        log.info("allocation server stopped")

    def _drain(self) -> None:
        """Answer new calls UNAVAILABLE until clients go quiet (or ``drain_seconds``).

        grpc's shutdown cancels calls that arrived but had no handler thread yet (CANCELLED,
        grpc/grpc#41785), which clients do not retry; UNAVAILABLE they retry elsewhere.
        """
        self.servicer.draining.set()
        deadline = time.monotonic() + self.config.drain_seconds
        while (now := time.monotonic()) < deadline:
            quiet = now - self.servicer.last_call
            if quiet >= _DRAIN_QUIET_SECONDS:
                return
            time.sleep(min(_DRAIN_QUIET_SECONDS - quiet, deadline - now))

    def wait(self) -> None:
        self.server.wait_for_termination()


def build_server(
    config: ServerConfig, metrics_registry: CollectorRegistry | None = None
) -> AllocationServer:
    """Load the registry, open the recorder and state store, and bind (not start) the server."""
    metrics_registry = metrics_registry if metrics_registry is not None else CollectorRegistry()
    metrics = ServingMetrics(metrics_registry, config.latency_budget_ms / 1e3)

    registry = ModelRegistry(
        config.registry, default_model=config.default_model, prefer_cuda=config.prefer_cuda
    )
    recorder: Recorder | None = None
    if config.record:
        from allocator.metrics.prometheus import RecorderMetrics
        from allocator.recording.settings import database_url

        recorder = Recorder(
            config.database_url or database_url(),
            config.spool_dir,
            metrics=RecorderMetrics(metrics_registry),
            spool_quota_bytes=config.spool_quota_bytes,
        )

    def on_change(snapshot: RegistrySnapshot) -> None:
        if recorder is not None:
            for model in snapshot.models.values():
                recorder.register_model(_model_record(model))
        if snapshot.default_name is not None:
            default = snapshot.default
            metrics.set_model(default.name, default.version, default.manifest.algorithm)
            metrics.set_provider(default.provider)

    registry.on_change(on_change)
    if recorder is not None:
        recorder.start()
    registry.refresh()
    if registry.snapshot.default_name is None:
        failures = "; ".join(f"{n}/{v}: {why}" for (n, v), why in registry.failures.items())
        if recorder is not None:
            recorder.close()
        raise ModelNotFoundError(
            f"{config.registry}: no model to serve"
            + (f" ({failures})" if failures else " (the registry is empty)")
        )

    store: StateStore = (
        RedisStateStore(config.redis_url) if config.redis_url else MemoryStateStore()
    )
    interceptors: list[grpc.ServerInterceptor] = []
    if config.auth_token_file is not None:

        def denied(method: str) -> None:
            metrics.observe_request(method, grpc.StatusCode.UNAUTHENTICATED, 0.0)

        interceptors.append(TokenAuthInterceptor(read_tokens(config.auth_token_file), denied))
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=config.workers, thread_name_prefix="allocator"),
        interceptors=interceptors,
        maximum_concurrent_rpcs=config.max_concurrent_rpcs,
        options=[
            ("grpc.max_receive_message_length", 64 << 20),
            ("grpc.max_send_message_length", 64 << 20),
            ("grpc.so_reuseport", 0),
        ],
    )
    servicer = AllocatorServicer(registry, store, metrics, recorder, config.idempotency_cache)
    pb_grpc.add_AllocatorServicer_to_server(servicer, server)
    health_servicer = health.HealthServicer(experimental_non_blocking=True)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(
        (
            SERVICE_NAME,
            health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
            reflection.SERVICE_NAME,
        ),
        server,
    )
    address = f"{config.host}:{config.port}"
    if config.tls_cert is not None and config.tls_key is not None:
        credentials = server_credentials(config.tls_cert, config.tls_key, config.tls_client_ca)
        port = server.add_secure_port(address, credentials)
    else:
        port = server.add_insecure_port(address)
    if port == 0:
        raise OSError(f"cannot bind {address}")
    return AllocationServer(
        config,
        server,
        port,
        servicer,
        health_servicer,
        registry,
        recorder,
        store,
        metrics_registry,
    )
