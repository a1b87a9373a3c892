"""What goes wrong with registry entries; every message names the offending path."""

from __future__ import annotations

__all__ = ["ModelLoadError", "ModelNotFoundError", "PublishError"]


class ModelLoadError(ValueError):
    """A model directory that cannot be served; the message names the offending file."""


class ModelNotFoundError(ModelLoadError):
    """The registry has no such model or version; the message names what was asked."""


class PublishError(ValueError):
    """A version that cannot be published: a bad name, or the version exists already."""
