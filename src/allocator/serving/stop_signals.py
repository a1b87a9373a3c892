"""SIGTERM and SIGINT as a request to drain, recorded without taking a lock.

A Python signal handler runs in the main thread between bytecodes, possibly while that thread
holds a lock: a handler that calls ``threading.Event.set`` while the main thread is inside
``Event.wait`` (which holds the Event's non-reentrant lock on its way in and out) can block
forever, and the process never drains. So the handler only appends to a list, and the main
thread polls it. Install before the slow imports and the model load: a signal that arrives
then is kept, and the server drains as soon as it has started instead of dying half-built.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterable

POLL_SECONDS = 0.05
"""How often ``wait`` looks: a drain starts at most this late."""


class StopSignals:
    """The stop signals received so far, in order."""

    def __init__(self, signals: Iterable[int] = (signal.SIGTERM, signal.SIGINT)) -> None:
        self.received: list[int] = []
        for sig in signals:
            signal.signal(sig, self._record)

    def _record(self, signum: int, _frame: object) -> None:
        self.received.append(signum)

    def wait(self, poll: float = POLL_SECONDS) -> int:
        """Block until a stop signal has arrived (at once if one already did); return it."""
        while not self.received:
            time.sleep(poll)
        return self.received[0]
