"""What makes a retry the same request, and the request ids a process remembers.

Deciding a resent request again would step the smoothing and record twice, so a portfolio's
latest answer travels with its state (``PortfolioState.last``): a retry is answered from it on
any replica and after a restart. ``RecentRequests`` (per process, bounded) refuses an older id,
or one reused for another portfolio or other inputs; an id older than that is decided as new
(the database keeps the first row).
"""

from __future__ import annotations

import hashlib
import struct
import threading
from collections import OrderedDict
from collections.abc import Sequence

import numpy as np

from allocator.serving.portfolio_state import FINGERPRINT_BYTES, LastAnswer
from allocator.serving.validation import InvalidRequest, ValidRequest

__all__ = ["RecentRequests", "check_last", "request_fingerprints"]


def _optional(value: str | None) -> bytes:
    if value is None:
        return b"\xff\xff\xff\xff"
    data = value.encode()
    return struct.pack("<I", len(data)) + data


def _ids_part(asset_ids: tuple[str, ...]) -> bytes:
    ids = [asset.encode() for asset in asset_ids]
    n = len(ids)
    return struct.pack(f"<I{n}I", n, *map(len, ids)) + b"".join(ids)


def request_fingerprints(requests: Sequence[ValidRequest]) -> list[bytes]:
    """Digests of requests' inputs, so a reused id with other inputs is not answered as a retry:
    blake2b (the same in every process), every variable part length-prefixed."""
    ids_parts: dict[tuple[str, ...], bytes] = {}
    pin_parts: dict[tuple[str | None, str | None], bytes] = {}
    out: list[bytes] = []
    for r in requests:
        ids = ids_parts.get(r.asset_ids)
        if ids is None:
            ids = ids_parts[r.asset_ids] = _ids_part(r.asset_ids)
        pin_key = (r.model_name, r.model_version)
        pin = pin_parts.get(pin_key)
        if pin is None:
            pin = pin_parts[pin_key] = _optional(r.model_name) + _optional(r.model_version)
        digest = hashlib.blake2b(ids, digest_size=FINGERPRINT_BYTES)
        digest.update(np.ascontiguousarray(r.prices, dtype="<f8").data)
        if r.current_weights is None:
            digest.update(b"\x00")
        else:
            digest.update(b"\x01")
            digest.update(np.ascontiguousarray(r.current_weights, dtype="<f8").data)
        digest.update(pin)
        out.append(digest.digest())
    return out


def _reused(r: ValidRequest) -> InvalidRequest:
    return InvalidRequest(
        "request_id",
        f"{r.request_id!r} was already used for a request with other inputs (assets, prices, "
        "current weights or model); a retry resends the same",
    )


def check_last(r: ValidRequest, fingerprint: bytes, last: LastAnswer | None) -> bytes | None:
    """The stored answer if ``r`` retries ``last``, else None; ``InvalidRequest`` if reused."""
    if last is None or last.request_id != r.request_id:
        return None
    if last.fingerprint != fingerprint:
        raise _reused(r)
    return last.response


class RecentRequests:
    """The last ``capacity`` request ids decided here: portfolio and fingerprint, no answers."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._lock = threading.Lock()
        self._items: OrderedDict[str, tuple[str, bytes]] = OrderedDict()

    def check(self, r: ValidRequest, fingerprint: bytes) -> None:
        """Raise ``InvalidRequest`` if the id was decided here for something else, or is no
        longer its portfolio's latest (checked after the state)."""
        with self._lock:
            seen = self._items.get(r.request_id)
        if seen is None:
            return
        portfolio_id, seen_fingerprint = seen
        if portfolio_id != r.portfolio_id:
            raise InvalidRequest(
                "request_id", f"{r.request_id!r} was already used for another portfolio"
            )
        if seen_fingerprint != fingerprint:
            raise _reused(r)
        raise InvalidRequest(
            "request_id",
            f"{r.request_id!r} was answered but is no longer the latest request of portfolio "
            f"{r.portfolio_id!r} (a later one was decided, or the portfolio was reset): only "
            "the latest answer is returned again; this one is in the decisions table",
        )

    def put(self, r: ValidRequest, fingerprint: bytes) -> None:
        if not self.capacity:
            return
        with self._lock:
            self._items[r.request_id] = (r.portfolio_id, fingerprint)
            self._items.move_to_end(r.request_id)
            while len(self._items) > self.capacity:
                self._items.popitem(last=False)
