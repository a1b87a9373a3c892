"""The server's one event loop, on a thread of its own.

Every call a server process answers runs on this loop (``grpc.aio``): handlers, the decision
batcher, the wait for the recorder's acknowledgements. It runs on its own thread so that the
process's main thread stays free for what must happen there (signals, ``serving.stop_signals``)
and so that tests and the demos can start and stop a server from ordinary synchronous code.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = ["EventLoopThread"]

T = TypeVar("T")


class EventLoopThread:
    """An asyncio loop running on a daemon thread until ``close``."""

    def __init__(self, name: str = "allocator-loop") -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def run(self, coroutine: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run ``coroutine`` on the loop and return its result (from any other thread)."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def close(self) -> None:
        """Stop the loop, cancel what still runs on it, and end the thread."""
        if self.loop.is_closed():
            return
        if self._thread.is_alive():
            self.run(_cancel_others())
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join()
        self.loop.close()


async def _cancel_others() -> None:
    current = asyncio.current_task()
    tasks = [t for t in asyncio.all_tasks() if t is not current]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
