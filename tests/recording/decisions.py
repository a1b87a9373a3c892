"""Deterministic decision records for the recording tests: record ``i`` is always the same."""

from __future__ import annotations

import datetime as dt
from typing import Any

import numpy as np

from allocator.portfolio import CASH_ID
from allocator.recording.records import DecisionRecord, ModelRecord

MODEL = ModelRecord("test-model", "1", "td3", {"schema_version": 2}, {"model.onnx": "ab" * 32})
START = dt.datetime(2026, 1, 2, 21, 0, tzinfo=dt.UTC)


def make_decision(i: int, assets: int = 20) -> DecisionRecord:
    """Decision ``i``: varying asset count, optional fields present on some records only."""
    rng = np.random.default_rng(i)
    n = 1 + (i % assets)
    ids = (CASH_ID, *(f"ASSET-{(i + k) % 50:02d}" for k in range(n)))
    raw = rng.dirichlet(np.ones(n + 1))
    smoothed = rng.dirichlet(np.ones(n + 1))
    current = rng.dirichlet(np.ones(n + 1)) if i % 3 == 0 else None
    return DecisionRecord.create(
        request_id=f"req-{i:07d}",
        portfolio_id=f"portfolio-{i % 17}",
        decided_at=START + dt.timedelta(seconds=i, microseconds=i % 997),
        model_name=MODEL.name,
        model_version=MODEL.version,
        asset_ids=ids,
        raw_weights=raw,
        smoothed_weights=smoothed,
        turnover=float(rng.uniform(0, 2)),
        latency_seconds=float(rng.uniform(1e-4, 2e-3)),
        current_weights=current,
        icm_reward=None if i % 4 == 0 else float(rng.normal()),
        # A slot layout with a free slot, and a fingerprint, on most records (not all: rows
        # recorded before the columns existed have neither).
        slots=None if i % 5 == 0 else (*ids[:0:-1], ""),
        fingerprint=None if i % 5 == 0 else f"{i:032x}",
    )


def row_of(decision: DecisionRecord) -> dict[str, Any]:
    """The column values a decision should read back as (timestamps compared in UTC)."""
    return {
        "request_id": decision.request_id,
        "portfolio_id": decision.portfolio_id,
        "decided_at": decision.decided_at,
        "asset_ids": list(decision.asset_ids),
        "raw_weights": list(decision.raw_weights),
        "smoothed_weights": list(decision.smoothed_weights),
        "current_weights": (
            None if decision.current_weights is None else list(decision.current_weights)
        ),
        "turnover": decision.turnover,
        "icm_reward": decision.icm_reward,
        "latency_seconds": decision.latency_seconds,
        "slots": None if decision.slots is None else list(decision.slots),
        "request_fingerprint": decision.fingerprint,
    }
