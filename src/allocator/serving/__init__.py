"""The allocation server: loads exported ONNX models from the registry and serves them.

Torch-free by house rule: only ONNX and JSON are read here, nothing is ever unpickled.
Which directories are versions, and their errors, live in ``allocator.registry``.
Names are imported lazily, so the gRPC client (``allocator.serving.client``) works without
onnxruntime installed and ``allocator --help`` stays fast.
"""

from __future__ import annotations

import importlib
from typing import Any

_LOADER_NAMES = ("LoadedModel", "load_from_registry", "load_model")

__all__ = list(_LOADER_NAMES)


def __getattr__(name: str) -> Any:
    if name in _LOADER_NAMES:
        return getattr(importlib.import_module("allocator.serving.loader"), name)
    raise AttributeError(f"module 'allocator.serving' has no attribute {name!r}")
