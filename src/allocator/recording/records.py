"""What the recorder records: a served model version and one allocation decision.

Records are validated when made, so a bad value surfaces at the caller with the field named,
not as a quarantined batch in the writer thread. A record then holds plain Python values only,
and a spooled record reads back equal to the one submitted.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from allocator.portfolio.ids import MAX_ID_LENGTH, MAX_VERSION_LENGTH, check_id

__all__ = ["DecisionRecord", "ModelRecord", "RecordError"]

MAX_ALGORITHM_LENGTH = 50  # VARCHAR(50) in the schema
MAX_FINGERPRINT_LENGTH = 64  # VARCHAR(64) in the schema


class RecordError(ValueError):
    """A record field is missing, malformed or out of range; the message names the field."""

    @classmethod
    def for_field(cls, field: str, problem: str) -> RecordError:
        return cls(f"{field}: {problem}")


def _record_id(value: str, what: str, max_length: int = MAX_ID_LENGTH) -> str:
    return check_id(value, what, max_length, error=RecordError.for_field)


def _check_vector(values: ArrayLike, what: str, length: int) -> tuple[float, ...]:
    try:
        arr = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise RecordError(f"{what} must be numbers: {exc}") from None
    if arr.shape != (length,):
        raise RecordError(f"{what} has shape {arr.shape}, expected ({length},) like asset_ids")
    if not np.all(np.isfinite(arr)):
        raise RecordError(f"{what} must be finite (JSON and JSONB cannot store NaN or Inf)")
    return tuple(arr.tolist())


def _check_float(value: float, what: str, minimum: float | None = None) -> float:
    x = float(value)
    if not math.isfinite(x):
        raise RecordError(f"{what} must be finite, got {value!r}")
    if minimum is not None and x < minimum:
        raise RecordError(f"{what} must be >= {minimum}, got {value!r}")
    return x


@dataclass(frozen=True, slots=True)
class ModelRecord:
    """A model version the server answers with; decisions refer to it by (name, version)."""

    name: str
    version: str
    algorithm: str
    manifest: Mapping[str, Any] = field(default_factory=dict)
    checksums: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _record_id(self.name, "model name")
        _record_id(self.version, "model version", MAX_VERSION_LENGTH)
        _record_id(self.algorithm, "model algorithm", MAX_ALGORITHM_LENGTH)

    @property
    def key(self) -> tuple[str, str]:
        return (self.name, self.version)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "version": self.version,
            "algorithm": self.algorithm,
            "manifest": dict(self.manifest),
            "checksums": dict(self.checksums),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ModelRecord:
        return cls(**data)


@dataclass(frozen=True, slots=True)
class DecisionRecord:
    """One answered allocation; build it with ``create`` (validated).

    ``asset_ids`` and the weight vectors are parallel, cash first. ``request_id`` is the
    client's idempotency key. ``slots`` (``slots[k]``: the asset in slot ``k + 1``, ``""`` when
    free) and ``fingerprint`` (digest of the request's inputs) let a restarted server rebuild
    the portfolio's state and its last answer from the row.
    """

    request_id: str
    portfolio_id: str
    decided_at: dt.datetime
    model_name: str
    model_version: str
    asset_ids: tuple[str, ...]
    raw_weights: tuple[float, ...]
    smoothed_weights: tuple[float, ...]
    turnover: float
    latency_seconds: float
    current_weights: tuple[float, ...] | None = None
    icm_reward: float | None = None
    slots: tuple[str, ...] | None = None
    fingerprint: str | None = None

    @classmethod
    def create(
        cls,
        *,
        request_id: str,
        portfolio_id: str,
        decided_at: dt.datetime,
        model_name: str,
        model_version: str,
        asset_ids: Sequence[str],
        raw_weights: ArrayLike,
        smoothed_weights: ArrayLike,
        turnover: float,
        latency_seconds: float,
        current_weights: ArrayLike | None = None,
        icm_reward: float | None = None,
        slots: Sequence[str] | None = None,
        fingerprint: str | None = None,
    ) -> DecisionRecord:
        """Validate and normalize every field (numpy arrays become tuples of floats)."""
        if not isinstance(decided_at, dt.datetime) or decided_at.utcoffset() is None:
            raise RecordError(f"decided_at must be a timezone-aware datetime, got {decided_at!r}")
        ids = tuple(asset_ids)
        if not ids:
            raise RecordError("asset_ids must not be empty")
        for i, asset in enumerate(ids):
            _record_id(asset, f"asset_ids[{i}]")
        if len(set(ids)) != len(ids):
            raise RecordError("asset_ids must be unique")
        n = len(ids)
        if slots is not None:
            slots = tuple(slots)
            if not set(ids[1:]) <= set(slots) or not all(isinstance(a, str) for a in slots):
                raise RecordError("slots must name every asset of asset_ids (cash aside)")
        if fingerprint is not None and not (
            isinstance(fingerprint, str) and 0 < len(fingerprint) <= MAX_FINGERPRINT_LENGTH
        ):
            raise RecordError(f"fingerprint must be a hex string, got {fingerprint!r}")
        return cls(
            request_id=_record_id(request_id, "request_id"),
            portfolio_id=_record_id(portfolio_id, "portfolio_id"),
            decided_at=decided_at.astimezone(dt.UTC),
            model_name=_record_id(model_name, "model_name"),
            model_version=_record_id(model_version, "model_version", MAX_VERSION_LENGTH),
            asset_ids=ids,
            raw_weights=_check_vector(raw_weights, "raw_weights", n),
            smoothed_weights=_check_vector(smoothed_weights, "smoothed_weights", n),
            turnover=_check_float(turnover, "turnover", 0.0),
            latency_seconds=_check_float(latency_seconds, "latency_seconds", 0.0),
            current_weights=(
                None
                if current_weights is None
                else _check_vector(current_weights, "current_weights", n)
            ),
            icm_reward=None if icm_reward is None else _check_float(icm_reward, "icm_reward"),
            slots=slots,
            fingerprint=fingerprint,
        )

    @classmethod
    def batch_from_validated(
        cls,
        *,
        request_ids: Sequence[str],
        portfolio_ids: Sequence[str],
        decided_at: dt.datetime,
        model_name: str,
        model_version: str,
        asset_ids: Sequence[tuple[str, ...]],
        raw_weights: np.ndarray,
        smoothed_weights: np.ndarray,
        current_weights: np.ndarray,
        sent: Sequence[bool],
        sizes: Sequence[int],
        turnovers: Sequence[float],
        icm_rewards: Sequence[float | None],
        latency_seconds: Sequence[float],
        slots: Sequence[tuple[str, ...]],
        fingerprints: Sequence[str],
    ) -> list[DecisionRecord]:
        """The server's records, weight vectors as row i's first ``sizes[i]`` entries of 2-D
        arrays (``current_weights`` only where ``sent[i]``). Ids and time were validated
        upstream, so only the numbers are checked, once per array; anything flagged goes
        through ``create``, which names what is wrong."""
        matrices = (raw_weights, smoothed_weights, current_weights)
        finite = all(math.isfinite(float(np.add.reduce(m, None))) for m in matrices)
        icm_ok = all(x is None or math.isfinite(x) for x in icm_rewards)
        valid = (
            finite
            and icm_ok
            and min(turnovers) >= 0.0
            and math.isfinite(sum(turnovers))
            and math.isfinite(sum(latency_seconds))
            and min(latency_seconds) >= 0.0
        )
        make: Callable[..., DecisionRecord] = cls if valid else cls.create
        raw, smoothed, current = (m.tolist() for m in matrices) if valid else matrices
        return [
            make(
                request_id=request_ids[i],
                portfolio_id=portfolio_ids[i],
                decided_at=decided_at,
                model_name=model_name,
                model_version=model_version,
                asset_ids=asset_ids[i],
                raw_weights=tuple(raw[i][:n]),
                smoothed_weights=tuple(smoothed[i][:n]),
                turnover=turnovers[i],
                latency_seconds=float(latency_seconds[i]),
                current_weights=tuple(current[i][:n]) if sent[i] else None,
                icm_reward=icm_rewards[i],
                slots=slots[i],
                fingerprint=fingerprints[i],
            )
            for i, n in enumerate(sizes)
        ]

    @property
    def model_key(self) -> tuple[str, str]:
        return (self.model_name, self.model_version)

    def to_json(self) -> list[Any]:
        """The spool's positional form: the fields in order, ``decided_at`` in ISO form."""
        row = [getattr(self, name) for name in _DECISION_FIELDS]
        row[2] = self.decided_at.isoformat()
        return row

    @classmethod
    def from_json(cls, row: Sequence[Any]) -> DecisionRecord:
        """Inverse of ``to_json``; floats round-trip exactly through JSON's ``repr`` form."""
        if len(row) != len(_DECISION_FIELDS):
            raise RecordError(
                f"a spooled decision has {len(_DECISION_FIELDS)} fields, this one {len(row)}"
            )
        values: list[Any] = [tuple(v) if isinstance(v, list) else v for v in row]
        values[2] = dt.datetime.fromisoformat(row[2])
        return cls(*values)


_DECISION_FIELDS = tuple(f.name for f in fields(DecisionRecord))  # the spool's positional order
