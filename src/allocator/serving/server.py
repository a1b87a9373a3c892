"""The gRPC allocation server: validate, decide under the portfolio's lock, record, answer.

One request, step by step (``serving.step.DecisionStep``, the path the replay runs too):
resolve the model (its pin, else the default from the registry's current snapshot), validate
the request against that model's shape, then, holding the portfolio's lock (in memory, or in
Redis when replicas share portfolios), read its state, decide (``decision.decide_batch``:
observation, ONNX, mask-and-renormalize, EMA, ICM), hand the record to the recorder, wait until
it is durable (``--ack durable``, the default; ``--ack queued`` answers once it is queued), and
only then store the new state. If the recorder refuses the record (its spool is full) or cannot
make it durable, the state does not advance and the client gets UNAVAILABLE: no decision is
acted on that was not recorded. A record that becomes durable only after the call's deadline
still advances the state (the client got DEADLINE_EXCEEDED and fetches that decision by
retrying its request id), so the recorded history and the states never part.

Failure modes map to status codes a client can act on: INVALID_ARGUMENT (names the field, or
the method whose request bytes do not decode: ``serving.decoding``), NOT_FOUND (unknown model
pin), UNAUTHENTICATED, RESOURCE_EXHAUSTED (over the concurrency limit, refused at once by grpc),
DEADLINE_EXCEEDED, UNAVAILABLE (recording or Redis down). Nothing a client sends gives INTERNAL:
only a bug does; the server stays SERVING through all of them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from typing import Any, TypeVar

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from prometheus_client import CollectorRegistry, start_http_server

from allocator.metrics.recorder import RecorderMetrics
from allocator.metrics.serving import ServingMetrics
from allocator.recording.recorder import Recorder
from allocator.recording.records import ModelRecord
from allocator.recording.settings import database_url
from allocator.registry.errors import ModelNotFoundError
from allocator.serving.catalog import CatalogSnapshot, ModelCatalog
from allocator.serving.config import ServerConfig
from allocator.serving.decoding import DecodeGuardInterceptor
from allocator.serving.loader import LoadedModel
from allocator.serving.proto.v1 import allocator_pb2 as pb
from allocator.serving.proto.v1 import allocator_pb2_grpc as pb_grpc
from allocator.serving.restore import restore_states
from allocator.serving.security import TokenAuthInterceptor, read_tokens, server_credentials
from allocator.serving.state import MemoryStateStore, RedisStateStore, StateStore
from allocator.serving.status import error_status
from allocator.serving.step import DecisionStep, batch_response
from allocator.serving.stream import METHOD as STREAM_METHOD
from allocator.serving.stream import AllocationStreams
from allocator.serving.validation import validate_reset

__all__ = ["SERVICE", "AllocationServer", "AllocatorServicer", "ServerConfig", "build_server"]

log = logging.getLogger("allocator.serving")

SERVICE = pb.DESCRIPTOR.services_by_name["Allocator"]
"""The allocation service's descriptor: its name and methods label the standard gRPC metrics."""

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Allocator"].full_name
_DRAIN_QUIET_SECONDS = 0.1
"""The drain ends once no call came for this long: the clients have moved on."""
T = TypeVar("T")


class _Refusal(Exception):  # noqa: N818  (control flow, never leaves this module)
    """A call refused with a status code and a message for the client (a draining server)."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _model_record(model: LoadedModel) -> ModelRecord:
    manifest = model.manifest.model_dump(mode="json")
    return ModelRecord(
        model.name, model.version, model.manifest.algorithm, manifest, dict(model.manifest.files)
    )


class AllocatorServicer(pb_grpc.AllocatorServicer):
    """The ``allocator.v1.Allocator`` service over a registry, a state store and a recorder."""

    def __init__(
        self,
        registry: ModelCatalog,
        store: StateStore,
        metrics: ServingMetrics,
        recorder: Recorder | None,
        recent_requests: int = 10_000,
    ) -> None:
        self.registry = registry
        self.store = store
        self.metrics = metrics
        self.recorder = recorder
        self.step = DecisionStep(store, recorder, metrics, recent_requests)
        self.draining = threading.Event()
        self.last_call = 0.0  # time.monotonic() of the latest call, for the drain
        self.streams = AllocationStreams(
            self.step, lambda: self.registry.snapshot.resolve, metrics, self.draining, self._touch
        )

    def _touch(self) -> None:
        self.last_call = time.monotonic()

    # --- plumbing ------------------------------------------------------------------------

    def _call(
        self,
        method: str,
        context: grpc.ServicerContext,
        handler: Callable[[], T],
        decisions: int = 1,
    ) -> T:
        """Run ``handler``, map refusals to status codes, and time the call by outcome (per
        decision: ``decisions`` is a batch's size)."""
        start = time.perf_counter()
        self.last_call = time.monotonic()
        self.metrics.observe_started(method)
        code = grpc.StatusCode.OK
        message = ""
        model = version = ""
        try:
            if self.draining.is_set():
                raise _Refusal(grpc.StatusCode.UNAVAILABLE, "server shutting down, retry")
            result = handler()
            model, version = _answered_by(result)
            return result
        except _Refusal as exc:
            code, message = exc.code, exc.message
        except Exception as exc:
            code, message = error_status(exc)
            if code is grpc.StatusCode.INTERNAL:
                log.exception("%s failed", method)
        finally:
            self.metrics.observe_request(
                method,
                code,
                time.perf_counter() - start,
                decisions,
                model=model,
                version=version,
            )
        context.abort(code, message)
        raise AssertionError("unreachable: context.abort raises")

    # --- the service ---------------------------------------------------------------------

    def Allocate(  # noqa: N802  (gRPC method name)
        self, request: pb.AllocateRequest, context: grpc.ServicerContext
    ) -> pb.AllocateResponse:
        start = time.perf_counter()

        def handle() -> pb.AllocateResponse:
            answer = self.step.allocate(
                request,
                self.registry.snapshot.resolve,
                started=start,
                time_remaining=context.time_remaining,
            )
            return answer.response

        return self._call("Allocate", context, handle)

    def AllocateBatch(  # noqa: N802
        self, request: pb.AllocateBatchRequest, context: grpc.ServicerContext
    ) -> pb.AllocateBatchResponse:
        start = time.perf_counter()

        def handle() -> pb.AllocateBatchResponse:
            answers = self.step.allocate_batch(
                request,
                self.registry.snapshot.resolve,
                started=start,
                time_remaining=context.time_remaining,
            )
            return batch_response(answers)

        return self._call("AllocateBatch", context, handle, len(request.requests))

    def AllocateStream(  # noqa: N802
        self, request_iterator: Iterator[pb.AllocateStreamRequest], context: grpc.ServicerContext
    ) -> Iterator[pb.AllocateStreamResponse]:
        return self.streams.serve(request_iterator, context)

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
            portfolio_id = validate_reset(request)
            return pb.ResetPortfolioResponse(existed=self.store.reset(portfolio_id))

        return self._call("ResetPortfolio", context, handle)


def _answered_by(response: object) -> tuple[str, str]:
    """The model version that answered a call, for its metric labels: the one model of its
    decisions, or empty when it made none (``ListModels``) or more than one answered."""
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


class AllocationServer:
    """A built server: start it, read its port, stop it gracefully (what SIGTERM does)."""

    def __init__(
        self,
        config: ServerConfig,
        server: grpc.Server,
        port: int,
        servicer: AllocatorServicer,
        health_servicer: health.HealthServicer,
        registry: ModelCatalog,
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
        self.servicer.streams.wake()  # idle streams end now, busy ones after their messages
        deadline = time.monotonic() + self.config.drain_seconds
        while (now := time.monotonic()) < deadline:
            quiet = now - self.servicer.last_call
            if quiet >= _DRAIN_QUIET_SECONDS:
                return
            time.sleep(min(_DRAIN_QUIET_SECONDS - quiet, deadline - now))

    def wait(self) -> None:
        self.server.wait_for_termination()


def build_server(
    config: ServerConfig,
    metrics_registry: CollectorRegistry | None = None,
    *,
    reuse_port: bool = False,
) -> AllocationServer:
    """Load the registry, open the recorder and state store, and bind (not start) the server.

    ``reuse_port`` binds with SO_REUSEPORT, for worker processes sharing one port
    (``serving.workers``); off, a second server on a taken port fails to bind instead.
    """
    metrics_registry = metrics_registry if metrics_registry is not None else CollectorRegistry()
    metrics = ServingMetrics(metrics_registry, config.latency_budget_ms / 1e3, SERVICE)
    registry = ModelCatalog(
        config.registry,
        default_model=config.default_model,
        prefer_cuda=config.prefer_cuda,
        metrics=metrics,
    )
    recorder = _open_recorder(config, metrics_registry)
    store: StateStore = (
        RedisStateStore(config.redis_url) if config.redis_url else MemoryStateStore()
    )
    if recorder is not None and isinstance(store, MemoryStateStore):
        # Before the recorder starts: its writer replays (and deletes) the spool being read.
        restored = restore_states(recorder.sink.url, recorder.spool, store)
        log.info("restored %d portfolio states from the recorded decisions", restored)
    _load_models(registry, config, metrics, recorder)
    servicer = AllocatorServicer(registry, store, metrics, recorder, config.idempotency_cache)
    health_servicer = health.HealthServicer(experimental_non_blocking=True)
    server = _grpc_server(config, metrics, servicer, health_servicer, reuse_port)
    port = _bind(config, server)
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


def _open_recorder(config: ServerConfig, metrics_registry: CollectorRegistry) -> Recorder | None:
    """The recorder (not started yet), or None when recording is off."""
    if not config.record:
        return None
    return Recorder(
        config.database_url or database_url(),
        config.spool_dir,
        metrics=RecorderMetrics(metrics_registry),
        spool_quota_bytes=config.spool_quota_bytes,
        ack=config.ack,
        commit_window=config.group_commit_ms / 1000,
    )


def _load_models(
    registry: ModelCatalog,
    config: ServerConfig,
    metrics: ServingMetrics,
    recorder: Recorder | None,
) -> None:
    """Load every model of the registry, registering each with the recorder and publishing the
    default's identity as metrics (again on every reload); refuse to serve with no model."""

    def on_change(snapshot: CatalogSnapshot) -> None:
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


def _grpc_server(
    config: ServerConfig,
    metrics: ServingMetrics,
    servicer: AllocatorServicer,
    health_servicer: health.HealthServicer,
    reuse_port: bool = False,
) -> grpc.Server:
    """The gRPC server with the allocator, health and reflection services (auth if asked)."""
    interceptors: list[grpc.ServerInterceptor] = []
    if config.auth_token_file is not None:

        def denied(method: str) -> None:
            if method in metrics.grpc.method_types:  # not a method of another service's
                metrics.observe_rejected(method, grpc.StatusCode.UNAUTHENTICATED, 0.0)

        interceptors.append(TokenAuthInterceptor(read_tokens(config.auth_token_file), denied))

    def undecodable(method: str, seconds: float) -> None:
        service, _, name = method.rpartition("/")
        if service == f"/{SERVICE_NAME}":  # the metrics count the allocation service's calls
            metrics.observe_rejected(name, grpc.StatusCode.INVALID_ARGUMENT, seconds)

    per_message = (f"/{SERVICE_NAME}/{STREAM_METHOD}",)  # a bad message gets its own reply
    interceptors.append(DecodeGuardInterceptor(undecodable, per_message))  # after the token
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=config.threads, thread_name_prefix="allocator"),
        interceptors=interceptors,
        maximum_concurrent_rpcs=config.max_concurrent_rpcs,
        options=[
            ("grpc.max_receive_message_length", 64 << 20),
            ("grpc.max_send_message_length", 64 << 20),
            ("grpc.so_reuseport", int(reuse_port)),
            # A client keeps one HTTP/2 connection for as long as it lives, so replicas added
            # later (the HPA) would only ever see new clients: closing connections after a
            # while (GOAWAY; clients reconnect, through the balancer) spreads them again.
            ("grpc.max_connection_age_ms", max(1, round(config.max_connection_age_seconds * 1000))),
            (
                "grpc.max_connection_age_grace_ms",
                round(config.max_connection_age_grace_seconds * 1000),
            ),
        ],
    )
    pb_grpc.add_AllocatorServicer_to_server(servicer, server)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(
        (
            SERVICE_NAME,
            health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
            reflection.SERVICE_NAME,
        ),
        server,
    )
    return server


def _bind(config: ServerConfig, server: grpc.Server) -> int:
    """Bind the configured address (TLS when a certificate is given); the bound port."""
    address = f"{config.host}:{config.port}"
    if config.tls_cert is not None and config.tls_key is not None:
        credentials = server_credentials(config.tls_cert, config.tls_key, config.tls_client_ca)
        port = server.add_secure_port(address, credentials)
    else:
        port = server.add_insecure_port(address)
    if port == 0:
        raise OSError(f"cannot bind {address}")
    return port
