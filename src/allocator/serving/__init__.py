"""The allocation server: loads exported ONNX models from the registry and serves them.

Torch-free by house rule: only ONNX and JSON are read, nothing is unpickled. Names load lazily,
so the gRPC client works without onnxruntime and ``allocator --help`` stays fast.
"""

from __future__ import annotations

import importlib
from typing import Any

_LOADER_NAMES = ("LoadedModel", "load_model")

__all__ = list(_LOADER_NAMES)


def __getattr__(name: str) -> Any:
    if name in _LOADER_NAMES:
        return getattr(importlib.import_module("allocator.serving.loader"), name)
    raise AttributeError(f"module 'allocator.serving' has no attribute {name!r}")
