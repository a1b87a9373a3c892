"""Records are validated where they are made, naming the bad field (never in the writer)."""

from __future__ import annotations

import datetime as dt
import math
from typing import Any

import pytest

from allocator.portfolio import CASH_ID
from allocator.recording.records import DecisionRecord, RecordError
from tests.recording.decisions import make_decision


def fields(**changes: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "request_id": "r1",
        "portfolio_id": "p1",
        "decided_at": dt.datetime(2026, 1, 2, tzinfo=dt.UTC),
        "model_name": "m",
        "model_version": "1",
        "asset_ids": (CASH_ID, "A"),
        "raw_weights": [0.5, 0.5],
        "smoothed_weights": [0.25, 0.75],
        "turnover": 0.1,
        "latency_seconds": 0.001,
    }
    return {**base, **changes}


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"request_id": ""}, "request_id"),
        ({"portfolio_id": "x" * 201}, "portfolio_id"),
        ({"decided_at": dt.datetime(2026, 1, 2)}, "decided_at"),
        ({"asset_ids": ()}, "asset_ids"),
        ({"asset_ids": (CASH_ID, CASH_ID)}, "asset_ids"),
        ({"raw_weights": [0.5, math.nan]}, "raw_weights"),
        ({"smoothed_weights": [1.0]}, "smoothed_weights"),
        ({"current_weights": [0.5, math.inf]}, "current_weights"),
        ({"turnover": -0.1}, "turnover"),
        ({"latency_seconds": math.nan}, "latency_seconds"),
        ({"icm_reward": math.inf}, "icm_reward"),
    ],
)
def test_bad_fields_are_named(changes: dict[str, Any], field: str) -> None:
    with pytest.raises(RecordError, match=field):
        DecisionRecord.create(**fields(**changes))


def test_records_hold_plain_values_and_survive_the_spool_form() -> None:
    record = make_decision(12)
    assert all(type(w) is float for w in record.raw_weights)
    assert DecisionRecord.from_json(record.to_json()) == record
    assert record.decided_at.utcoffset() == dt.timedelta(0)
    assert record.slots is not None
    with pytest.raises(RecordError, match="14 fields, this one 12"):
        DecisionRecord.from_json(record.to_json()[:12])


def test_slots_must_hold_the_assets() -> None:
    with pytest.raises(RecordError, match="slots"):
        DecisionRecord.create(**fields(slots=("B", "")))
    made = DecisionRecord.create(**fields(slots=("", "A"), fingerprint="ab" * 16))
    assert made.slots == ("", "A")


def test_a_batch_of_one_from_arrays_is_the_record_create_builds() -> None:
    made = make_decision(9)
    (record,) = DecisionRecord.batch_from_validated(**_batch_of([made]))
    assert record == made
    batch = _batch_of([made])
    batch["vectors"]["raw_weights"][0, 1] = math.nan
    with pytest.raises(RecordError, match="raw_weights"):
        DecisionRecord.batch_from_validated(**batch)


def _batch_of(made: list[DecisionRecord]) -> dict[str, Any]:
    """``batch_from_validated``'s arguments for these records: their vectors as padded rows."""
    import numpy as np

    width = max(len(d.asset_ids) for d in made)

    def matrix(rows: list[tuple[float, ...] | None]) -> np.ndarray:
        m = np.zeros((len(rows), width))
        for i, row in enumerate(rows):
            if row is not None:
                m[i, : len(row)] = row
        return m

    return {
        "sizes": [len(d.asset_ids) for d in made],
        "vectors": {
            "raw_weights": matrix([d.raw_weights for d in made]),
            "smoothed_weights": matrix([d.smoothed_weights for d in made]),
            "current_weights": matrix([d.current_weights for d in made]),
        },
        "sent": [d.current_weights is not None for d in made],
        "columns": {
            "request_id": [d.request_id for d in made],
            "portfolio_id": [d.portfolio_id for d in made],
            "asset_ids": [d.asset_ids for d in made],
            "turnover": [d.turnover for d in made],
            "icm_reward": [d.icm_reward for d in made],
            "latency_seconds": [d.latency_seconds for d in made],
            "slots": [d.slots for d in made],
            "fingerprint": [d.fingerprint for d in made],
        },
        "decided_at": made[0].decided_at,
        "model_name": made[0].model_name,
        "model_version": made[0].model_version,
    }


def test_a_batch_of_records_from_arrays_equals_the_records_one_by_one() -> None:
    made = [make_decision(i) for i in range(12)]
    for d in made[1:]:  # one decision time per batch; a latency per decision (its own call's)
        object.__setattr__(d, "decided_at", made[0].decided_at)
    records = DecisionRecord.batch_from_validated(**_batch_of(made))
    assert records == made
    assert all(type(w) is float for r in records for w in r.raw_weights)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (
            lambda b: b["vectors"]["smoothed_weights"].__setitem__((2, 1), math.nan),
            "smoothed_weights",
        ),
        (lambda b: b["columns"]["turnover"].__setitem__(3, -0.5), "turnover"),
        (lambda b: b["columns"]["icm_reward"].__setitem__(1, math.inf), "icm_reward"),
    ],
)
def test_a_bad_value_in_a_batch_is_named(change: Any, field: str) -> None:
    made = [make_decision(i) for i in range(6)]
    batch = _batch_of(made)
    change(batch)
    with pytest.raises(RecordError, match=field):
        DecisionRecord.batch_from_validated(**batch)
