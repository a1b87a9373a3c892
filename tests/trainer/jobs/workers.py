"""Jobs for the executor tests, in a module of their own: a spawned worker imports only this,
not the test module's trainer and tuning imports."""

from __future__ import annotations

import os
import signal
from pathlib import Path


def square(job: int) -> int:
    return job * job


def label(job: object) -> str:
    return f"job {job}"


def die_once(marker: str) -> int:
    """SIGKILL its own worker the first time it runs (``marker`` does not exist yet)."""
    path = Path(marker)
    if not path.exists():
        path.write_text(str(os.getpid()))
        os.kill(os.getpid(), signal.SIGKILL)
    return os.getpid()


def die(marker: str) -> int:
    os.kill(os.getpid(), signal.SIGKILL)
    return 0


def refuse(job: int) -> int:
    raise ValueError(f"job {job} refused")


def fail_once(marker: str) -> str:
    path = Path(marker)
    if not path.exists():
        path.write_text("once")
        raise ValueError("first attempt")
    return "second attempt"
