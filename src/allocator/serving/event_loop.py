"""The server's one event loop (``grpc.aio``), on a thread of its own, so the main thread stays
free for signals and tests and demos can drive a server from synchronous code. uvloop by
default: grpc.aio hands every completion to the loop, and libuv's loop runs those callbacks,
futures and thread hand-offs for less Python than asyncio's.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, Literal, TypeVar

__all__ = ["EventLoopThread"]

T = TypeVar("T")

LoopKind = Literal["uvloop", "asyncio"]


def new_event_loop(kind: LoopKind) -> asyncio.AbstractEventLoop:
    """A new loop of ``kind``; uvloop missing (Windows has no wheels) is a clear error."""
    if kind == "asyncio":
        return asyncio.new_event_loop()
    try:
        import uvloop  # only when chosen: the asyncio loop needs nothing installed
    except ImportError as exc:
        raise RuntimeError(
            "event_loop: uvloop is not installed (pip install uvloop, or set event_loop: asyncio)"
        ) from exc
    return uvloop.new_event_loop()


class EventLoopThread:
    """An event loop of ``kind`` running on a daemon thread until ``close``."""

    def __init__(self, kind: LoopKind = "uvloop") -> None:
        self.loop = new_event_loop(kind)
        self._thread = threading.Thread(target=self._serve, name="allocator-loop", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run ``coroutine`` on the loop from any other thread; its result."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result()

    def close(self) -> None:
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
