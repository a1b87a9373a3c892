"""An answer's wire bytes, encoded once: what the client gets, and what a retry gets back.

Building ``AllocateResponse`` from Python floats cost more per decision than deciding at batch
512, so the bytes are encoded straight from the float64 arrays, as ``SerializeToString`` writes
them (tests compare the two). Every field after ``model`` is a scalar read by name from the
decision (or its record), so a new one needs no change here.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from google.protobuf.descriptor import FieldDescriptor as Field
from numpy.typing import NDArray

from allocator.serving.proto.v1 import allocator_pb2 as pb

__all__ = ["AnswerEncoder", "framed", "string_field", "varint", "weight_bytes"]


def varint(n: int) -> bytes:
    if n < 0x80:
        return bytes((n,))
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def string_field(tag: bytes, value: str) -> bytes:
    data = value.encode()
    return tag + varint(len(data)) + data


def framed(field: int, messages: Sequence[bytes]) -> bytes:
    """``messages`` as the repeated message field ``field`` of an enclosing message."""
    tag = varint(field << 3 | 2)
    return b"".join([part for m in messages for part in (tag, varint(len(m)), m)])


_SCALARS: dict[int, tuple[int, Callable[[Any], bytes]]] = {
    Field.TYPE_DOUBLE: (1, struct.Struct("<d").pack),
    Field.TYPE_FLOAT: (5, struct.Struct("<f").pack),
    Field.TYPE_INT64: (0, lambda n: varint(n & 0xFFFFFFFFFFFFFFFF)),  # two's complement
    Field.TYPE_INT32: (0, lambda n: varint(n & 0xFFFFFFFFFFFFFFFF)),
    Field.TYPE_BOOL: (0, lambda b: varint(int(b))),
    Field.TYPE_STRING: (2, lambda s: varint(len(s.encode())) + s.encode()),
}
"""A scalar field's wire type and value bytes, by the field's descriptor type."""


def _tag(name: str) -> bytes:
    field = pb.AllocateResponse.DESCRIPTOR.fields_by_name[name]
    wire = 2 if field.is_repeated or field.message_type else _SCALARS[field.type][0]
    return varint(field.number << 3 | wire)


_REQUEST_ID, _PORTFOLIO_ID, _ASSET_ID, _RAW, _SMOOTHED, _MODEL = map(
    _tag, ("request_id", "portfolio_id", "asset_ids", "raw_weights", "smoothed_weights", "model")
)
_FIELDS = {f.number: f for f in pb.AllocateResponse.DESCRIPTOR.fields}
_VALUES = [
    (f.name, _tag(f.name), _SCALARS[f.type][1], f.has_presence)
    for n, f in sorted(_FIELDS.items())
    if n > pb.AllocateResponse.MODEL_FIELD_NUMBER
]
"""The fields read from the decision by name: (name, tag, encoder, has presence)."""


def _default(value: Any) -> bool:
    """What proto3 leaves out of a field without presence (a double's +0.0, not -0.0)."""
    return not value and not (isinstance(value, float) and math.copysign(1.0, value) < 0.0)


class AnswerEncoder:
    """One model's answers; the model reference and each asset list are encoded once."""

    def __init__(self, name: str, version: str) -> None:
        ref = string_field(b"\x0a", name) + string_field(b"\x12", version)
        self._model = _MODEL + varint(len(ref)) + ref
        self._ids: dict[tuple[str, ...], bytes] = {}

    def asset_ids(self, ids: tuple[str, ...]) -> bytes:
        encoded = self._ids.get(ids)
        if encoded is None:
            if len(self._ids) > 4096:
                self._ids.clear()  # bounded: universes are few, but clients choose them
            encoded = self._ids[ids] = b"".join([string_field(_ASSET_ID, a) for a in ids])
        return encoded

    def encode(
        self,
        request_id: str,
        portfolio_id: str,
        ids: tuple[str, ...],
        raw: bytes,
        smoothed: bytes,
        values: Any,
    ) -> bytes:
        """``raw`` and ``smoothed``: the weights' little-endian float64 bytes (``weight_bytes``);
        ``values``: has the other fields as attributes (a ``DecisionOutput``, a record)."""
        size = varint(len(raw))
        parts = [
            string_field(_REQUEST_ID, request_id),
            string_field(_PORTFOLIO_ID, portfolio_id),
            self.asset_ids(ids),
            _RAW,
            size,
            raw,
            _SMOOTHED,
            size,
            smoothed,
            self._model,
        ]
        for name, tag, pack, has_presence in _VALUES:
            value = getattr(values, name)
            if value is None if has_presence else _default(value):
                continue
            parts += (tag, pack(value))
        return b"".join(parts)


def weight_bytes(matrix: NDArray[np.float64]) -> tuple[bytes, int]:
    """A 2-D array's little-endian float64 bytes and its row stride in bytes."""
    return np.ascontiguousarray(matrix, dtype="<f8").tobytes(), 8 * matrix.shape[1]
