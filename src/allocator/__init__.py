"""Allocator: reinforcement-learning portfolio allocation, trained honestly and served fast.

The public entry points are importable from here, each loaded on first use, so
``import allocator`` stays instant and pulls in neither grpc nor torch, and a serving install
without the training extras can still ``from allocator import AllocatorClient``:

- asking a server: ``AllocatorClient``, ``AsyncAllocatorClient``, ``Allocation``,
  ``AllocationRequest``, ``AllocatorError``, ``RetryPolicy`` (grpcio and numpy only);
- settings: ``ConfigError``, ``TrainConfig``, ``load_config``;
- the offline jobs (the ``train`` extra: torch, pandas): ``train``, ``export_run``,
  ``run_backtest``, ``run_walk_forward``, ``run_suite``.
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
"""Public name -> the module that defines it, imported when the name is first asked for.

No ``if TYPE_CHECKING`` imports of them: the import-linter contracts count those, and the
root package would then reach torch through the trainer."""

__all__ = [
    "Allocation",
    "AllocationRequest",
    "AllocatorClient",
    "AllocatorError",
    "AsyncAllocatorClient",
    "ConfigError",
    "RetryPolicy",
    "TrainConfig",
    "__version__",
    "export_run",
    "load_config",
    "run_backtest",
    "run_suite",
    "run_walk_forward",
    "train",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'allocator' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
