"""Allocator: reinforcement-learning portfolio allocation, trained honestly and served fast.

The public names (``_LAZY``) load on first use: ``import allocator`` pulls in neither grpc nor
torch, the client's names need grpcio and numpy only, the jobs' need the ``train`` extra.
"""

from __future__ import annotations

import importlib
from importlib.metadata import PackageNotFoundError, version
from typing import Any

try:
    __version__ = version("allocator")
except PackageNotFoundError:  # running from a source tree without an install
    __version__ = "0.0.0"

_LAZY: dict[str, str] = {
    "Allocation": "allocator.serving.client",
    "AllocationRequest": "allocator.serving.client",
    "AllocatorClient": "allocator.serving.client",
    "AllocatorError": "allocator.serving.client",
    "AsyncAllocatorClient": "allocator.serving.aio_client",
    "ConfigError": "allocator.typed_config",
    "RetryPolicy": "allocator.serving.client",
    "TrainConfig": "allocator.trainer.training.config",
    "export_run": "allocator.trainer.export.run",
    "load_config": "allocator.trainer.training.config",
    "run_backtest": "allocator.trainer.sim.backtest",
    "run_suite": "allocator.trainer.jobs.suite.runner",
    "run_walk_forward": "allocator.trainer.jobs.walk_forward.runner",
    "train": "allocator.trainer.training.run",
}
"""Public name -> its defining module, imported on first use. No ``TYPE_CHECKING`` imports:
import-linter counts those, and the root package would then reach torch through the trainer."""

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'allocator' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
