"""The allocation server: loads exported ONNX models from the registry and serves them.

Torch-free by house rule: only ONNX and JSON are read here, nothing is ever unpickled.
"""

from allocator.serving.loader import (
    LoadedModel,
    ModelLoadError,
    ModelNotFoundError,
    latest_version,
    list_models,
    load_from_registry,
    load_model,
    resolve,
    version_key,
)

__all__ = [
    "LoadedModel",
    "ModelLoadError",
    "ModelNotFoundError",
    "latest_version",
    "list_models",
    "load_from_registry",
    "load_model",
    "resolve",
    "version_key",
]
