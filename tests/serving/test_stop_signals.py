"""The stop signals that start a drain: kept when they arrive early, never lost or deadlocked."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from allocator.serving.stop_signals import StopSignals


@pytest.fixture
def restore_handlers() -> Iterator[None]:
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


def test_a_signal_before_wait_is_kept_and_wait_returns_it(restore_handlers):
    stop = StopSignals()
    os.kill(os.getpid(), signal.SIGTERM)
    started = time.monotonic()
    assert stop.wait() == signal.SIGTERM
    assert time.monotonic() - started < 1.0
    assert stop.received == [signal.SIGTERM]


def test_wait_blocks_until_a_signal_arrives(restore_handlers):
    stop = StopSignals()
    signal.setitimer(signal.ITIMER_REAL, 0.2)  # SIGALRM's default would kill: relay it
    previous = signal.signal(signal.SIGALRM, lambda *_: os.kill(os.getpid(), signal.SIGINT))
    try:
        started = time.monotonic()
        assert stop.wait() == signal.SIGINT
        assert time.monotonic() - started >= 0.15
    finally:
        signal.signal(signal.SIGALRM, previous)


WAITER = """
import sys
from allocator.serving.stop_signals import StopSignals
stop = StopSignals()
print("ready", flush=True)
sys.exit(0 if stop.wait() else 1)
"""


def test_a_signal_at_the_moment_wait_starts_never_hangs():
    """The single-process server once hung on SIGTERM sent right after it said it was ready
    (an Event set from a handler while ``wait`` held the Event's lock). Sent at that moment,
    many times over, every waiter exits promptly."""
    for _ in range(20):
        proc = subprocess.Popen([sys.executable, "-c", WAITER], stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
