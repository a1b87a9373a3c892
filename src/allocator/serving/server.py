"""The gRPC allocation server: one event loop per process (``grpc.aio`` on an
``EventLoopThread``) answers every call; the request path, step by step, is flow (a) of
docs/architecture.md. Only a bug gives INTERNAL (``serving.status``).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Coroutine
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from prometheus_client import CollectorRegistry

from allocator.metrics.recorder import RecorderMetrics
from allocator.metrics.serving import ServingMetrics
from allocator.recording.recorder import Recorder
from allocator.recording.records import ModelRecord
from allocator.recording.settings import database_url
from allocator.registry.errors import ModelNotFoundError
from allocator.serving.catalog import CatalogSnapshot, ModelCatalog
from allocator.serving.client import MESSAGE_LIMITS
from allocator.serving.config import ServerConfig
from allocator.serving.decoding import DecodeGuardInterceptor
from allocator.serving.loader import LoadedModel
from allocator.serving.proto import SERVICE_NAME
from allocator.serving.proto.v1 import allocator_pb2 as pb
from allocator.serving.proto.v1 import allocator_pb2_grpc as pb_grpc
from allocator.serving.restore import restore_states
from allocator.serving.security import TokenAuthInterceptor, read_tokens, server_credentials
from allocator.serving.servicer import AllocatorServicer
from allocator.serving.state import MemoryStateStore, RedisStateStore, StateStore
from allocator.serving.stream import METHOD as STREAM_METHOD

__all__ = ["SERVICE", "AllocationServer", "AllocatorServicer", "ServerConfig", "build_server"]


log = logging.getLogger("allocator.serving")

SERVICE = pb.DESCRIPTOR.services_by_name["Allocator"]
"""The allocation service's descriptor: its name and methods label the standard gRPC metrics."""
_DRAIN_QUIET_SECONDS = 0.1
"""The drain ends once no call came for this long: the clients have moved on."""


def _model_record(model: LoadedModel) -> ModelRecord:
    manifest = model.manifest.model_dump(mode="json")
    return ModelRecord(
        model.name, model.version, model.manifest.algorithm, manifest, dict(model.manifest.files)
    )


T = TypeVar("T")

LoopKind = Literal["uvloop", "asyncio"]


def new_event_loop(kind: LoopKind) -> asyncio.AbstractEventLoop:
    """A new loop of ``kind``; uvloop missing (Windows has no wheels) is a clear error."""
    if kind == "asyncio":
        return asyncio.new_event_loop()
    try:
        import uvloop  # only when chosen: the asyncio loop needs nothing installed
    except ImportError as exc:
        raise RuntimeError(
            "event_loop: uvloop is not installed (pip install uvloop, or set event_loop: asyncio)"
        ) from exc
    return uvloop.new_event_loop()


class EventLoopThread:
    """An event loop of ``kind`` running on a daemon thread until ``close``, so the main thread
    stays free for signals and tests and demos can drive a server from synchronous code. uvloop
    by default: grpc.aio hands every completion to the loop, and libuv's loop runs those
    callbacks, futures and thread hand-offs for less Python than asyncio's."""

    def __init__(self, kind: LoopKind = "uvloop") -> None:
        self.loop = new_event_loop(kind)
        self._thread = threading.Thread(target=self._serve, name="allocator-loop", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run ``coroutine`` on the loop from any other thread; its result."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result()

    def close(self) -> None:
        if self.loop.is_closed():
            return
        if self._thread.is_alive():
            self.run(_cancel_others())
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join()
        self.loop.close()


async def _cancel_others() -> None:
    current = asyncio.current_task()
    tasks = [t for t in asyncio.all_tasks() if t is not current]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


@dataclass(eq=False)
class AllocationServer:
    """A built server: start it, read its port, stop it gracefully (what SIGTERM does). Its
    methods are called from ordinary threads and run loop work on ``loop``."""

    config: ServerConfig
    loop: EventLoopThread
    server: grpc.aio.Server
    port: int
    servicer: AllocatorServicer
    health: health.aio.HealthServicer
    registry: ModelCatalog
    recorder: Recorder | None
    store: StateStore
    metrics_registry: CollectorRegistry
    metrics_port: int | None = field(default=None, init=False)
    _metrics_http: Any = field(default=None, init=False)
    _stopped: threading.Event = field(default_factory=threading.Event, init=False)

    @property
    def target(self) -> str:
        return self.config.dial_target(self.port)

    def start(self) -> AllocationServer:
        self._metrics_http, self.metrics_port = self.config.serve_metrics(self.metrics_registry)
        self.loop.run(self._start())
        self.registry.watch(self.config.reload_interval)
        log.info("allocation server listening on %s", self.target)
        return self

    async def _start(self) -> None:
        self.servicer.batcher.start()
        await self.server.start()
        await self._set_health(serving=self.registry.snapshot.default_name is not None)

    async def _set_health(self, serving: bool) -> None:
        response = health_pb2.HealthCheckResponse
        status = response.SERVING if serving else response.NOT_SERVING
        for service in ("", SERVICE_NAME):  # the server as a whole, and the allocation service
            await self.health.set(service, status)

    def stop(self, grace: float | None = None) -> None:
        """NOT_SERVING, refuse new calls, finish in-flight ones, flush the recorder."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        self.registry.stop()
        self.loop.run(self._stop(self.config.grace_seconds if grace is None else grace))
        self.loop.close()
        self.servicer.executor.shutdown()
        if self.recorder is not None and not self.recorder.close(60):
            log.error("recorder did not finish within 60 s; the spool keeps the rest")
        self.store.close()
        if self._metrics_http is not None:
            self._metrics_http.shutdown()
        log.info("allocation server stopped")

    async def _stop(self, grace: float) -> None:
        await self._set_health(serving=False)
        await self._drain()
        await self.server.stop(grace)
        await self.servicer.batcher.close()

    async def _drain(self) -> None:
        """Answer new calls UNAVAILABLE until clients go quiet (or ``drain_seconds``).

        grpc's shutdown cancels calls that arrived but had no handler yet (CANCELLED,
        grpc/grpc#41785), which clients do not retry; UNAVAILABLE they retry elsewhere.
        """
        self.servicer.draining = True
        await self.servicer.streams.wake()  # idle streams end now, busy ones after their messages
        deadline = time.monotonic() + self.config.drain_seconds
        while (now := time.monotonic()) < deadline:
            quiet = now - self.servicer.last_call
            if quiet >= _DRAIN_QUIET_SECONDS:
                return
            await asyncio.sleep(min(_DRAIN_QUIET_SECONDS - quiet, deadline - now))


def build_server(config: ServerConfig, *, reuse_port: bool = False) -> AllocationServer:
    """Load the registry, open the recorder and state store, and bind (not start) the server;
    ``reuse_port``: SO_REUSEPORT, for workers sharing one port."""
    metrics_registry = CollectorRegistry()
    metrics = ServingMetrics(metrics_registry, config.latency_budget_ms / 1e3, SERVICE)
    recorder = None
    if config.record:
        recorder = Recorder(
            config.database_url or database_url(),
            config.spool_dir,
            metrics=RecorderMetrics(metrics_registry),
            spool_quota_bytes=config.spool_quota_bytes,
            ack=config.ack,
            commit_window=0.0,  # a batch is one ticket: the batcher's window is the commit's
        )
    store: StateStore = (
        RedisStateStore(config.redis_url) if config.redis_url else MemoryStateStore()
    )
    if recorder is not None and isinstance(store, MemoryStateStore):
        # Before the recorder starts: its writer replays (and deletes) the spool being read.
        restored = restore_states(recorder.sink.url, recorder.spool, store)
        log.info("restored %d portfolio states from the recorded decisions", restored)

    # Every model registered with the recorder, the default's identity published, per reload.
    def on_change(snapshot: CatalogSnapshot) -> None:
        if recorder is not None:
            for model in snapshot.models.values():
                recorder.register_model(_model_record(model))
        if snapshot.default_name is not None:
            default = snapshot.default
            manifest = default.manifest
            metrics.model_info.set(
                name=default.name,
                version=default.version,
                algorithm=manifest.algorithm,
                holds_anchor=str(manifest.holds_anchor).lower(),
            )
            metrics.provider_info.set(provider=default.provider)

    registry = ModelCatalog(
        config.registry,
        default_model=config.default_model,
        prefer_cuda=config.prefer_cuda,
        metrics=metrics,
        on_change=on_change,
    )
    if recorder is not None:
        recorder.start()
    registry.refresh()
    if registry.snapshot.default_name is None:
        refused = registry.snapshot.refused.items()
        failures = "; ".join(f"{n}/{v}: {why.message}" for (n, v), why in refused)
        if recorder is not None:
            recorder.close()
        raise ModelNotFoundError(
            f"{config.registry}: no model to serve"
            + (f" ({failures})" if failures else " (the registry is empty)")
        )
    executor = futures.ThreadPoolExecutor(config.threads, thread_name_prefix="allocator-store")
    servicer = AllocatorServicer(registry, store, metrics, recorder, config, executor)
    loop = EventLoopThread(config.event_loop)
    try:
        server, health_servicer, port = loop.run(
            _grpc_server(config, metrics, servicer, reuse_port)
        )
    except BaseException:
        loop.close()
        raise
    return AllocationServer(
        config,
        loop,
        server,
        port,
        servicer,
        health_servicer,
        registry,
        recorder,
        store,
        metrics_registry,
    )


async def _grpc_server(
    config: ServerConfig,
    metrics: ServingMetrics,
    servicer: AllocatorServicer,
    reuse_port: bool = False,
) -> tuple[grpc.aio.Server, health.aio.HealthServicer, int]:
    """On the server's loop: the bound server, its health servicer and its port."""
    interceptors: list[grpc.aio.ServerInterceptor] = []
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
    server = grpc.aio.server(
        interceptors=interceptors,
        options=[
            *MESSAGE_LIMITS,
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
    health_servicer = health.aio.HealthServicer()
    pb_grpc.add_AllocatorServicer_to_server(servicer, server)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    services = (SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME)
    reflection.enable_server_reflection(services, server)
    address = f"{config.host}:{config.port}"
    if config.tls_cert is not None and config.tls_key is not None:
        credentials = server_credentials(config.tls_cert, config.tls_key, config.tls_client_ca)
        port = server.add_secure_port(address, credentials)
    else:
        port = server.add_insecure_port(address)
    if port == 0:
        raise OSError(f"cannot bind {address}")
    return server, health_servicer, port
