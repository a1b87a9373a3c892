"""Figures of a batch job run (walk-forward, retraining), pushed to a Pushgateway at its end."""

from __future__ import annotations

import time
from collections.abc import Mapping
from enum import StrEnum
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from allocator.metrics.buckets import JOB_DURATION_BUCKETS_SECONDS
from allocator.metrics.pushgateway import push_reporting


class PromotionDecision(StrEnum):
    """What a retraining job decided about its candidate model."""

    PROMOTED = "promoted"
    REJECTED = "rejected"


class JobMetrics:
    """Figures of one batch job run, on a fresh registry per run (``JobPush``). No ``job``
    label: the Pushgateway adds it from the push's grouping key."""

    def __init__(self, registry: CollectorRegistry) -> None:
        def window_gauge(name: str, documentation: str) -> Gauge:
            return Gauge(name, documentation, ["window"], registry=registry)

        self._registry = registry
        # Created by mark_success only: a failed run's push (POST) must not carry a 0 that
        # would overwrite the previous good run's time in the Pushgateway.
        self.last_success: Gauge | None = None
        self.windows = Counter(
            "allocator_jobs_windows_total",
            "Walk-forward windows evaluated by this run.",
            registry=registry,
        )
        self.window_sharpe = window_gauge(
            "allocator_jobs_window_sharpe",
            "Annualized Sharpe ratio of the policy on one walk-forward test window.",
        )
        self.window_near_bound = window_gauge(
            "allocator_jobs_window_action_near_bound_ratio",
            "Share of the window's actor's live action values at the tanh bound on its probe "
            "set, at the last check of training.",
        )
        self.window_collapsed = window_gauge(
            "allocator_jobs_window_actor_collapsed",
            "1 when the window's actor collapsed into the saturated corner while training.",
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

    def record_window(
        self, window: str, sharpe: float, saturation: Mapping[str, Any] | None = None
    ) -> None:
        """One evaluated window (a stable short id), with its training run's saturation watch
        when it has one: a collapsed actor shows on a dashboard, not only in a file."""
        self.windows.inc()
        self.window_sharpe.labels(window).set(sharpe)
        if saturation:
            last = saturation.get("last") or {}
            if "near_bound_ratio" in last:
                self.window_near_bound.labels(window).set(float(last["near_bound_ratio"]))
            self.window_collapsed.labels(window).set(float(bool(saturation.get("collapsed"))))

    def record_promotion(self, decision: PromotionDecision | str) -> None:
        self.promotions.labels(PromotionDecision(decision).value).inc()

    def mark_success(self, timestamp: float | None = None) -> None:
        """Set the last-success time (now by default); call it only when the run succeeded."""
        if self.last_success is None:
            self.last_success = Gauge(
                "allocator_jobs_last_success_timestamp_seconds",
                "Unix time at which the job last finished successfully.",
                registry=self._registry,
            )
        self.last_success.set(time.time() if timestamp is None else timestamp)


class JobPush:
    """A job run's metrics pushed under the group of ``job`` and ``grouping_key``. A success
    replaces the group (PUT: an older run's windows do not linger); a failure adds to it (POST),
    keeping the last good run's success time."""

    def __init__(self, gateway_url: str | None, job: str, grouping_key: dict[str, str]) -> None:
        self.gateway_url = gateway_url
        self.job = job
        self.grouping_key = grouping_key
        self.registry = CollectorRegistry()
        self.metrics = JobMetrics(self.registry)

    def succeeded(self, seconds: float) -> str | None:
        """Push a successful run; the push's error text, or None (sent, or no gateway)."""
        if not self.gateway_url:
            return None
        self.metrics.duration.observe(seconds)
        self.metrics.mark_success()
        return push_reporting(self.registry, self.gateway_url, self.job, self.grouping_key)

    def failed(self, seconds: float) -> None:
        """Push a failed run; a push error is ignored (the run's own error is reported)."""
        if self.gateway_url:
            self.metrics.duration.observe(seconds)
            push_reporting(
                self.registry, self.gateway_url, self.job, self.grouping_key, replace=False
            )
