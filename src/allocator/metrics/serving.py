"""The allocation server's metrics: latency against its budget, outcomes, decisions, model; labels
named as go-grpc-prometheus names them (``grpc_method``: the short method name, ``grpc_code``:
the status code name), so one selector works across these and the standard ones (``grpc``)."""

from __future__ import annotations

import contextlib
import glob
import math
import os
import threading
from collections.abc import Iterable, Sequence
from enum import Enum

from google.protobuf.descriptor import ServiceDescriptor
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.metrics_core import InfoMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from allocator.metrics.buckets import (
    BATCH_SIZE_BUCKETS,
    GAP_BUCKETS,
    ICM_REWARD_BUCKETS,
    latency_buckets,
)
from allocator.registry.errors import REFUSAL_REASONS
from allocator.typed_config import one_of


class CurrentInfo(Collector):
    """An info metric absent until set, then holding exactly one label set.

    ``prometheus_client.Info`` exposes an unlabelled 1 before it is set, and a labelled ``Gauge``
    needs ``clear()`` then ``set(1)``, between which a scrape sees nothing. Under ``serve --workers
    N`` a worker's collector is never scraped, so there it is a gauge ``NAME_info`` whose previous
    label set goes to 0 (files cannot drop a series)."""

    def __init__(
        self, name: str, documentation: str, labelnames: Sequence[str], registry: CollectorRegistry
    ) -> None:
        self._name = name
        self._documentation = documentation
        self._labelnames = tuple(labelnames)
        self._lock = threading.Lock()
        self._value: dict[str, str] | None = None
        self._gauge: Gauge | None = None
        if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            self._gauge = Gauge(
                f"{name}_info",
                documentation,
                self._labelnames,
                registry=None,  # the supervisor's collector reads the files, not a registry
                multiprocess_mode="liveall",
            )
        else:
            registry.register(self)

    def set(self, **labels: str) -> None:
        if set(labels) != set(self._labelnames):
            raise ValueError(f"{self._name} takes labels {self._labelnames}, got {tuple(labels)}")
        value = {k: str(v) for k, v in labels.items()}
        with self._lock:
            previous, self._value = self._value, value
            if self._gauge is not None:
                self._gauge.labels(**value).set(1)
                if previous is not None and previous != value:
                    self._gauge.labels(**previous).set(0)

    def describe(self) -> Iterable[Metric]:
        """Names only, so that the registry detects a duplicate registration."""
        return [InfoMetricFamily(self._name, self._documentation)]

    def collect(self) -> Iterable[Metric]:
        family = InfoMetricFamily(self._name, self._documentation)
        with self._lock:
            value = self._value
        if value is not None:
            family.add_metric([], value)
        return [family]


GRPC_TYPES = ("unary", "client_stream", "server_stream", "bidi_stream")
"""``grpc_type`` by (client streaming, server streaming), as go-grpc-prometheus names them."""


def code_name(code: str | Enum) -> str:
    """``grpc.StatusCode.OK`` and ``"OK"`` both give ``"OK"`` (no grpc import needed here)."""
    return code.name if isinstance(code, Enum) else str(code)


class GrpcServerMetrics:
    """What stock gRPC dashboards and alerts read, for one service: go-grpc-prometheus's names
    and labels, plus ``model`` and ``version`` (empty when no model was reached, and on streams,
    whose messages may address several) so a rollout compares version against version. A unary
    call is started, received, sent and handled once; a streaming call is started and handled
    once (the whole call's time), and each message is counted as received and, when answered,
    as sent."""

    def __init__(
        self, registry: CollectorRegistry, service: ServiceDescriptor, buckets: Sequence[float]
    ) -> None:
        self.service = service.full_name
        self.method_types = {  # each method's grpc_type, as the proto declares it
            m.name: GRPC_TYPES[m.client_streaming + 2 * m.server_streaming] for m in service.methods
        }
        call = ["grpc_type", "grpc_service", "grpc_method"]
        self.started = Counter(
            "grpc_server_started_total", "RPCs started on the server.", call, registry=registry
        )
        self.handled = Counter(
            "grpc_server_handled_total",
            "RPCs completed on the server, regardless of success or failure, by the model "
            "version that answered.",
            [*call, "grpc_code", "model", "version"],
            registry=registry,
        )
        self.handling_seconds = Histogram(
            "grpc_server_handling_seconds",
            "Response latency of RPCs handled by the server (the whole call), by the model "
            "version that answered.",
            [*call, "model", "version"],
            buckets=buckets,
            registry=registry,
        )
        self.msg_received = Counter(
            "grpc_server_msg_received_total",
            "Messages received from clients.",
            call,
            registry=registry,
        )
        self.msg_sent = Counter(
            "grpc_server_msg_sent_total", "Messages sent to clients.", call, registry=registry
        )
        for method in self.method_types:  # every call series exists from the start for rate()
            for counter in (self.started, self.msg_received, self.msg_sent):
                counter.labels(*self._call(method))

    def _call(self, method: str) -> tuple[str, str, str]:
        kind = self.method_types.get(method)
        if kind is None:
            raise ValueError(
                f"gRPC method {method!r} is not one of {', '.join(sorted(self.method_types))}"
            )
        return kind, self.service, method

    def is_streaming(self, method: str) -> bool:
        """Whether ``method``'s messages are counted one by one instead of with its call."""
        return self._call(method)[0] != "unary"

    def observe_started(self, method: str) -> None:
        """A call of ``method`` arrived (``started - handled`` is the calls in flight)."""
        self.started.labels(*self._call(method)).inc()

    def observe_message(self, method: str) -> None:
        """One message of a streaming call, received and answered (an error too)."""
        call = self._call(method)
        self.msg_received.labels(*call).inc()
        self.msg_sent.labels(*call).inc()

    def observe_handled(
        self,
        method: str,
        code: str | Enum,
        seconds: float,
        *,
        model: str = "",
        version: str = "",
    ) -> None:
        """A finished call; a unary one also counts its request, and its response when OK."""
        call = self._call(method)
        name = code_name(code)
        self.handled.labels(*call, name, model, version).inc()
        self.handling_seconds.labels(*call, model, version).observe(seconds)
        if call[0] == "unary":
            self.msg_received.labels(*call).inc()
            if name == "OK":
                self.msg_sent.labels(*call).inc()


class ServingMetrics:
    """What the allocation server exposes; ``grpc`` holds the standard gRPC server metrics. The
    latency histogram has a bucket exactly at ``latency_budget_seconds`` (the P95 budget of one
    decision) and ``over_budget`` counts requests above it; a call carrying n decisions is observed
    per decision (its time over n), so one alert serves every method."""

    def __init__(
        self,
        registry: CollectorRegistry,
        latency_budget_seconds: float,
        service: ServiceDescriptor,
    ) -> None:
        self.latency_budget_seconds = float(latency_budget_seconds)
        self.latency_buckets = latency_buckets(self.latency_budget_seconds)
        self.grpc = GrpcServerMetrics(registry, service, self.latency_buckets)
        self.request_latency = Histogram(
            "allocator_serving_request_latency_seconds",
            "Server-side latency of a gRPC request per decision it carries (a batch call's time "
            "divided by its decisions), by method and status code name.",
            ["grpc_method", "grpc_code"],
            buckets=self.latency_buckets,
            registry=registry,
        )
        self.requests = Counter(
            "allocator_serving_requests_total",
            "gRPC requests handled, by method and status code name.",
            ["grpc_method", "grpc_code"],
            registry=registry,
        )
        self.over_budget = Counter(
            "allocator_serving_over_budget_total",
            "Requests slower than the configured latency budget per decision, by method.",
            ["grpc_method"],
            registry=registry,
        )
        self.latency_budget = Gauge(
            "allocator_serving_latency_budget_seconds",
            "The configured P95 latency budget, for dashboards and alert rules.",
            registry=registry,
            multiprocess_mode="livemax",  # ``--workers N``: one figure, not one per process
        )
        self.latency_budget.set(self.latency_budget_seconds)
        self._add_decision_metrics(registry)
        self.model_info = CurrentInfo(
            "allocator_serving_model",
            "The model version serving by default: 1 for the current one only; holds_anchor "
            "true when it acts exactly 0 (its anchor: training found no skill to keep).",
            ("name", "version", "algorithm", "holds_anchor"),
            registry,
        )
        self.provider_info = CurrentInfo(
            "allocator_serving_provider",
            "The onnxruntime execution provider in use (CUDAExecutionProvider or "
            "CPUExecutionProvider).",
            ("provider",),
            registry,
        )
        self._add_refusal_metrics(registry)

    def _add_decision_metrics(self, registry: CollectorRegistry) -> None:
        """What the decisions were: smoothing gap, turnover, ICM reward, batch sizes."""
        self.smoothing_gap = Histogram(
            "allocator_serving_smoothing_gap",
            "L1 distance sum|raw - smoothed| between a decision's raw and smoothed weights "
            "(unitless, 0 to 2).",
            buckets=GAP_BUCKETS,
            registry=registry,
        )
        self.turnover = Histogram(
            "allocator_serving_turnover_ratio",
            "Implied turnover of a decision: traded value / NAV, the sum over risky assets of "
            "|served - current| weights, as the training env defines it (0 to 2).",
            buckets=GAP_BUCKETS,
            registry=registry,
        )
        self.icm_reward = Histogram(
            "allocator_serving_icm_reward",
            "Normalized, clipped ICM intrinsic reward of a decision (models trained with ICM); "
            "no _sum because buckets are negative: use quantiles.",
            buckets=ICM_REWARD_BUCKETS,
            registry=registry,
        )
        self.batch_size = Histogram(
            "allocator_serving_batch_size",
            "Portfolios per batch allocation call (or stream message).",
            buckets=BATCH_SIZE_BUCKETS,
            registry=registry,
        )
        self.decided_batch_size = Histogram(
            "allocator_serving_decided_batch_size",
            "Decisions per batch the server decided at once (concurrent calls batched together: "
            "one onnxruntime call per model, one durable commit).",
            buckets=BATCH_SIZE_BUCKETS,
            registry=registry,
        )

    def _add_refusal_metrics(self, registry: CollectorRegistry) -> None:
        """What the registry scan refused: a counter of refusals, a gauge of refused versions."""
        self.model_refused = Counter(
            "allocator_serving_model_refused_total",
            "Model versions refused by the registry scan, by reason: once per distinct refusal "
            "of a version (a new reason or message), never once per scan.",
            ["reason"],
            registry=registry,
        )
        self.models_refused = Gauge(
            "allocator_serving_models_refused",
            "Model versions whose files as they are now are refused, by reason (a copy in "
            "progress shows here for seconds; a bad deploy stays).",
            ["reason"],
            registry=registry,
            multiprocess_mode="livemax",  # every worker scans the same registry
        )
        for reason in REFUSAL_REASONS:  # every series exists from the start: rate() sees the first
            self.model_refused.labels(reason)
            self.models_refused.labels(reason).set(0)

    def observe_refusal(self, reason: str) -> None:
        """A version refused for a new reason (counted once per distinct refusal, not per scan)."""
        self.model_refused.labels(one_of("refusal reason", reason, REFUSAL_REASONS)).inc()

    def set_refused_versions(self, reasons: Iterable[str]) -> None:
        """The reasons of every version whose current files are refused (one entry each)."""
        counts = dict.fromkeys(REFUSAL_REASONS, 0)
        for reason in reasons:
            counts[one_of("refusal reason", reason, REFUSAL_REASONS)] += 1
        for reason, count in counts.items():
            self.models_refused.labels(reason).set(count)

    def observe_request(
        self,
        method: str,
        code: str | Enum,
        seconds: float,
        decisions: int = 1,
        *,
        model: str = "",
        version: str = "",
    ) -> None:
        """One finished request of ``decisions`` decisions; a streaming method's request is one
        message (its call's end is ``grpc.observe_handled``)."""
        self._observe_budget(method, code, seconds, decisions)
        if self.grpc.is_streaming(method):
            self.grpc.observe_message(method)
        else:
            self.grpc.observe_handled(method, code, seconds, model=model, version=version)

    def observe_rejected(self, method: str, code: str | Enum, seconds: float) -> None:
        """A call refused before its handler ran: started and handled at once."""
        self.grpc.observe_started(method)
        self._observe_budget(method, code, seconds, 1)
        self.grpc.observe_handled(method, code, seconds)

    def _observe_budget(
        self, method: str, code: str | Enum, seconds: float, decisions: int
    ) -> None:
        name = code_name(code)
        per_decision = seconds / max(decisions, 1)
        self.request_latency.labels(method, name).observe(per_decision)
        self.requests.labels(method, name).inc()
        if per_decision > self.latency_budget_seconds:
            self.over_budget.labels(method).inc()

    def observe_decisions(
        self,
        gaps: Iterable[float],
        turnovers: Iterable[float],
        icm_rewards: Iterable[float | None],
    ) -> None:
        """A batch's raw-vs-smoothed L1 gaps (the caller computes them on its arrays at once: a
        numpy reduction per decision costs more than observing), turnovers and ICM rewards.
        Non-finite values are skipped: one NaN would turn a histogram's ``_sum`` into NaN."""
        for histogram, values in (
            (self.smoothing_gap, gaps),
            (self.turnover, turnovers),
            (self.icm_reward, icm_rewards),
        ):
            for value in values:
                if value is not None and math.isfinite(value):
                    histogram.observe(value)


def worker_restarts_counter(registry: CollectorRegistry) -> Counter:
    """The supervisor's count of restarted workers (a worker cannot count its own death)."""
    return Counter(
        "allocator_serving_worker_restarts_total",
        "Worker processes of this server started again after they died unexpectedly.",
        registry=registry,
    )


class WorkerFilesCollector(MultiProcessCollector):
    """The supervisor's view of its workers' metric files, robust to a worker mid-start:
    prometheus-client creates a value file and only then sizes it, and reading it at 0 bytes
    fails the whole scrape, for good if the worker died then (prometheus/client_python#1199). An
    empty file holds no value yet, so it is skipped."""

    def collect(self) -> Iterable[Metric]:
        files = sized_files(glob.glob(os.path.join(self._path, "*.db")))
        return self.merge(files, accumulate=True)  # type: ignore[no-untyped-call]  # unannotated


def sized_files(paths: Iterable[str]) -> list[str]:
    """The files with a header to read; one gone since the glob is skipped too."""
    out = []
    for path in paths:
        with contextlib.suppress(FileNotFoundError):
            if os.path.getsize(path) > 0:
                out.append(path)
    return out
