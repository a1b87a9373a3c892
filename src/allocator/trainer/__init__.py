"""Offline side of Allocator: data, environment, backtests, agents, training, export and jobs.

Submodules are imported explicitly: importing this package pulls in neither torch nor pandas."""

from __future__ import annotations

import importlib
from types import ModuleType


class MissingExtraError(ImportError):
    """An optional dependency is not installed; the message names the extra that brings it."""


def require_extra(module: str, extra: str, needed_for: str) -> ModuleType:
    """``import module``, or a ``MissingExtraError`` naming the extra: Ray, Optuna, TensorBoard
    and MLflow are extras of their own, imported through this only when used."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingExtraError(
            f"{needed_for} needs {module}, which is not installed: pip install 'allocator[{extra}]'"
        ) from exc
