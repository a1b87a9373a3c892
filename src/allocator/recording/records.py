"""What the recorder records: a served model version and one allocation decision, validated when
made so that a bad value surfaces at the caller with the field named, not as a quarantined batch
in the writer thread; a spooled record reads back equal to the one submitted."""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import MISSING, dataclass, field, fields
from itertools import repeat
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from allocator.portfolio.ids import MAX_ID_LENGTH, MAX_VERSION_LENGTH, check_id

MAX_ALGORITHM_LENGTH = 50  # VARCHAR(50) in the schema
MAX_FINGERPRINT_LENGTH = 64  # VARCHAR(64) in the schema


class RecordError(ValueError):
    """A record field is missing, malformed or out of range; the message names the field."""


def _record_id(value: str, what: str, max_length: int = MAX_ID_LENGTH) -> str:
    return check_id(value, what, max_length, error=lambda f, m: RecordError(f"{f}: {m}"))


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


_ID_LENGTHS = {
    "request_id": MAX_ID_LENGTH,
    "portfolio_id": MAX_ID_LENGTH,
    "model_name": MAX_ID_LENGTH,
    "model_version": MAX_VERSION_LENGTH,
}
_MINIMUM = {"turnover": 0.0, "latency_seconds": 0.0}
"""Lower bounds of float fields; every float field must be finite."""


def _plausible(values: Sequence[float | None], minimum: float | None) -> bool:
    """Whether a column's floats are finite and >= ``minimum`` (a sum overflowing: maybe not)."""
    xs = [x for x in values if x is not None]
    return not xs or (math.isfinite(sum(xs)) and (minimum is None or min(xs) >= minimum))


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
        return {f.name: getattr(self, f.name) for f in fields(self)} | {
            "manifest": dict(self.manifest),
            "checksums": dict(self.checksums),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ModelRecord:
        return cls(**data)


@dataclass(frozen=True, slots=True)
class DecisionRecord:
    """One answered allocation; build it with ``create`` (validated). ``asset_ids`` and the
    weight vectors are parallel, cash first; ``slots`` and ``fingerprint`` let a restarted server
    rebuild the portfolio's state and its last answer from the row."""

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
    def create(cls, **values: Any) -> DecisionRecord:
        """Validate and normalize every field (numpy arrays become tuples of floats)."""
        if unknown := values.keys() - _NAMES:
            raise TypeError(f"not DecisionRecord fields: {sorted(unknown)}")
        decided_at = values["decided_at"]
        if not isinstance(decided_at, dt.datetime) or decided_at.utcoffset() is None:
            raise RecordError(f"decided_at must be a timezone-aware datetime, got {decided_at!r}")
        ids = tuple(values["asset_ids"])
        if not ids:
            raise RecordError("asset_ids must not be empty")
        for i, asset in enumerate(ids):
            _record_id(asset, f"asset_ids[{i}]")
        if len(set(ids)) != len(ids):
            raise RecordError("asset_ids must be unique")
        slots = values.get("slots")
        if slots is not None:
            slots = tuple(slots)
            if not set(ids[1:]) <= set(slots) or not all(isinstance(a, str) for a in slots):
                raise RecordError("slots must name every asset of asset_ids (cash aside)")
        fingerprint = values.get("fingerprint")
        if fingerprint is not None and not (
            isinstance(fingerprint, str) and 0 < len(fingerprint) <= MAX_FINGERPRINT_LENGTH
        ):
            raise RecordError(f"fingerprint must be a hex string, got {fingerprint!r}")
        checked: dict[str, Any] = {
            "decided_at": decided_at.astimezone(dt.UTC),
            "asset_ids": ids,
            "slots": slots,
        }
        for f in fields(cls):
            value = values[f.name] if f.default is MISSING else values.get(f.name, f.default)
            if f.name in checked or (value is None and f.name in _OPTIONAL):
                checked.setdefault(f.name, value)
            elif f.name in _ID_LENGTHS:
                checked[f.name] = _record_id(value, f.name, _ID_LENGTHS[f.name])
            elif f.name in _VECTORS:
                checked[f.name] = _check_vector(value, f.name, len(ids))
            elif f.name in _FLOATS:
                checked[f.name] = _check_float(value, f.name, _MINIMUM.get(f.name))
            else:
                checked[f.name] = value
        return cls(**checked)

    @classmethod
    def batch_from_validated(
        cls,
        sizes: Sequence[int],
        vectors: Mapping[str, np.ndarray],
        sent: Sequence[bool],
        columns: Mapping[str, Sequence[Any]],
        **same: Any,
    ) -> list[DecisionRecord]:
        """The server's records: ``same`` for every record, ``columns`` one value per record,
        ``vectors`` row i's first ``sizes[i]`` entries (an optional one only where ``sent[i]``).
        Ids were validated upstream, so only the numbers are checked, once per array or column;
        anything flagged goes through ``create``, which names what is wrong."""
        valid = all(math.isfinite(float(np.add.reduce(m, None))) for m in vectors.values()) and all(
            _plausible(v, _MINIMUM.get(name)) for name, v in columns.items() if name in _FLOATS
        )
        given: dict[str, Iterable[Any]] = {**{k: repeat(v) for k, v in same.items()}, **columns}
        if unknown := given.keys() - _NAMES:
            raise TypeError(f"not DecisionRecord fields: {sorted(unknown)}")
        for name, m in vectors.items():
            whole = name not in _OPTIONAL
            given[name] = [
                tuple(row[:n]) if whole or s else None
                for row, n, s in zip(m.tolist() if valid else m, sizes, sent, strict=True)
            ]
        columns_in_order = [given.get(name, repeat(default)) for name, default in _DEFAULTS]
        rows = zip(*columns_in_order, strict=False)  # the repeated ones never end
        if valid:
            return [cls(*row) for row in rows]
        return [cls.create(**dict(zip(DECISION_FIELDS, row, strict=True))) for row in rows]

    @property
    def model_key(self) -> tuple[str, str]:
        return (self.model_name, self.model_version)

    def to_json(self) -> list[Any]:
        """The spool's positional form: the fields in order, ``decided_at`` in ISO form."""
        row = [getattr(self, name) for name in DECISION_FIELDS]
        row[2] = self.decided_at.isoformat()
        return row

    @classmethod
    def from_json(cls, row: Sequence[Any]) -> DecisionRecord:
        """Inverse of ``to_json``; floats round-trip exactly through JSON's ``repr`` form."""
        if len(row) != len(DECISION_FIELDS):
            raise RecordError(
                f"a spooled decision has {len(DECISION_FIELDS)} fields, this one {len(row)}"
            )
        values: list[Any] = [tuple(v) if isinstance(v, list) else v for v in row]
        values[2] = dt.datetime.fromisoformat(row[2])
        return cls(*values)


DECISION_FIELDS = tuple(f.name for f in fields(DecisionRecord))
"""The spool's positional order."""
_NAMES = frozenset(DECISION_FIELDS)
_DEFAULTS = [(f.name, f.default) for f in fields(DecisionRecord)]
_OPTIONAL = {f.name for f in fields(DecisionRecord) if str(f.type).endswith("| None")}
_VECTORS = {f.name for f in fields(DecisionRecord) if str(f.type).startswith("tuple[float")}
_FLOATS = {f.name for f in fields(DecisionRecord) if str(f.type).startswith("float")}
