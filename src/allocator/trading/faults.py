"""A fault hook for crash tests: ``ALLOCATOR_TRADING_KILL_AT=POINT[:N]`` SIGKILLs the process
the ``N``-th time (default: first) it reaches ``POINT`` of the cycle."""

from __future__ import annotations

import os
import signal

KILL_AT_ENV = "ALLOCATOR_TRADING_KILL_AT"
POINTS = (
    "reconciled",  # the broker and the book agree, nothing of this bar recorded yet
    "asked",  # the server answered, nothing of this bar recorded yet
    "planned",  # the cycle and its orders are committed, none sent
    "submitted",  # the broker filled an order, the book has not recorded it
    "settled",  # an order's answer and fills are committed
    "finishing",  # the NAV row is added, not committed
    "finished",  # the cycle is committed done
)
"""The points a cycle passes, in order (``submitted`` and ``settled`` once per order)."""

_reached: dict[str, int] = {}


def checkpoint(point: str) -> None:
    """Die here (SIGKILL, no cleanup) when the environment names this point and count."""
    spec = os.environ.get(KILL_AT_ENV)
    if not spec:
        return
    name, _, nth = spec.partition(":")
    if name != point:
        return
    _reached[point] = _reached.get(point, 0) + 1
    if _reached[point] == int(nth or 1):
        os.kill(os.getpid(), signal.SIGKILL)
