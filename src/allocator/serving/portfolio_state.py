"""A portfolio's serving state: what its next decision needs, and its compact byte form.

The state carries the portfolio's last answer, so a retry is answered wherever the state lives,
under the same lock. The byte form is what Redis keeps, on the request path: no JSON or base64.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from itertools import accumulate
from typing import Any, NamedTuple

import numpy as np
from numpy.typing import NDArray

__all__ = ["LastAnswer", "ModelKey", "PortfolioState", "StateDecodeError"]

Float64Array = NDArray[np.float64]
Float32Array = NDArray[np.float32]


class StateDecodeError(ValueError):
    """Bytes that are not a ``PortfolioState`` (corrupted, or from an unknown format)."""


class ModelKey(NamedTuple):
    """The model a state was made under, and the state's slot count (cash included)."""

    name: str
    version: str
    n_slots: int


class LastAnswer(NamedTuple):
    """What a retry of ``request_id`` gets back: ``response``, if its ``fingerprint`` matches."""

    request_id: str
    fingerprint: bytes
    response: bytes


FINGERPRINT_BYTES = 16

# Layout of ``PortfolioState.to_bytes``: a fixed 24-byte header (magic, format, flags, slot count,
# string count, observation width, steps, response length), then the arrays (8-aligned first, so
# ``frombuffer`` views are aligned), then the last answer's fingerprint and response bytes, then
# the strings' lengths in characters and the strings (name, version, slot assets, and the last
# request id) as one UTF-8 text, decoded in one call. Format 1 (no last answer; the response
# length was padding) is still read.
_MAGIC = b"AS"
_FORMAT = 2
_FORMATS = (1, 2)
_HEADER = struct.Struct("<2sBBHHIQI")
_HAS_OBSERVATION = 1
_HAS_ACTION = 2
_HAS_LAST = 4


@dataclass(frozen=True, eq=False, slots=True)
class PortfolioState:
    """Immutable (read-only arrays). ``slots[k]``: the asset in slot ``k + 1`` (``""``: free);
    ``observation`` and ``action``: the previous decision's, the ICM's inputs (``None`` without
    an ICM, keeping such states ~10x smaller); ``steps``: decisions since the state started."""

    model: ModelKey
    slots: tuple[str, ...]
    smoothed: Float64Array
    observation: Float32Array | None
    action: Float32Array | None
    steps: int
    last: LastAnswer | None = None

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, PortfolioState):
            return NotImplemented
        return all(_same(getattr(self, f), getattr(other, f)) for f in self.__slots__)

    __hash__ = None  # type: ignore[assignment]  # mutable-looking arrays: never a dict key

    def with_last(self, last: LastAnswer) -> PortfolioState:
        """The constructor directly: ``dataclasses.replace`` costs several times more."""
        return PortfolioState(
            self.model, self.slots, self.smoothed, self.observation, self.action, self.steps, last
        )

    def to_bytes(self) -> bytes:
        """About 3 kB for 20 assets and a window of 30."""
        last = self.last
        strings = (self.model.name, self.model.version, *self.slots)
        parts = [np.ascontiguousarray(self.smoothed, dtype="<f8").tobytes()]
        flags = 0
        for flag, array in ((_HAS_OBSERVATION, self.observation), (_HAS_ACTION, self.action)):
            if array is not None:
                flags |= flag
                parts.append(np.ascontiguousarray(array, dtype="<f4").tobytes())
        if last is not None:
            if len(last.fingerprint) != FINGERPRINT_BYTES:
                raise ValueError(f"a fingerprint has {FINGERPRINT_BYTES} bytes")
            flags |= _HAS_LAST
            strings += (last.request_id,)
            parts += (last.fingerprint, last.response)
        obs_len = 0 if self.observation is None else int(self.observation.size)
        response_len = 0 if last is None else len(last.response)
        header = (_MAGIC, _FORMAT, flags, self.model.n_slots, len(strings), obs_len, self.steps)
        parts += (struct.pack(f"<{len(strings)}I", *map(len, strings)), "".join(strings).encode())
        return _HEADER.pack(*header, response_len) + b"".join(parts)  # string lengths in chars

    @classmethod
    def from_bytes(cls, data: bytes) -> PortfolioState:
        """Inverse of ``to_bytes``; anything malformed raises ``StateDecodeError``."""
        try:
            return cls._decode(memoryview(data))
        except StateDecodeError:
            raise
        except (struct.error, ValueError, UnicodeDecodeError) as exc:
            raise StateDecodeError(f"malformed portfolio state: {exc}") from None

    @classmethod
    def _decode(cls, view: memoryview) -> PortfolioState:
        if len(view) < _HEADER.size:
            raise StateDecodeError(f"portfolio state of {len(view)} bytes is too short")
        header = _HEADER.unpack_from(view)
        magic, fmt, flags, n_slots, n_strings, obs_len, steps, response_len = header
        if magic != _MAGIC or fmt not in _FORMATS:
            raise StateDecodeError(f"not a portfolio state (magic {magic!r}, format {fmt})")
        has_last = fmt >= 2 and bool(flags & _HAS_LAST)
        if n_slots < 2 or n_strings != n_slots + 1 + has_last:
            raise StateDecodeError(f"inconsistent slot count {n_slots} / {n_strings} strings")
        at = _HEADER.size
        smoothed = np.frombuffer(view, "<f8", n_slots, at)
        at += 8 * n_slots
        arrays: list[Float32Array | None] = []
        for flag, n in ((_HAS_OBSERVATION, obs_len), (_HAS_ACTION, n_slots)):
            arrays.append(np.frombuffer(view, "<f4", n, at) if flags & flag else None)
            at += 4 * n if flags & flag else 0
        fingerprint = response = b""
        if has_last:
            split = at + FINGERPRINT_BYTES
            end = split + response_len
            if end > len(view):
                raise StateDecodeError("portfolio state shorter than its last answer")
            fingerprint, response, at = bytes(view[at:split]), bytes(view[split:end]), end
        lengths = struct.unpack_from(f"<{n_strings}I", view, at)
        text = str(view[at + 4 * n_strings :], "utf-8")  # one decode, then slices
        if sum(lengths) != len(text):
            raise StateDecodeError("portfolio state length does not match its header")
        strings = [text[end - n : end] for end, n in zip(accumulate(lengths), lengths, strict=True)]
        last = LastAnswer(strings.pop(), fingerprint, response) if has_last else None
        model = ModelKey(strings[0], strings[1], n_slots)
        observation, action = arrays
        return cls(model, tuple(strings[2:]), smoothed, observation, action, steps, last)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return a is not None and b is not None and bool(np.array_equal(a, b))
    return bool(a == b)
