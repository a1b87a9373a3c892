"""Answers by request id, so a retried request is answered again, not decided twice.

A client that lost an answer (timeout, dropped connection) resends the same request with the
same ``request_id``. Deciding it again would step the portfolio's smoothing a second time; the
cache hands back the first answer instead. A reused id with other inputs (another portfolio,
other assets or prices) is refused: answering it with the cached weights would apply them to
the wrong assets. Per server process, bounded (oldest answers are forgotten first).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

from allocator.serving.proto.v1 import allocator_pb2 as pb
from allocator.serving.validation import InvalidRequest, ValidRequest

__all__ = ["IdempotencyCache", "fingerprint"]


def fingerprint(r: ValidRequest) -> int:
    """What makes a retry the same request: its inputs, not only its id (an answer for other
    assets, returned under a reused id, would be applied to the wrong assets)."""
    current = None if r.current_weights is None else r.current_weights.tobytes()
    return hash((r.asset_ids, r.prices.tobytes(), current, r.model_name, r.model_version))


@dataclass(frozen=True, slots=True)
class _Answered:
    portfolio_id: str
    fingerprint: int
    response: pb.AllocateResponse


class IdempotencyCache:
    """The last ``capacity`` answers by request id (``capacity`` 0: remember nothing)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._lock = threading.Lock()
        self._items: OrderedDict[str, _Answered] = OrderedDict()

    def get(self, r: ValidRequest) -> pb.AllocateResponse | None:
        """The answer already given to this request, or None; a reused id with other inputs
        raises ``InvalidRequest`` naming ``request_id``."""
        if not self.capacity:
            return None
        with self._lock:
            hit = self._items.get(r.request_id)
        if hit is None:
            return None
        if hit.portfolio_id != r.portfolio_id:
            raise InvalidRequest(
                "request_id", f"{r.request_id!r} was already used for another portfolio"
            )
        if hit.fingerprint != fingerprint(r):
            raise InvalidRequest(
                "request_id",
                f"{r.request_id!r} was already used for a request with other "
                "inputs (assets, prices, current weights or model); a retry resends the same",
            )
        return hit.response

    def put(self, r: ValidRequest, response: pb.AllocateResponse) -> None:
        if not self.capacity:
            return
        with self._lock:
            self._items[r.request_id] = _Answered(r.portfolio_id, fingerprint(r), response)
            while len(self._items) > self.capacity:
                self._items.popitem(last=False)
