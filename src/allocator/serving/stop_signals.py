"""SIGTERM and SIGINT as a request to drain, recorded by a handler that takes no lock: one that
sets a ``threading.Event`` can deadlock against the main thread's wait (docs/architecture.md).
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
            signal.signal(sig, lambda signum, _frame: self.received.append(signum))

    def wait(self) -> int:
        """Block until a stop signal has arrived (at once if one already did); return it."""
        while not self.received:
            time.sleep(POLL_SECONDS)
        return self.received[0]
