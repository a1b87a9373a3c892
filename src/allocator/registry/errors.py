"""What goes wrong with registry entries; every message names the offending path."""

from __future__ import annotations

# The manifest's problems are refusal reasons too: re-exported, so every reason is named here.
from allocator.artifacts.manifest import BAD_MANIFEST as BAD_MANIFEST
from allocator.artifacts.manifest import CHECKSUM_MISMATCH as CHECKSUM_MISMATCH
from allocator.artifacts.manifest import MANIFEST_PROBLEMS
from allocator.artifacts.manifest import MISSING_FILE as MISSING_FILE
from allocator.artifacts.manifest import UNSUPPORTED_FORMAT as UNSUPPORTED_FORMAT
from allocator.typed_config import one_of

BAD_GRAPH = "bad_graph"
"""onnxruntime cannot load a graph, or its signature or a probe run does not match the manifest."""
UNREADABLE = "unreadable"
"""A file could not be read (permissions, I/O error)."""
REFUSAL_REASONS = (*MANIFEST_PROBLEMS, BAD_GRAPH, UNREADABLE)
"""Why a version can be refused: a small fixed set, so a metric can be labelled by it."""


class ModelLoadError(ValueError):
    """A model directory that cannot be served; ``reason`` (one of ``REFUSAL_REASONS``) labels
    the refusal metric and ``ListModels``, the message names the offending file."""

    def __init__(self, message: str, reason: str = BAD_GRAPH) -> None:
        super().__init__(message)
        self.reason = one_of("reason", reason, REFUSAL_REASONS)


class ModelNotFoundError(ModelLoadError):
    """The registry has no such model or version."""

    def __init__(self, message: str, reason: str = MISSING_FILE) -> None:
        super().__init__(message, reason)


class PublishError(ValueError):
    """A version that cannot be published: a bad name, or the version exists already."""
