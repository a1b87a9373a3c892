"""An answer's wire bytes, encoded once: what the client gets, and what a retry gets back.

Building ``AllocateResponse`` from Python floats and serializing it cost more per decision than
deciding at batch 512, so the bytes are encoded here straight from the float64 arrays (a packed
``repeated double`` is the array's little-endian bytes), field by field as ``SerializeToString``
writes them (tests compare the two byte for byte); batch and stream responses are parsed from
the concatenated answers in one C call.
"""

from __future__ import annotations

import math
import struct
import sys
from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

from allocator.serving.proto.v1 import allocator_pb2 as pb

__all__ = ["AnswerEncoder", "framed", "parse", "string_field", "varint", "weight_bytes"]

_DOUBLE = struct.Struct("<d")
_LITTLE = sys.byteorder == "little"

# Tags: (field number << 3) | wire type (1: 64-bit, 2: length-delimited).
_REQUEST_ID = b"\x0a"
_PORTFOLIO_ID = b"\x12"
_ASSET_ID = b"\x1a"
_RAW = b"\x22"
_SMOOTHED = b"\x2a"
_MODEL = b"\x32"
_ICM = b"\x39"
_TURNOVER = b"\x41"


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


def parse(data: bytes) -> pb.AllocateResponse:
    return pb.AllocateResponse.FromString(data)


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
        turnover: float,
        icm_reward: float | None,
    ) -> bytes:
        """``raw`` and ``smoothed``: the weights' little-endian float64 bytes (``weight_bytes``)."""
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
        if icm_reward is not None:
            parts.append(_ICM + _DOUBLE.pack(icm_reward))
        if turnover != 0.0 or math.copysign(1.0, turnover) < 0.0:  # proto3 omits +0.0 only
            parts.append(_TURNOVER + _DOUBLE.pack(turnover))
        return b"".join(parts)


def weight_bytes(matrix: NDArray[np.float64]) -> tuple[bytes, int]:
    """A 2-D array's little-endian float64 bytes and its row stride in bytes."""
    if not _LITTLE or matrix.dtype != np.float64:
        matrix = matrix.astype("<f8")
    return np.ascontiguousarray(matrix).tobytes(), 8 * matrix.shape[1]
