"""Prometheus metric definitions of the allocation server, the recorder and the batch jobs.

Names follow ``allocator_<subsystem>_<name>_<unit>`` with base units (``_seconds``, ``_bytes``)
and counters ending in ``_total``. Nothing here is a module-level global: each class creates its
metrics on the ``CollectorRegistry`` it is given, so the server passes the registry it exposes,
a batch job passes a fresh one it pushes, and tests pass an isolated ``CollectorRegistry()``.

One instance per registry: a second instance of the same class on the same registry raises
``ValueError`` ("Duplicated timeseries in CollectorRegistry"), which prometheus_client raises on
any name clash. Two instances on two registries never collide.

Label values must stay a small fixed vocabulary (method names, gRPC status code names, failure
reasons): never a portfolio id, request id or exception message.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from enum import Enum, StrEnum

import numpy as np
from numpy.typing import ArrayLike
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import push_to_gateway, pushadd_to_gateway
from prometheus_client.metrics_core import InfoMetricFamily, Metric
from prometheus_client.registry import Collector

__all__ = [
    "BATCH_SIZE_BUCKETS",
    "GAP_BUCKETS",
    "ICM_REWARD_BUCKETS",
    "JOB_DURATION_BUCKETS_SECONDS",
    "LATENCY_BUCKETS_SECONDS",
    "WRITE_LATENCY_BUCKETS_SECONDS",
    "JobMetrics",
    "PromotionDecision",
    "PushError",
    "RecorderMetrics",
    "ServingMetrics",
    "latency_buckets",
    "push",
]

LATENCY_BUCKETS_SECONDS: tuple[float, ...] = (
    50e-6,
    100e-6,
    250e-6,
    500e-6,
    750e-6,
    1e-3,
    1.5e-3,
    2e-3,
    3e-3,
    5e-3,
    7.5e-3,
    10e-3,
    25e-3,
    50e-3,
    100e-3,
)
"""Sub-millisecond request latency buckets, 50 us to 100 ms; the budget is added to them."""

GAP_BUCKETS: tuple[float, ...] = (
    0.0,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    1.5,
    2.0,
)
"""L1 distances between two weight vectors on the simplex lie in [0, 2]; 0 is its own bucket
(no smoothing yet, or no trade)."""

ICM_REWARD_BUCKETS: tuple[float, ...] = (
    -5.0,
    -4.0,
    -3.0,
    -2.0,
    -1.0,
    -0.5,
    -0.25,
    0.0,
    0.25,
    0.5,
    1.0,
    2.0,
    3.0,
    4.0,
    5.0,
)
"""The served ICM reward is normalized by running statistics and clipped to +-clip (5 by
default); values at the clip land in the end buckets. With negative buckets prometheus_client
exposes no ``_sum`` (an OpenMetrics rule), so read it with ``histogram_quantile``, not a mean."""

BATCH_SIZE_BUCKETS: tuple[float, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
"""Portfolios per batch allocation call."""

WRITE_LATENCY_BUCKETS_SECONDS: tuple[float, ...] = (
    1e-3,
    2.5e-3,
    5e-3,
    10e-3,
    25e-3,
    50e-3,
    100e-3,
    250e-3,
    500e-3,
    1.0,
    2.5,
    5.0,
    10.0,
)
"""One batched INSERT of the recorder: milliseconds on SQLite, up to seconds on a slow Postgres."""

JOB_DURATION_BUCKETS_SECONDS: tuple[float, ...] = (
    1.0,
    5.0,
    15.0,
    30.0,
    60.0,
    300.0,
    600.0,
    1800.0,
    3600.0,
    7200.0,
    14400.0,
    28800.0,
    86400.0,
)
"""A batch job runs for seconds (a smoke run) to a day (a full walk-forward retraining)."""


def latency_buckets(latency_budget_seconds: float) -> tuple[float, ...]:
    """The latency buckets with one exactly at the budget, so the P95 target reads off a bucket.

    Without a bucket at the budget, "fraction of requests within budget" would be interpolated;
    with it, ``bucket{le=budget} / count`` is exact.
    """
    budget = float(latency_budget_seconds)
    if not (math.isfinite(budget) and budget > 0):
        raise ValueError(f"latency_budget_seconds must be finite and > 0, got {budget!r}")
    return tuple(sorted({*LATENCY_BUCKETS_SECONDS, budget}))


def _code_name(code: str | Enum) -> str:
    """``grpc.StatusCode.OK`` and ``"OK"`` both give ``"OK"`` (no grpc import needed here)."""
    return code.name if isinstance(code, Enum) else str(code)


class _CurrentInfo(Collector):
    """An info metric that is absent until set and holds exactly one label set afterwards.

    ``prometheus_client.Info`` exposes ``name_info 1`` with no labels before it is set, and a
    labelled ``Gauge`` needs ``clear()`` then ``set(1)``, between which a scrape sees nothing.
    Here the switch is one assignment under a lock: a scrape sees the old set or the new one.
    """

    def __init__(
        self, name: str, documentation: str, labelnames: Sequence[str], registry: CollectorRegistry
    ) -> None:
        self._name = name
        self._documentation = documentation
        self._labelnames = tuple(labelnames)
        self._lock = threading.Lock()
        self._value: dict[str, str] | None = None
        registry.register(self)

    def set(self, **labels: str) -> None:
        if set(labels) != set(self._labelnames):
            raise ValueError(f"{self._name} takes labels {self._labelnames}, got {tuple(labels)}")
        value = {k: str(v) for k, v in labels.items()}
        with self._lock:
            self._value = value

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


class ServingMetrics:
    """What the allocation server exposes: latency against its budget, outcomes, decisions.

    ``latency_budget_seconds`` is the configured P95 budget: the latency histogram has a bucket
    exactly at it, and ``allocator_serving_over_budget_total`` counts requests strictly above it
    (so ``over_budget == count - bucket{le=budget}`` per method). Methods are the short gRPC
    method names (``Allocate``); codes are ``grpc.StatusCode`` names (``OK``, ``UNAVAILABLE``).
    """

    def __init__(self, registry: CollectorRegistry, latency_budget_seconds: float) -> None:
        self.latency_budget_seconds = float(latency_budget_seconds)
        self.latency_buckets = latency_buckets(self.latency_budget_seconds)
        self.request_latency = Histogram(
            "allocator_serving_request_latency_seconds",
            "Server-side latency of a gRPC request, by method and outcome (status code name).",
            ["method", "outcome"],
            buckets=self.latency_buckets,
            registry=registry,
        )
        self.requests = Counter(
            "allocator_serving_requests_total",
            "gRPC requests handled, by method and status code name.",
            ["method", "code"],
            registry=registry,
        )
        self.over_budget = Counter(
            "allocator_serving_over_budget_total",
            "Requests slower than the configured latency budget, by method.",
            ["method"],
            registry=registry,
        )
        self.latency_budget = Gauge(
            "allocator_serving_latency_budget_seconds",
            "The configured P95 latency budget, for dashboards and alert rules.",
            registry=registry,
        )
        self.latency_budget.set(self.latency_budget_seconds)
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
            "Portfolios per batch allocation call.",
            buckets=BATCH_SIZE_BUCKETS,
            registry=registry,
        )
        self.model_info = _CurrentInfo(
            "allocator_serving_model",
            "The model version serving by default: 1 for the current one only.",
            ("name", "version", "algorithm"),
            registry,
        )
        self.provider_info = _CurrentInfo(
            "allocator_serving_provider",
            "The onnxruntime execution provider in use (CUDAExecutionProvider or "
            "CPUExecutionProvider).",
            ("provider",),
            registry,
        )

    def observe_request(self, method: str, code: str | Enum, seconds: float) -> None:
        """One finished request: latency by outcome, the count by code, and over-budget."""
        code_name = _code_name(code)
        self.request_latency.labels(method, code_name).observe(seconds)
        self.requests.labels(method, code_name).inc()
        if seconds > self.latency_budget_seconds:
            self.over_budget.labels(method).inc()

    def observe_decision(
        self,
        raw_weights: ArrayLike,
        smoothed_weights: ArrayLike,
        turnover: float,
        icm_reward: float | None = None,
    ) -> None:
        """One allocation: the raw-vs-smoothed L1 gap (all slots, cash included), the turnover
        as computed by the caller, and the ICM reward when the model has one.

        Non-finite values are not observed: a single NaN would turn a histogram's ``_sum``
        into NaN for the life of the process.
        """
        raw = np.asarray(raw_weights, dtype=np.float64)
        smoothed = np.asarray(smoothed_weights, dtype=np.float64)
        if raw.shape != smoothed.shape:
            raise ValueError(f"raw {raw.shape} and smoothed {smoothed.shape} weights differ")
        gap = float(np.abs(raw - smoothed).sum())
        if math.isfinite(gap):
            self.smoothing_gap.observe(gap)
        if math.isfinite(turnover):
            self.turnover.observe(float(turnover))
        if icm_reward is not None and math.isfinite(icm_reward):
            self.icm_reward.observe(float(icm_reward))

    def observe_batch(self, size: int) -> None:
        """One batch allocation call of ``size`` portfolios."""
        self.batch_size.observe(size)

    def set_model(self, name: str, version: str, algorithm: str) -> None:
        """Switch the model info to a new version; the previous label set disappears."""
        self.model_info.set(name=name, version=version, algorithm=algorithm)

    def set_provider(self, provider: str) -> None:
        """Record the execution provider that really runs (``session.get_providers()[0]``)."""
        self.provider_info.set(provider=provider)


class RecorderMetrics:
    """The decision recorder: its in-memory queue, local spool, database writes and replays.

    The recorder never drops a decision silently. When the spool quota is reached, new records
    are refused at the door (the caller is told, and ``allocator_recorder_rejected_total``
    counts them); records already accepted are written, or spooled and replayed later.
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        self.queue_depth = Gauge(
            "allocator_recorder_queue_depth",
            "Records waiting in memory for the next batched write.",
            registry=registry,
        )
        self.spooled_records = Gauge(
            "allocator_recorder_spooled_records",
            "Records currently in the local spool, waiting for the database to come back.",
            registry=registry,
        )
        self.spool_bytes = Gauge(
            "allocator_recorder_spool_bytes",
            "Size of the local spool on disk.",
            registry=registry,
        )
        self.rows_written = Counter(
            "allocator_recorder_rows_written_total",
            "Decision rows committed to the database (replays included).",
            registry=registry,
        )
        self.failed_writes = Counter(
            "allocator_recorder_failed_writes_total",
            "Batched writes that failed (their records were spooled), by short fixed reason.",
            ["reason"],
            registry=registry,
        )
        self.replayed = Counter(
            "allocator_recorder_replayed_total",
            "Spooled records replayed into the database (idempotent on the request id).",
            registry=registry,
        )
        self.rejected = Counter(
            "allocator_recorder_rejected_total",
            "Records refused at the door because the spool quota was reached; the caller is "
            "told, nothing is dropped silently.",
            registry=registry,
        )
        self.batch_write_latency = Histogram(
            "allocator_recorder_batch_write_latency_seconds",
            "Time of one batched write to the database, successful or not.",
            buckets=WRITE_LATENCY_BUCKETS_SECONDS,
            registry=registry,
        )

    def observe_write(self, rows: int, seconds: float) -> None:
        """One committed batch of ``rows`` rows that took ``seconds``."""
        self.batch_write_latency.observe(seconds)
        self.rows_written.inc(rows)

    def observe_failed_write(self, reason: str, seconds: float) -> None:
        """One failed batch; ``reason`` is a short fixed word (``unavailable``, ``integrity``)."""
        self.batch_write_latency.observe(seconds)
        self.failed_writes.labels(reason).inc()


class PromotionDecision(StrEnum):
    """What a retraining job decided about its candidate model."""

    PROMOTED = "promoted"
    REJECTED = "rejected"


class JobMetrics:
    """Figures of one batch job run (walk-forward, retraining), pushed to a Pushgateway.

    Use a fresh ``CollectorRegistry`` per run and ``push(registry, url, job)`` at the end. The
    job is not a label here: the Pushgateway adds ``job`` from the push's grouping key, and
    pushed metrics must not carry a ``job`` label of their own. ``push`` replaces the job's
    previous group, so the windows of an older run do not linger.
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        self._registry = registry
        # Created by mark_success only: a failed run's push (POST) must not carry a 0 that
        # would overwrite the previous good run's time in the Pushgateway.
        self.last_success: Gauge | None = None
        self.windows = Counter(
            "allocator_jobs_windows_total",
            "Walk-forward windows evaluated by this run.",
            registry=registry,
        )
        self.window_sharpe = Gauge(
            "allocator_jobs_window_sharpe",
            "Annualized Sharpe ratio of the policy on one walk-forward test window.",
            ["window"],
            registry=registry,
        )
        self.promotions = Counter(
            "allocator_jobs_promotions_total",
            "Candidate models judged by the promotion gate, by decision.",
            ["decision"],
            registry=registry,
        )
        for decision in PromotionDecision:
            self.promotions.labels(decision.value)
        self.duration = Histogram(
            "allocator_jobs_duration_seconds",
            "Wall time of one job run.",
            buckets=JOB_DURATION_BUCKETS_SECONDS,
            registry=registry,
        )

    def record_window(self, window: str, sharpe: float) -> None:
        """One evaluated window, named by a stable short id (its index or test start date)."""
        self.windows.inc()
        self.window_sharpe.labels(window).set(sharpe)

    def record_promotion(self, decision: PromotionDecision | str) -> None:
        """The promotion gate's verdict on a candidate."""
        self.promotions.labels(PromotionDecision(decision).value).inc()

    def observe_duration(self, seconds: float) -> None:
        """The run's wall time."""
        self.duration.observe(seconds)

    def mark_success(self, timestamp: float | None = None) -> None:
        """Set the last-success time (now by default); call it only when the run succeeded."""
        if self.last_success is None:
            self.last_success = Gauge(
                "allocator_jobs_last_success_timestamp_seconds",
                "Unix time at which the job last finished successfully.",
                registry=self._registry,
            )
        self.last_success.set(time.time() if timestamp is None else timestamp)


class PushError(RuntimeError):
    """The Pushgateway could not be reached or refused the push."""


def push(
    registry: CollectorRegistry,
    gateway_url: str,
    job: str,
    *,
    grouping_key: Mapping[str, str] | None = None,
    timeout: float = 10.0,
    replace: bool = True,
) -> None:
    """Push ``registry`` to the Pushgateway at ``gateway_url`` under ``job``.

    ``replace=True`` (HTTP PUT) replaces every metric of the group: the normal end of a run.
    A failed run should push with ``replace=False`` (POST replaces only the metrics pushed), so
    that it does not erase the last-success time of the previous good run. ``timeout`` bounds
    the connection, so a dead gateway cannot hang a job.
    """
    if not job:
        raise ValueError("job must be a non-empty name")
    send = push_to_gateway if replace else pushadd_to_gateway
    try:
        send(gateway_url, job=job, registry=registry, grouping_key=grouping_key, timeout=timeout)
    except OSError as exc:  # URLError, connection refused, timeouts, non-2xx responses
        raise PushError(
            f"could not push metrics of job {job!r} to the Pushgateway at {gateway_url}: {exc}"
        ) from exc
