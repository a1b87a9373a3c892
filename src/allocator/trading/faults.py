"""A fault hook for crash tests: ``ALLOCATOR_TRADING_KILL_AT=POINT[:N]`` SIGKILLs the process
the ``N``-th time (default: first) it reaches ``POINT`` of the cycle."""

from __future__ import annotations

import os
import signal

KILL_AT_ENV = "ALLOCATOR_TRADING_KILL_AT"
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
