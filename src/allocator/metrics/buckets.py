"""Histogram buckets: each spans the range its quantity takes, with a boundary wherever a
threshold or alert reads it (a question is answered exactly only at a boundary)."""

from __future__ import annotations

import math

# fmt: off
LATENCY_BUCKETS_SECONDS: tuple[float, ...] = (
    50e-6, 100e-6, 250e-6, 500e-6, 750e-6, 1e-3, 1.5e-3, 2e-3, 3e-3, 5e-3, 7.5e-3, 10e-3,
    25e-3, 50e-3, 100e-3,
)
"""Sub-millisecond request latency buckets, 50 us to 100 ms; the budget is added to them."""

GAP_BUCKETS: tuple[float, ...] = (
    0.0, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0,
)
"""L1 distances between two weight vectors on the simplex lie in [0, 2]; 0 is its own bucket
(no smoothing yet, or no trade)."""

ICM_REWARD_BUCKETS: tuple[float, ...] = (
    -5.0, -4.0, -3.0, -2.0, -1.0, -0.5, -0.25, 0.0, 0.25, 0.5, 1.0, 2.0, 3.0, 4.0, 5.0,
)
"""The served ICM reward is normalized by running statistics and clipped to +-clip (5 by
default); values at the clip land in the end buckets. With negative buckets prometheus_client
exposes no ``_sum`` (an OpenMetrics rule), so read it with ``histogram_quantile``, not a mean."""

BATCH_SIZE_BUCKETS: tuple[float, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
"""Portfolios per batch allocation call."""

WRITE_LATENCY_BUCKETS_SECONDS: tuple[float, ...] = (
    1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 50e-3, 100e-3, 250e-3, 500e-3, 1.0, 2.5, 5.0, 10.0,
)
"""One batched INSERT of the recorder: milliseconds on SQLite, up to seconds on a slow Postgres."""

JOB_DURATION_BUCKETS_SECONDS: tuple[float, ...] = (
    1.0, 5.0, 15.0, 30.0, 60.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0, 14400.0, 28800.0,
    86400.0,
)
"""A batch job runs for seconds (a smoke run) to a day (a full walk-forward retraining)."""
# fmt: on


def latency_buckets(latency_budget_seconds: float) -> tuple[float, ...]:
    """The latency buckets plus one exactly at the budget: ``bucket{le=budget} / count`` is
    then exact, not interpolated."""
    budget = float(latency_budget_seconds)
    if not (math.isfinite(budget) and budget > 0):
        raise ValueError(f"latency_budget_seconds must be finite and > 0, got {budget!r}")
    return tuple(sorted({*LATENCY_BUCKETS_SECONDS, budget}))
