"""What makes a retry the same request, and the request ids a process remembers.

A client that lost an answer (timeout, dropped connection) resends the same request with the
same ``request_id``. Deciding it again would step the portfolio's smoothing a second time and
record a second decision. The answer to a portfolio's latest request therefore travels with its
smoothing state (``PortfolioState.last``), in the same store and under the same lock: a retry is
answered from it on any replica, and after a restart. Memory grows with portfolios, not with
requests.

Only the *latest* answer of a portfolio is kept. A request id that was answered but is no
longer its portfolio's latest cannot be answered again; ``RecentRequests`` (per process,
bounded) remembers the ids it saw lately so such a request, and an id reused for another
portfolio or with other inputs, is refused rather than decided twice. An id older than that
memory, and not the latest of its portfolio, is not recognised: it is decided as a new request
(and the database, unique on the request id, keeps the first row). Clients retry their latest
request with its id, and use a fresh id for every new one.
"""

from __future__ import annotations

import hashlib
import struct
import threading
from collections import OrderedDict

import numpy as np

from allocator.serving.portfolio_state import FINGERPRINT_BYTES, LastAnswer
from allocator.serving.validation import InvalidRequest, ValidRequest

__all__ = ["RecentRequests", "check_last", "request_fingerprint"]


def _optional(value: str | None) -> bytes:
    if value is None:
        return b"\xff\xff\xff\xff"
    data = value.encode()
    return struct.pack("<I", len(data)) + data


def request_fingerprint(r: ValidRequest) -> bytes:
    """A stable digest of a request's inputs (assets, prices, current weights, model pin).

    Not only the id decides a retry: an answer for other assets, returned under a reused id,
    would be applied to the wrong assets. blake2b rather than ``hash()``, which differs from
    process to process, so a replica or a restarted server computes the same digest. Every
    variable-length part is length-prefixed, so no two inputs share an encoding; the asset ids
    are packed in one call (this runs once per decision on the request path).
    """
    ids = [asset.encode() for asset in r.asset_ids]
    n = len(ids)
    parts = [
        struct.pack(f"<I{n}I", n, *map(len, ids)),
        b"".join(ids),
        np.ascontiguousarray(r.prices, dtype="<f8").tobytes(),
    ]
    if r.current_weights is None:
        parts.append(b"\x00")
    else:
        parts.append(b"\x01")
        parts.append(np.ascontiguousarray(r.current_weights, dtype="<f8").tobytes())
    parts.append(_optional(r.model_name))
    parts.append(_optional(r.model_version))
    return hashlib.blake2b(b"".join(parts), digest_size=FINGERPRINT_BYTES).digest()


def _reused(r: ValidRequest) -> InvalidRequest:
    return InvalidRequest(
        "request_id",
        f"{r.request_id!r} was already used for a request with other inputs (assets, prices, "
        "current weights or model); a retry resends the same",
    )


def check_last(r: ValidRequest, fingerprint: bytes, last: LastAnswer | None) -> bytes | None:
    """The serialized answer if ``r`` retries its portfolio's ``last`` request, else None;
    the same id with other inputs raises ``InvalidRequest`` naming ``request_id``."""
    if last is None or last.request_id != r.request_id:
        return None
    if last.fingerprint != fingerprint:
        raise _reused(r)
    return last.response


class RecentRequests:
    """The last ``capacity`` request ids this process decided: portfolio and fingerprint only
    (about 0.3 kB each, no answers), to refuse an id reused for another portfolio, reused with
    other inputs, or retried after a later request of its portfolio replaced its answer."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._lock = threading.Lock()
        self._items: OrderedDict[str, tuple[str, bytes]] = OrderedDict()

    def check(self, r: ValidRequest, fingerprint: bytes) -> None:
        """Raise ``InvalidRequest`` if ``r.request_id`` was decided here for something else,
        or for this request but is no longer its portfolio's latest (checked after the state)."""
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
