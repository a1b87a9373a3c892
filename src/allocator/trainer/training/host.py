"""The machine a run trained on, recorded in ``run.json``: torch picks CPU kernels by instruction
set, so the same config and seed can end elsewhere on another CPU."""

from __future__ import annotations

import contextlib
import platform
from pathlib import Path

import torch as th

CPUINFO = Path("/proc/cpuinfo")


def cpu_model(cpuinfo: Path = CPUINFO) -> str:
    """The CPU's model name (Linux's ``/proc/cpuinfo``), else what ``platform`` knows."""
    with contextlib.suppress(OSError):
        for line in cpuinfo.read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and value.strip():
                return value.strip()
    return platform.processor() or platform.machine() or "unknown"


def host_info() -> dict[str, str | int]:
    """What decides a CPU run's floating-point path besides the code, the config and the seed."""
    return {
        "cpu": cpu_model(),
        "cpu_capability": th.backends.cpu.get_cpu_capability(),
        "torch": th.__version__,
        "torch_threads": th.get_num_threads(),
    }
