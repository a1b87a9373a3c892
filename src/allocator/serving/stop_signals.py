"""SIGTERM and SIGINT as a request to drain, recorded without taking a lock.

A handler runs in the main thread between bytecodes, maybe while it holds a lock: one calling
``threading.Event.set`` during ``Event.wait`` (the Event's lock is not reentrant) can block
forever. So the handler only appends to a list, and the main thread polls it. Install it before
the slow imports and the model load, so a signal arriving then drains the server once started.
"""

from __future__ import annotations

import signal
import time

POLL_SECONDS = 0.05
"""How often ``wait`` looks: a drain starts at most this late."""


class StopSignals:
    """The stop signals received so far, in order."""

    def __init__(self) -> None:
        self.received: list[int] = []
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._record)

    def _record(self, signum: int, _frame: object) -> None:
        self.received.append(signum)

    def wait(self) -> int:
        """Block until a stop signal has arrived (at once if one already did); return it."""
        while not self.received:
            time.sleep(POLL_SECONDS)
        return self.received[0]
